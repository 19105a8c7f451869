"""import-hf and export --format hf against transformers: small random GPT-2 and Llama models
made by transformers (tests/hf_models.py), imported, their per-token log probabilities compared
with transformers' on 1 device, on batch=2,model=2 and with layouts.fsdp; import -> export gives
every tensor back bit for bit (bf16 too) and transformers loads the export as it is."""

from __future__ import annotations

import math

import hf_models
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

TOLERANCE = 1e-4
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
    from dtcli.generate.forward import on_host
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
    CPUs as a data mesh, Llama's onto batch=2,model=4 (its weights split by the model axis)."""
    from conftest import run_cli

    out = {}
    for kind, make, mesh in (
        ("gpt2", hf_models.gpt2, "batch=8"),
        ("llama", hf_models.llama, "batch=2,model=4"),
    ):
        tmp = tmp_path_factory.mktemp(kind)
        model = make(tmp / "hf")
        result = run_cli("import-hf", tmp / "hf", "--out", tmp / "run", "--mesh", mesh, *CPU8)
        assert result.code == 0, result.err
        out[kind] = (model, tmp)
    return out


@pytest.mark.parametrize("mesh, sets", MESHES)
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_log_probabilities_match_transformers(imported, kind, mesh, sets):
    model, tmp = imported[kind]
    ids = _ids(model.config.vocab_size, 64)
    want = _hf_logprobs(model, ids)
    got = _dtcli_logprobs(tmp / "run", ids, mesh, sets)
    assert np.abs(got - want).max() < TOLERANCE


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
