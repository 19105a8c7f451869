"""model.from_run: a recipe that starts from a dtcli run's checkpoint. Its model, task and
tokenizer come from the checkpoint's recipe; its step-0 weights are the checkpoint's, bit for
bit, on another mesh (Megatron rules on batch=2,model=2) and on one device compiled with XLA,
where its eval loss is the base run's last; an imported model's run is a base too, and the new
run resumes from its own checkpoints once the base is gone."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil

import hf_models
import numpy as np
import pytest
import yaml
from conftest import RECIPES, checkpoint_tensors, run_cli, write_corpus

from dtcli import rundir
from dtcli.recipe import Overrides, read_raw

# Checked: step-0 weights equal to the checkpoint's, and recipes; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

GPT = RECIPES / "tiny_gpt.yaml"
TINY = {"layers": 1, "d_model": 32, "heads": 4, "mlp_ratio": 2, "context": 16}
TP_RULES = read_raw(RECIPES / "tiny_gpt_tensor_parallel.yaml")["layouts"]["rules"]
CPU8 = ("--devices", "cpu:8")  # the session's devices: an in-process command uses them all


def sets(*assignments: str) -> list[str]:
    return [a for s in assignments for a in ("--set", s)]


@pytest.fixture(scope="module")
def base(tmp_path_factory, cpu8):
    """Run A: a tiny GPT with a byte-pair tokenizer of its own, 4 AdamW steps data parallel on
    the session's 8 virtual CPUs; and a recipe b.yaml that starts from it, on the same text."""
    tmp = tmp_path_factory.mktemp("from_run")
    corpus = write_corpus(tmp / "corpus.txt", 20_000)
    run = tmp / "A"
    result = run_cli(
        "train", GPT, "--out", run, "--mesh", "batch=8", *CPU8, "--no-progress",
        *sets(
            f"model.transformer={json.dumps(TINY)}", f"data.path={corpus}",
            "data.tokenizer=bpe:300", "data.batch_size=8", "train.steps=4",
            "train.checkpoint_every=1", "optimizer.warmup_steps=1",
        ),
    )  # fmt: skip
    assert result.code == 0, result.err
    recipe = {
        "model": {"from_run": str(run)},
        "data": {"source": "text", "path": str(corpus), "batch_size": 8, "eval_batch_size": 64},
        "optimizer": {"name": "sgd", "learning_rate": 1e-30},
        "train": {"steps": 1},
    }
    (tmp / "b.yaml").write_text(yaml.safe_dump(recipe))
    return run, tmp / "b.yaml"


MESHES = [
    ("batch=2,model=2", 4, (f"layouts.rules={json.dumps(TP_RULES)}",)),
    ("batch=1", 1, ()),
]


@pytest.mark.parametrize("mesh, use, rules", MESHES, ids=[m[0] for m in MESHES])
def test_step_0_is_the_base_checkpoint_on_any_mesh(base, tmp_path, mesh, use, rules):
    """The recipe resolved as train resolves it, the model built on `mesh` (Megatron rules: the
    weights A held whole are split; one device: XLA's plain variables), the weights read as
    train reads them: every tensor is A's checkpoint's, bit for bit, and the eval loss A's last
    (1e-6)."""
    import tensorflow as tf

    from dtcli import metrics
    from dtcli import session as session_lib
    from dtcli import steps as steps_lib
    from dtcli.rundir import base as base_lib

    run, recipe_file = base
    recipe = rundir.command_recipe(recipe_file, None, None, Overrides(rules, mesh, "cpu:8"))
    ckpt = rundir.complete_checkpoints(run)[-1]
    assert recipe.model.from_run == str(ckpt.resolve())
    assert recipe.task == "language_model"
    assert recipe.data.tokenizer == str((run / "tokenizer.json").resolve())
    stored = read_raw(run / "recipe.yaml")["model"]["transformer"]
    assert recipe_as_dict(recipe.model.transformer) == {**stored, "max_positions": 16}
    session = session_lib.prepare(recipe, splits=("eval",), use_devices=use, command="eval")
    assert session.xla is (use == 1)
    digests = base_lib.restore_weights(
        session.model.module, session.model.weights, recipe.model.from_run
    )
    # what a LoRA checkpoint names its base by: the same whichever path names the checkpoint
    files = sorted(p.name for p in ckpt.iterdir() if p.name != "meta.json")
    assert digests == base_lib.base_digests(str(run)) == {f: sha256(ckpt / f) for f in files}
    tf.train.Checkpoint(model=session.model.module).write(str(tmp_path / "w" / "ckpt"))
    got, want = checkpoint_tensors(tmp_path / "w"), checkpoint_tensors(ckpt)
    assert got.keys() == want.keys() and len(want) == 11
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    _, eval_step = steps_lib.make_steps(session)
    loss = session_lib.evaluate(session, eval_step, session.eval_feed)["loss"]
    last = metrics.read(run / "metrics.jsonl")[-1]["eval_loss"]
    assert abs(loss - last) <= 1e-6 * abs(last), (loss, last)


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recipe_as_dict(config) -> dict:
    """A recipe section (a dataclass of recipe/, not a whole Recipe) as plain YAML-ready data."""
    from dtcli.recipe import plain

    return json.loads(json.dumps(plain(dataclasses.asdict(config))))


def test_a_recipe_keeps_only_context_dropout_and_remat_of_the_model(base, cli, tmp_path):
    """`dtcli config` shows the recipe filled in; a context past the base's 16 positions, another
    head count and another tokenizer are refused in one line, naming both."""
    run, recipe_file = base
    result = cli("config", recipe_file, *sets("model.transformer={context: 8, dropout: 0.1}"))
    assert result.code == 0, result.err
    shown = yaml.safe_load(result.out)
    assert shown["model"]["transformer"]["layers"] == 1
    assert (shown["model"]["transformer"]["context"], shown["data"]["context"]) == (8, 8)
    refused = {
        "model.transformer={context: 17}": "recipe key 'model.transformer.context': 17 is longer "
        "than model.transformer.max_positions 16 (the positions the model has)",
        "model.transformer={heads: 2}": "recipe key 'model.transformer.heads': 2 contradicts "
        f"model.from_run {str(run)!r}, whose recipe makes it 4",
        "data.tokenizer=bytes": "recipe key 'data.tokenizer': 'bytes' contradicts model.from_run "
        f"{str(run)!r}, whose run's tokenizer the model's ids mean (leave data.tokenizer out)",
        "task=classify": "recipe key 'task': 'classify' contradicts model.from_run "
        f"{str(run)!r}, whose recipe makes it 'language_model'",
    }
    for assignment, message in refused.items():
        result = cli("config", recipe_file, *sets(assignment))
        assert (result.code, result.err_lines) == (2, [f"error: {message}"]), assignment
    assert cli("config", recipe_file, *sets(f"data.tokenizer={run}")).code == 0


def test_an_imported_model_as_the_base_then_a_resume_without_it(cli, tmp_path):
    """`import-hf` writes a run directory: a recipe starting from it on batch=4,model=2 (heads
    split) trains from the imported weights (one SGD step at a learning rate of 1e-30 leaves
    them as they were), keeps the import's Hugging Face files, and once the import is gone
    resumes from its own checkpoint."""
    from dtcli import metrics
    from dtcli.rundir.base import hf_digests

    folder = hf_models.numpy_gpt2(tmp_path / "hf")
    files = ("config.json", "model.safetensors")
    assert hf_digests(folder) == {f: sha256(folder / f) for f in files}
    imported = tmp_path / "imported"
    result = cli("import-hf", folder, "--out", imported, *CPU8, "--no-progress")
    assert result.code == 0, result.err
    text = tmp_path / "text.txt"
    text.write_text("\n".join(hf_models.LINES * 4))
    recipe = {
        "mesh": {"batch": 4, "model": 2},
        "layouts": {"rules": TP_RULES},
        "model": {"from_run": str(imported), "transformer": {"context": 8}},
        "data": {"source": "text", "path": str(text), "batch_size": 8},
        "optimizer": {"name": "sgd", "learning_rate": 1e-30},
        "train": {"steps": 1},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    result = cli("train", tmp_path / "r.yaml", "--out", run, *CPU8, "--no-progress")
    assert result.code == 0, result.err
    start = checkpoint_tensors(rundir.complete_checkpoints(imported)[-1])
    trained = checkpoint_tensors(run / "checkpoints" / "ckpt-00000001")
    assert trained.keys() == start.keys() and len(start) == 20
    for key, value in start.items():
        np.testing.assert_allclose(trained[key], value, rtol=1e-6, atol=0, err_msg=key)
    assert (run / "hf" / "config.json").read_bytes() == (
        imported / "hf" / "config.json"
    ).read_bytes()
    shutil.move(imported, tmp_path / "moved")
    result = cli("train", "--resume", run, "--set", "train.steps=2", "--no-progress")
    assert result.code == 0, result.err
    assert [r["step"] for r in metrics.read(run / "metrics.jsonl")] == [1, 2]
