"""train.compile: a one-device run compiles its steps with XLA on plain variables, and gives the
DTensor path's numbers and checkpoints (a run moves between the two, and onto a bigger mesh, by
its checkpoint). Speed is bench/nanogpt.py's business, not a test's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import test_fsdp
from conftest import ROOT, dtcli, write_corpus

from dtcli import tfruntime
from dtcli.errors import UsageError
from dtcli.mesh import compiles_with_xla, step_compiler

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


@pytest.mark.parametrize(
    "setting, want", [("auto", "graph"), ("xla", "xla"), ("graph", "graph"), ("dtensor", "dtensor")]
)
def test_bf16_on_a_cpu_that_takes_bf16_runs_tensorflows_kernels_unless_xla_is_asked(setting, want):
    # XLA:CPU converts bf16 dots to float32; oneDNN runs them on AMX (mesh.step_compiler).
    assert step_compiler(setting, {"batch": 1}, 1, bf16_cpu=True) == want
    assert compiles_with_xla(setting, {"batch": 1}, 1, bf16_cpu=True) is (want == "xla")


@pytest.mark.parametrize(
    "setting, axes, want",
    [
        ("graph", {"batch": 1}, "graph"),
        ("auto", {"batch": 1}, "xla"),
        ("auto", {"batch": 2}, "dtensor"),
    ],
)
def test_graph_runs_plain_variables_on_one_device(setting, axes, want):
    assert step_compiler(setting, axes) == want


@pytest.mark.parametrize("setting", ["xla", "graph"])
def test_plain_compilers_on_a_bigger_mesh_are_refused_naming_the_key(setting):
    with pytest.raises(UsageError, match=r"'train.compile'.*batch=4,model=2.*auto or dtensor"):
        step_compiler(setting, {"batch": 4, "model": 2})


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
    """Each model 12 steps on one device, compiled by XLA, run on TensorFlow's own kernels
    (graph: plain variables, fused Adam) and by DTensor, from the same initial weights and
    batches."""
    from dtcli import models
    from dtcli import session as T

    out = {}
    for name, (recipe, sets) in MODELS.items():
        for compile_ in ("xla", "graph", "dtensor"):
            s = session_of(recipe, sets(text_file_xla), compile_)
            start = models.host_weights(s.model, s.mesh)
            losses = T.run_steps(s, 12)
            out[name, compile_] = (losses, start, test_fsdp.host_state(s), s)
    return out


@pytest.fixture(scope="module")
def text_file_xla(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("text") / "corpus.txt", 20_000)


@pytest.mark.parametrize("compiler", ["xla", "graph"])
@pytest.mark.parametrize("name", list(MODELS))
def test_plain_variables_give_the_dtensor_numbers(xla_and_dtensor, name, compiler):
    xla_losses, xla_start, xla_state, xla = xla_and_dtensor[name, compiler]
    dt_losses, dt_start, dt_state, dt = xla_and_dtensor[name, "dtensor"]
    assert xla.xla is (compiler == "xla") and xla.compiler == compiler and not dt.xla
    assert xla.mesh is None and dt.mesh is not None
    # graph: Adam as TensorFlow's fused kernels (optimizers.fused_adam_update), on both APIs
    assert xla.optimizer.fused is (compiler == "graph")
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
    diff = {
        k: float(
            np.max(np.abs(xla_state[k] - dt_state[k])) / max(np.max(np.abs(dt_state[k])), 1e-12)
        )
        for k in dt_state
        if k != "iterations"
    }
    print(
        f"{name} {compiler}: worst relative difference of a weight or slot {max(diff.values()):.1e}"
    )
    # ResourceApplyAdam computes 1 - beta_2 in float32 (1 - float32(0.999) = 0.0009999871), so
    # graph's second moments are 1.3e-5 off for the MLPs' 0.999 (tiny_gpt's 0.99: 9e-7); the
    # MLP's weights end up to 3.6e-5 (of their largest value) off after 12 steps of lr 0.01
    bound = 5e-5 if compiler == "graph" else 1e-5
    for k, worst in diff.items():
        assert worst <= bound, k


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


# XLA's persistent compilation cache (tfruntime): a one-device run's compiled steps on disk.


def test_the_xla_cache_lives_in_dtclis_cache_folder_one_folder_per_host(tmp_path):
    home = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folder = tfruntime.xla_cache_dir(home)
    assert folder.parent == tmp_path / "xdg" / "dtcli" / "xla"
    root = {**home, "DTCLI_CACHE_DIR": str(tmp_path / "root")}
    assert tfruntime.xla_cache_dir(root).parent == tmp_path / "root" / "xla"
    named = {**root, "DTCLI_XLA_CACHE": str(tmp_path / "mine")}
    assert tfruntime.xla_cache_dir(named).parent == tmp_path / "mine"
    for off in ("off", "OFF", "0"):
        assert tfruntime.xla_cache_dir({**named, "DTCLI_XLA_CACHE": off}) is None
    # The machine code depends on XLA_FLAGS (and the CPU, TensorFlow): not in TensorFlow's key.
    flagged = tfruntime.xla_cache_dir({**home, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    assert flagged != folder and flagged.parent == folder.parent
    assert tfruntime.xla_cache_dir(home) == folder


def test_a_process_pinned_to_fewer_cores_keeps_its_own_xla_cache(tmp_path, monkeypatch):
    # XLA:CPU splits loops by the cores it may use when it compiles: a run under `taskset -c 0`
    # must not load steps compiled for every core.
    home = {"XDG_CACHE_HOME": str(tmp_path)}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    two = tfruntime.xla_cache_dir(home)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1}, raising=False)
    assert tfruntime.xla_cache_dir(home) != two
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert tfruntime.xla_cache_dir(home) == two


def test_the_xla_cache_flags_keep_a_users_own():
    ours = tfruntime.xla_cache_flags("--tf_xla_auto_jit=2", Path("/c/x"))
    assert ours.split() == [
        "--tf_xla_auto_jit=2",
        "--tf_xla_persistent_cache_directory=/c/x",
        "--tf_xla_persistent_cache_device_types=CPU",
    ]
    theirs = "--tf_xla_persistent_cache_directory=/mine"
    assert tfruntime.xla_cache_flags(theirs, Path("/c/x")) == theirs


def test_the_xla_cache_drops_its_oldest_entries_past_its_limit(tmp_path):
    def entry(name: str, size: int, age: float) -> Path:
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        os.utime(path, (NOW - age, NOW - age))
        return path

    (tmp_path / "tf2.20.0-0123456789abcdef").mkdir()  # another host folder: an older TF's
    old = entry("tf2.20.0-0123456789abcdef/xla_compile_cache__1__XLA_CPU_JIT.pb", 400, age=300)
    middle = entry("xla_compile_cache__2__XLA_CPU_JIT.pb", 400, age=200)
    new = entry("xla_compile_cache__3__XLA_CPU_JIT.pb", 400, age=100)
    dead = entry("xla_compile_cache__4__XLA_CPU_JIT.pb.123_456.tmp", 10, age=7200)
    writing = entry("xla_compile_cache__5__XLA_CPU_JIT.pb.789_1.tmp", 10, age=5)

    removed = tfruntime.prune_xla_cache(tmp_path, limit=900, now=NOW)

    assert set(removed) == {old, dead}
    left = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted([middle, new, writing])
    assert tfruntime.prune_xla_cache(tmp_path, limit=900, now=NOW) == []


NOW = 1_800_000_000.0


def test_only_an_entry_tensorflow_could_not_read_is_dropped(tmp_path):
    environ = {"DTCLI_XLA_CACHE": str(tmp_path)}
    folder = tfruntime.open_xla_cache(environ)
    names = [f"xla_compile_cache__{i}__XLA_CPU_JIT.pb" for i in (1, 2, 3)]
    for name in names:
        (folder / name).write_bytes(b"entry")
    damaged = f"Can't parse {folder / names[1]} as binary proto [Op:__inference_train_call_7]"
    assert tfruntime.drop_unreadable_xla_cache(damaged, environ)
    assert sorted(p.name for p in folder.iterdir()) == [names[0], names[2]]
    # Not the cache's failure: nothing goes.
    other = "Read past the end of the data set [Op:__inference_train_call_7]"
    assert not tfruntime.drop_unreadable_xla_cache(other, environ)
    assert not tfruntime.drop_unreadable_xla_cache(damaged, {"DTCLI_XLA_CACHE": "off"})
    assert len(list(folder.iterdir())) == 2
    # A short read names no file: every entry goes.
    short = "Read less bytes than requested [Op:__inference_train_call_7]"
    assert tfruntime.drop_unreadable_xla_cache(short, environ)
    assert list(folder.iterdir()) == []
    assert not tfruntime.drop_unreadable_xla_cache(short, environ)


def test_a_cache_folder_the_user_named_that_cannot_be_made_is_one_usage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for key in ("DTCLI_XLA_CACHE", "DTCLI_CACHE_DIR"):
        with pytest.raises(UsageError, match=rf"environment {key}=.*{blocker} is not a folder"):
            tfruntime.open_xla_cache({key: str(blocker / "sub")})
    with pytest.raises(UsageError, match="cannot hold a path with a space"):
        tfruntime.open_xla_cache({"DTCLI_XLA_CACHE": str(tmp_path / "a b")})
    # The default folder unusable: the run goes on without a cache.
    assert tfruntime.open_xla_cache({"XDG_CACHE_HOME": str(blocker)}) is None
    # Whether a folder can be used is known before anything is made (set_runtime_env).
    assert tfruntime.xla_cache_problem(tmp_path / "ok" / "deep") is None
    assert not (tmp_path / "ok").exists()
    made = tfruntime.open_xla_cache({"DTCLI_XLA_CACHE": str(tmp_path / "ok")})
    assert made.is_dir() and made.parent == tmp_path / "ok"


def train_on_one_device(out: Path, cache: Path):
    """The quick start for one epoch on one device (its steps compiled by XLA), in a fresh
    process whose XLA cache is `cache`."""
    return dtcli(
        "train",
        ROOT / "recipes" / "quickstart.yaml",
        "--mesh",
        "batch=1",
        "--devices",
        "cpu:1",
        "--set",
        "train.epochs=1",
        "--out",
        out,
        "--no-progress",  # piped, 4.5 s of setup would say so in a line (progress.Heartbeat)
        extra_env={"DTCLI_XLA_CACHE": str(cache)},
    )


@pytest.mark.slow
def test_a_second_run_loads_its_compiled_steps_from_the_xla_cache(tmp_path):
    """Fresh processes train the same one-device steps: the first writes XLA's compiled train
    and eval steps to the cache, the second loads them (no entry is written again), a third
    finds them damaged and compiles anew; all train the same numbers."""
    cache = tmp_path / "xla"

    def train(name: str) -> list[dict]:
        result = train_on_one_device(tmp_path / name, cache)
        assert result.returncode == 0, result.stderr
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def entries(folder: Path) -> dict:
        return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}

    first = train("first")
    (folder,) = cache.iterdir()
    written = entries(folder)
    assert len(written) == 2  # the train call and the eval step
    second = train("second")
    assert entries(folder) == written
    # Damaged entries: the train call's cut short (read first: TensorFlow's error names no
    # file, so every entry goes), the eval step's with flipped bytes. Compiled anew.
    flipped, cut = sorted(folder.iterdir(), key=lambda p: p.stat().st_size)
    cut.write_bytes(cut.read_bytes()[:1000])
    data = bytearray(flipped.read_bytes())
    data[50::7] = bytes(b ^ 0x5A for b in data[50::7])
    flipped.write_bytes(bytes(data))
    third = train("third")
    assert not cut.exists() and not flipped.exists() and len(entries(folder)) == 2
    for key in ("train_loss", "eval_loss", "eval_accuracy"):
        assert [r[key] for r in second] == [r[key] for r in first], key
        assert [r[key] for r in third] == [r[key] for r in first], key


def test_a_cache_folder_that_cannot_be_made_exits_2_naming_it(tmp_path):
    # A fresh process: the cache folder is decided once, when dtcli is first imported.
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    run = tmp_path / "run"
    result = train_on_one_device(run, blocker / "sub")
    assert result.returncode == 2
    assert len(result.err_lines) == 1 and "environment DTCLI_XLA_CACHE=" in result.err_lines[0]
    assert not run.exists()


def test_the_run_header_says_how_a_one_device_runs_steps_run(monkeypatch):
    from types import SimpleNamespace

    from dtcli import cpuinfo
    from dtcli import recipe as R
    from dtcli.session.build import bf16_cpu
    from dtcli.train.console import steps_note

    def session(kind: str = "CPU", axes: dict | None = None, compile_: str = "auto"):
        """A session as prepare makes it: its compiler by the same decision (mesh.step_compiler)."""
        sets = ["train.precision=bf16", f"train.compile={compile_}"]
        recipe = R.load(ROOT / "recipes" / "tiny_gpt.yaml", sets)
        axes = axes or {"batch": 1}
        compiler = step_compiler(compile_, axes, 1, bf16_cpu(recipe, kind))
        devices = SimpleNamespace(clients=1, device_type=kind)
        return SimpleNamespace(
            xla=compiler == "xla",
            compiler=compiler,
            recipe=recipe,
            axes=axes,
            devices=devices,
            choice=None,
            probe_seconds=0.0,
        )

    monkeypatch.setattr(cpuinfo, "runs_bf16", lambda: True)
    assert steps_note(session(compile_="xla")) == " (steps compiled by XLA)"
    assert "oneDNN" in steps_note(session())
    assert steps_note(session("GPU")) == " (steps compiled by XLA)"  # a GPU's bf16: XLA's
    assert steps_note(session("GPU", compile_="dtensor")) == ""  # dtensor asked: nothing to say
    assert steps_note(session(axes={"batch": 2})) == ""
    monkeypatch.setattr(cpuinfo, "runs_bf16", lambda: False)
    assert steps_note(session(compile_="dtensor")) == ""  # train.compile=dtensor on an AVX2 CPU
    assert steps_note(session()) == " (steps compiled by XLA)"  # bf16 through XLA there
    assert steps_note(session(compile_="graph")) == " (steps on TensorFlow's own kernels, no XLA)"
    measured = session()  # auto's measured choice says both figures and that it is kept
    measured.choice = {"compiler": "xla", "xla_ms": 10.5, "graph_ms": 12.0, "measured": "then"}
    assert steps_note(measured) == (
        " (steps compiled by XLA: 10.5 ms a step against 12.0 without XLA here, measured then,"
        " kept for this CPU and shape)"
    )


def test_auto_measures_xla_against_graph_once_and_keeps_the_choice(
    cpu8, text_file_xla, tmp_path, monkeypatch
):
    """`auto` on one CPU device times both plain paths on the run's own step (session/choice.py),
    takes the faster, keeps it for this CPU and shape, and leaves the weights, slots and step
    count as a fresh session's; a later session of that shape reads the kept choice."""
    import json

    from dtcli.session import choice

    monkeypatch.setenv("DTCLI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(choice, "PROBE_FLOPS", 0.0)  # the tiny GPT is measured too
    sets = [f"data.path={text_file_xla}", *TINY]
    probed = session_of("tiny_gpt.yaml", sets, "auto")
    kept = choice.read_choices()
    ((key, entry),) = kept.items()
    assert entry["xla_ms"] > 0 and entry["graph_ms"] > 0
    # graph only where it beats XLA by the margin (closer is a tie, and XLA stays)
    faster = entry["graph_ms"] < (1 - choice.GRAPH_MARGIN) * entry["xla_ms"]
    assert entry["compiler"] == ("graph" if faster else "xla")
    assert probed.compiler == entry["compiler"] and probed.choice == entry
    assert probed.probe_seconds > 0 and probed.optimizer.fused is (entry["compiler"] == "graph")

    fresh = test_fsdp.host_state(session_of("tiny_gpt.yaml", sets, "xla"))
    after = test_fsdp.host_state(probed)
    assert after.keys() == fresh.keys() and after["iterations"] == 0
    for name in fresh:
        np.testing.assert_array_equal(after[name], fresh[name], err_msg=name)

    other = "xla" if entry["compiler"] == "graph" else "graph"
    choice.choices_path().write_text(json.dumps({key: {**entry, "compiler": other}}))
    again = session_of("tiny_gpt.yaml", sets, "auto")
    assert again.compiler == other and again.probe_seconds == 0
    assert again.optimizer.fused is (other == "graph")
    # another shape has no kept choice, and eval-only sessions never measure
    from dtcli import recipe as R
    from dtcli import session as T

    wider = R.load(
        ROOT / "recipes" / "tiny_gpt.yaml",
        R.Overrides((*sets, "data.batch_size=4"), mesh="batch=1", devices="cpu:8"),
    )
    unmeasured = T.prepare(wider, splits=("eval",), use_devices=1, command="eval")
    assert unmeasured.compiler == "xla" and unmeasured.choice is None
