"""import-hf and export --format hf against transformers: small random GPT-2 and Llama models
made by transformers (tests/hf_models.py), imported, their per-token log probabilities compared
with transformers' on 1 device, on batch=2,model=2 and with layouts.fsdp; import -> export gives
every tensor back bit for bit (bf16 too) and transformers loads the export as it is; greedy
generation of 32 tokens is transformers' generate(do_sample=False), stopping at the same
end-of-sequence ids (several for the Llama, as Llama 3 has)."""

from __future__ import annotations

import math

import hf_models
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

TOLERANCE = 1e-4
# Compared with transformers, whose math it is, and with the import itself: Grappler's rewrites
# off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")
NEW_TOKENS = 32
PROMPT = "First Citizen:"
# Each greedy token wins by at least this in log probability, so rounding cannot pick it.
MARGIN = 1e-3
CPU8 = ("--devices", "cpu:8")  # the session's devices: an in-process command uses them all
MESHES = [("batch=1", ()), ("batch=2,model=2", ()), ("batch=4", ("layouts.fsdp=true",))]


def _ids(vocab: int, length: int, rows: int = 4) -> np.ndarray:
    return np.random.default_rng(3).integers(0, vocab, size=(rows, length)).astype(np.int32)


def _hf_logprobs(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor(ids, dtype=torch.long)).logits.float()
    logp = torch.log_softmax(logits, -1).numpy()
    return np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]


def _dtcli_logprobs(run, ids: np.ndarray, mesh: str, sets: tuple[str, ...]) -> np.ndarray:
    """The imported checkpoint restored on `mesh` (of the session's 8 virtual CPUs), its
    model's forward pass over `ids` (in a tf.function, as training and eval run it), each next
    token's log probability."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from dtcli import checkpoint as ckpt_lib
    from dtcli import session as session_lib
    from dtcli.infer.forward import on_host
    from dtcli.layout import replicated
    from dtcli.recipe import Overrides
    from dtcli.rundir import checkpoint_recipe, tokenizer_file

    ckpt = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
    recipe = checkpoint_recipe(ckpt, "generate", Overrides(sets, mesh, "cpu:8"))
    use = math.prod(recipe.mesh.values())
    session = session_lib.prepare(
        recipe, splits=(), use_devices=use, tokenizer_file=tokenizer_file(ckpt), command="generate"
    )
    saver = ckpt_lib.Checkpointer(ckpt.parent, {"model": session.model.module}, 1)
    saver.restore(ckpt, session.model.weights, partial=True)

    @tf.function
    def logits(window):
        out = session.model.forward(window, training=False)
        return dtensor.relayout(out, replicated(session.mesh, 3)) if session.mesh else out

    out = on_host(logits(session.packer.pack(ids))).astype(np.float64)
    logp = out - out.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]


@pytest.fixture(scope="module")
def imported(tmp_path_factory, cpu8):
    """Each model made by transformers, and its import: GPT-2's onto the session's 8 virtual
    CPUs as a data mesh, Llama's onto batch=2,model=4 (its weights split by the model axis).
    The Llama's generation_config.json names several end-of-sequence ids, as Llama 3's does
    (_end_sequences_within)."""
    from conftest import run_cli

    out = {}
    for kind, make, mesh in (
        ("gpt2", hf_models.gpt2, "batch=8"),
        ("llama", hf_models.llama, "batch=2,model=4"),
    ):
        tmp = tmp_path_factory.mktemp(kind)
        model = make(tmp / "hf")
        if kind == "llama":
            _end_sequences_within(model, tmp / "hf", 3 * NEW_TOKENS // 4)
        result = run_cli("import-hf", tmp / "hf", "--out", tmp / "run", "--mesh", mesh, *CPU8)
        assert result.code == 0, result.err
        out[kind] = (model, tmp)
    return out


def _prompt_ids(folder, text: str = PROMPT) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids


def _end_sequences_within(model, folder, at: int) -> None:
    """The model's end-of-sequence ids become [its last id, the first token of its greedy text
    after PROMPT, from position `at` on, that it did not make before], in its
    generation_config.json (saved again) and in memory: several ids, the second ends the text,
    and the tokenizer's end-of-document id 0 (which the text makes earlier) ends nothing."""
    ids = _prompt_ids(folder)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    new = ids[-NEW_TOKENS:]
    stop = next(t for i, t in enumerate(new) if i >= at and t not in new[:i])
    assert 0 in new[: new.index(stop)] and model.config.vocab_size - 1 not in new
    model.generation_config.eos_token_id = [model.config.vocab_size - 1, stop]
    model.generation_config.save_pretrained(folder)


@pytest.mark.parametrize("mesh, sets", MESHES)
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_log_probabilities_match_transformers(imported, kind, mesh, sets):
    model, tmp = imported[kind]
    ids = _ids(model.config.vocab_size, 64)
    want = _hf_logprobs(model, ids)
    got = _dtcli_logprobs(tmp / "run", ids, mesh, sets)
    assert np.abs(got - want).max() < TOLERANCE


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_score_matches_transformers(imported, kind, cli):
    """`dtcli score --json` of the import on batch=2,model=4: transformers' log probabilities
    of the text's tokens (the tokenizer's ids; the others' logits still in each softmax)."""
    import json

    model, tmp = imported[kind]
    text = hf_models.LINES[1]
    result = cli("score", tmp / "run", "--text", text, "--json", "--mesh", "batch=2,model=4", *CPU8)
    assert result.code == 0, result.err
    got = json.loads(result.out)
    ids = np.array([got["tokens"]])
    assert got["tokens"] == _prompt_ids(tmp / "hf", text)
    assert np.abs(np.array(got["logprobs"]) - _hf_logprobs(model, ids)[0]).max() < TOLERANCE


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_export_gives_every_tensor_back_and_transformers_loads_it(imported, kind, cli):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tmp = imported[kind]
    out = tmp / f"export-{len(list(tmp.iterdir()))}"
    result = cli("export", tmp / "run", "--format", "hf", "--out", out)
    assert result.code == 0, result.err
    source, back = load_file(tmp / "hf" / "model.safetensors"), load_file(out / "model.safetensors")
    assert back.keys() == source.keys()
    for name, value in source.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = _ids(model.config.vocab_size, 64)
    assert np.abs(_hf_logprobs(loaded, ids) - _hf_logprobs(model, ids)).max() == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert (
        tok("Speak, speak.")["input_ids"]
        == AutoTokenizer.from_pretrained(tmp / "hf")("Speak, speak.")["input_ids"]
    )


def test_bf16_checkpoint_round_trips_bit_for_bit(tmp_path, cli):
    hf_models.llama(tmp_path / "hf", dtype="bfloat16")
    assert cli("import-hf", tmp_path / "hf", "--out", tmp_path / "run", *CPU8).code == 0
    assert cli("export", tmp_path / "run", "--format", "hf", "--out", tmp_path / "out").code == 0
    from safetensors import safe_open

    with (
        safe_open(tmp_path / "hf" / "model.safetensors", "pt") as a,
        safe_open(tmp_path / "out" / "model.safetensors", "pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        for name in a.keys():
            x, y = a.get_tensor(name), b.get_tensor(name)
            assert x.dtype == y.dtype == torch.bfloat16 and torch.equal(
                x.view(torch.int16), y.view(torch.int16)
            )


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_generation_is_transformers(imported, kind):
    """32 greedy tokens with the K/V cache and without (one device), as transformers'
    generate(do_sample=False), both stopping at the run's end-of-sequence ids."""
    from dtcli import generate as generate_lib

    model, tmp = imported[kind]
    ids = _prompt_ids(tmp / "hf")
    assert len(ids) + NEW_TOKENS <= model.config.max_position_embeddings
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    want = out.sequences[0, len(ids) :].tolist()
    stops = model.generation_config.eos_token_id
    stops = stops if isinstance(stops, list) else [stops]
    # The Llama stops early, at its second end-of-sequence id; GPT-2 makes all 32.
    assert len(want) == NEW_TOKENS if kind == "gpt2" else want[-1] == stops[1]
    for scores in out.scores:
        top2 = torch.log_softmax(scores[0].double(), -1).topk(2).values
        assert top2[0] - top2[1] >= MARGIN
    generator = generate_lib.Generator(tmp / "run", "batch=1", "cpu:8", 1, progress=False)
    assert list(generator.tokenizer.encode(PROMPT.encode())) == ids
    for cache in (True, False):
        settings = generate_lib.Settings(NEW_TOKENS, temperature=0.0, cache=cache)
        got = [t for picked in generator.steps([PROMPT.encode()], settings) for _, t in picked]
        assert got == want, f"cache={cache}"


def test_fine_tuning_from_hf_starts_from_its_weights_and_resumes(imported, cli, tmp_path):
    """model.from_hf on batch=4,model=2: the first step's loss is transformers' loss of the
    Llama on that batch (the weights came in), the run keeps the folder's generation settings,
    and it resumes for 2 more steps once the folder is gone (its recipe needs it no more)."""
    import shutil

    import yaml

    from dtcli import data as data_lib
    from dtcli import metrics
    from dtcli import recipe as recipe_lib

    model, tmp = imported["llama"]
    folder = shutil.copytree(tmp / "hf", tmp_path / "hf")
    text = tmp_path / "text.txt"
    text.write_text("\n".join(hf_models.LINES * 4))
    recipe = {
        "task": "language_model",
        "mesh": {"batch": 4, "model": 2},
        "model": {"from_hf": str(folder), "transformer": {"context": 16}},
        "data": {"source": "text", "path": str(text), "batch_size": 8, "shuffle": False},
        "optimizer": {"name": "adamw", "learning_rate": 1e-3},
        "train": {"steps": 3, "log_every": 1},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    result = cli("train", tmp_path / "r.yaml", "--out", run, "--no-progress", *CPU8)
    assert result.code == 0, result.err
    first = metrics.read(run / "steps.jsonl")[0]
    resolved = recipe_lib.load(run / "recipe.yaml")
    vocab = model.config.vocab_size
    batch = data_lib.load(resolved.data, ("train",), run / "tokenizer.json", vocab).train
    with torch.no_grad():
        logits = model(torch.tensor(batch.x[:8].astype(np.int64))).logits
        want = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            torch.tensor(batch.y[:8].astype(np.int64)).reshape(-1),
        )
    assert abs(first["loss"] - float(want)) < TOLERANCE, (first, float(want))
    assert (run / "hf" / "generation_config.json").read_bytes() == (
        folder / "generation_config.json"
    ).read_bytes()
    shutil.rmtree(folder)
    result = cli("train", "--resume", run, "--set", "train.steps=5", "--no-progress")
    assert result.code == 0, result.err
    assert [r["step"] for r in metrics.read(run / "steps.jsonl")][-2:] == [4, 5]


def test_sigterm_during_import_removes_its_hidden_folder_and_exits_143(tmp_path):
    """SIGTERM (a scheduler's stop) as Ctrl-C: the hidden folder beside --out is removed, one
    line, exit 143 (it used to stay, tokenizer.json and hf/ in it). The import stops after
    copying the tokenizer, as a slow one would, for the signal; a hidden folder that a killed
    import to the same --out left (its process gone) is removed first, and stderr says so."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    from conftest import ROOT, env

    folder = hf_models.numpy_gpt2(tmp_path / "hf")
    out = tmp_path / "imp" / "bt3"
    stale = out.parent / ".bt3.import-999999999"  # above any pid_max: no such process
    (stale / "hf").mkdir(parents=True)
    code = textwrap.dedent("""
        import sys, time
        from dtcli import cli
        from dtcli.hf import tokenizer_files
        copy_in = tokenizer_files.copy_in
        def slow(*args):
            copy_in(*args)
            print("copied", flush=True)
            time.sleep(60)
        tokenizer_files.copy_in = slow
        sys.exit(cli.run(sys.argv[1:]))
    """)
    args = ["import-hf", str(folder), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout.readline() == "copied\n"
        hidden = out.parent / f".bt3.import-{proc.pid}"
        assert (hidden / "tokenizer.json").is_file()  # half written, as the trial found it
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert err.splitlines() == [
        f"note: removed {stale}, left by an import-hf to the same --out that did not finish "
        "(process 999999999 is gone)",
        f"preempted (SIGTERM); import-hf stopped and wrote nothing to --out {str(out)!r}",
    ]
    assert list(out.parent.iterdir()) == []
