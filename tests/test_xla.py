"""train.compile: a one-device run compiles its steps with XLA on plain variables, and gives the
DTensor path's numbers and checkpoints (a run moves between the two, and onto a bigger mesh, by
its checkpoint). Speed is bench/nanogpt.py's business, not a test's."""

from __future__ import annotations

import numpy as np
import pytest
import test_fsdp
from conftest import ROOT

from dtcli.errors import UsageError
from dtcli.mesh import compiles_with_xla

TINY = test_fsdp.TINY


@pytest.mark.parametrize(
    "setting, axes, clients, want",
    [
        ("auto", {"batch": 1}, 1, True),
        ("auto", {"batch": 1, "model": 1}, 1, True),
        ("auto", {"batch": 2}, 1, False),
        ("auto", {"batch": 1}, 2, False),  # one device in each of two clients
        ("dtensor", {"batch": 1}, 1, False),
        ("xla", {"batch": 1}, 1, True),
    ],
)
def test_xla_compiles_only_a_mesh_of_one_device_in_one_process(setting, axes, clients, want):
    assert compiles_with_xla(setting, axes, clients) is want


def test_xla_on_a_bigger_mesh_is_refused_naming_the_key():
    with pytest.raises(UsageError, match=r"'train.compile'.*batch=4,model=2.*auto or dtensor"):
        compiles_with_xla("xla", {"batch": 4, "model": 2})


def session_of(recipe_name: str, sets: list[str], compile_: str, mesh: str = "batch=1"):
    from dtcli import recipe as R
    from dtcli import session as T

    recipe = R.load(
        ROOT / "recipes" / recipe_name,
        R.Overrides((*sets, f"train.compile={compile_}"), mesh=mesh, devices="cpu:8"),
    )
    return T.prepare(recipe, use_devices=1 if mesh == "batch=1" else None)


def gpt(text_file) -> list[str]:
    return [f"data.path={text_file}", *TINY, "train.accumulate=2"]


ADAM = ["optimizer.name=adam", "optimizer.learning_rate=0.01", "optimizer.momentum=0.0"]
MODELS = {
    # dtcli's GPT (embeddings, LayerNorm, attention, tied head), with AdamW, clipping, a
    # cosine schedule and gradient accumulation (nested loops)
    "gpt": ("tiny_gpt.yaml", gpt),
    # tf-keras layers (the quick start's layer list) with Adam, on the embedded digits
    "keras_mlp": ("quickstart.yaml", lambda _: ADAM),
    # the Core-API MLP and its own Adam
    "core_mlp": (
        "quickstart.yaml",
        lambda _: [*ADAM, "model.api=core", "model.layers=null", "model.hidden=[128]"],
    ),
}


@pytest.fixture(scope="module")
def xla_and_dtensor(cpu8, text_file_xla):
    """Each model 12 steps on one device, compiled by XLA and by DTensor, from the same
    initial weights and batches."""
    from dtcli import models
    from dtcli import session as T

    out = {}
    for name, (recipe, sets) in MODELS.items():
        for compile_ in ("xla", "dtensor"):
            s = session_of(recipe, sets(text_file_xla), compile_)
            start = models.host_weights(s.model, s.mesh)
            losses = T.run_steps(s, 12)
            out[name, compile_] = (losses, start, test_fsdp.host_state(s), s)
    return out


@pytest.fixture(scope="module")
def text_file_xla(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_bytes((ROOT / "README.md").read_bytes()[:20_000])
    return path


@pytest.mark.parametrize("name", list(MODELS))
def test_xla_gives_the_dtensor_numbers(xla_and_dtensor, name):
    xla_losses, xla_start, xla_state, xla = xla_and_dtensor[name, "xla"]
    dt_losses, dt_start, dt_state, dt = xla_and_dtensor[name, "dtensor"]
    assert xla.xla and xla.mesh is None and not dt.xla
    # really plain variables: nothing of it lives on a DTensor mesh
    assert all(not hasattr(v, "layout") for v in xla.model.variables.values())
    for path in xla_start:
        np.testing.assert_array_equal(xla_start[path], dt_start[path], err_msg=path)
    # XLA fuses and reassociates float32 sums: the same math, not the same bits; the bounds
    # of tests/test_mesh_invariance.py (losses 1e-5 relative, weights 1e-5 of each weight's
    # largest value), there between meshes, here between compilers
    np.testing.assert_allclose(xla_losses, dt_losses, rtol=1e-5)
    assert xla_losses[-1] < xla_losses[0]  # it learned
    assert xla_state["iterations"] == dt_state["iterations"] == 12
    worst = max(
        float(np.max(np.abs(xla_state[k] - dt_state[k])) / max(np.max(np.abs(dt_state[k])), 1e-12))
        for k in dt_state
        if k != "iterations"
    )
    print(f"{name}: worst relative difference of a weight or slot {worst:.1e}")
    assert worst <= 1e-5


@pytest.mark.parametrize("source, target", [("xla", "batch=4,model=2"), ("batch=8", "xla")])
def test_checkpoints_cross_between_xla_and_a_mesh(cpu8, text_file_xla, tmp_path, source, target):
    """A checkpoint written by an XLA run restores onto a tensor-parallel mesh, and one written
    on a 4-device mesh restores into an XLA run: every weight, Adam slot and the step count."""
    import tensorflow as tf

    from dtcli import session as T

    tp = [f"layouts.rules={test_fsdp.json.dumps(test_fsdp.TP_RULES)}"]

    sets = [f"data.path={text_file_xla}", *TINY]

    def make(where: str):
        if where == "xla":
            return session_of("tiny_gpt.yaml", sets, "auto")
        return session_of("tiny_gpt.yaml", sets + tp, "auto", mesh=where)

    trained = make(source)
    T.run_steps(trained, 10)
    tf.train.Checkpoint(**trained.checkpoint_objects()).write(str(tmp_path / "ckpt"))
    fresh = make(target)
    assert fresh.xla == (target == "xla") and trained.xla == (source == "xla")
    tf.train.Checkpoint(**fresh.checkpoint_objects()).read(str(tmp_path / "ckpt")).assert_consumed()
    want, got = test_fsdp.host_state(trained), test_fsdp.host_state(fresh)
    assert want["iterations"] == got["iterations"] == 10
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_train_compile_xla_on_a_mesh_exits_2_with_one_line(cli, tmp_path):
    result = cli(
        "train",
        ROOT / "recipes" / "quickstart.yaml",
        "--mesh",
        "batch=8",
        "--devices",
        "cpu:8",
        "--set",
        "train.compile=xla",
        "--out",
        tmp_path / "run",
    )
    assert result.returncode == 2
    assert len(result.err_lines) == 1 and "'train.compile'" in result.err_lines[0]
    assert not (tmp_path / "run").exists()
