"""dtcli.hf.peft_files against peft itself (tiny random transformers models; no TensorFlow):
dtcli's adapters written as a peft folder load into peft and merge as dtcli merges, a folder
peft saved reads back as the same product, and what cannot map is refused in one line."""

from __future__ import annotations

import json
import types

import hf_models
import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from dtcli.errors import UsageError
from dtcli.hf import config as hf_config
from dtcli.hf import names, peft_files

RANK, ALPHA = 4, 12.0
LORA = types.SimpleNamespace(rank=RANK, alpha=ALPHA, dropout=0.0)


def _keys(folder):
    raw = json.loads((folder / "config.json").read_text())
    return raw["model_type"], hf_config.transformer_keys(raw)


def _kernels(model, model_type, keys):
    """The model's kernels at dtcli's paths and shapes (through hf.names)."""
    # Copies: a peft merge later writes into the same tensors.
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    out = {}
    for m in names.mappings(model_type, keys):
        if m.paths[0].endswith(".kernel"):
            out.update(zip(m.paths, m.to_dtcli(state[m.hf])))
    return out


def _inputs(path):
    """How many of a kernel's leading dims are its input (the shared spec's A/B split)."""
    return 2 if path.endswith("attention.proj.kernel") else 1


def _random_adapters(kernels, pattern, rng, vocab_padding=0):
    """Random A and B (B nonzero) for each kernel whose path contains one of `pattern`."""
    out = {}
    for path, k in kernels.items():
        if not any(p in path for p in pattern):
            continue
        n = _inputs(path)
        out_shape = list(k.shape[n:])
        if path == "head.kernel":
            out_shape[-1] += vocab_padding
        path_a, path_b = peft_files.adapter_paths(path)
        out[path_a] = rng.normal(size=(*k.shape[:n], RANK)).astype(np.float32)
        out[path_b] = rng.normal(size=(RANK, *out_shape)).astype(np.float32)
    return out


def _peft_merged(model, folder):
    """peft's own merge of the adapter folder into (a copy of) the model."""
    merged = PeftModel.from_pretrained(model, folder).merge_and_unload()
    return merged


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_export_loads_in_peft_and_merges_as_dtcli_merges(tmp_path, kind):
    base = (
        hf_models.gpt2(tmp_path / "base") if kind == "gpt2" else hf_models.llama(tmp_path / "base")
    )
    model_type, keys = _keys(tmp_path / "base")
    kernels = _kernels(base, model_type, keys)
    # GPT-2: query and value of block 0 only (k zero rows in c_attn), all of block 1's q/k/v,
    # both c_proj; Llama: every projection and the untied head, its vocabulary padded by 5.
    pattern = (
        ["block_0.attention.query", "block_0.attention.value", "block_1.attention.", "proj", "fc"]
        if kind == "gpt2"
        else ["block_", "head"]
    )
    adapters = _random_adapters(kernels, pattern, np.random.default_rng(0), vocab_padding=5)
    tensors, config = peft_files.to_peft(model_type, keys, adapters, LORA, "BASE")
    out = tmp_path / "adapter"
    out.mkdir()
    peft_files.write(out, tensors, config)

    merged = _peft_merged(base, out)
    got = _kernels(merged, model_type, keys)
    scale = ALPHA / RANK
    assert len(adapters) == 2 * (11 if kind == "gpt2" else 15)
    for path, kernel in kernels.items():
        path_a, path_b = peft_files.adapter_paths(path)
        want = kernel
        if path_a in adapters:
            b = (
                adapters[path_b][..., : kernel.shape[-1]]
                if path == "head.kernel"
                else adapters[path_b]
            )
            want = peft_files.merged(kernel, adapters[path_a], b, scale)
        np.testing.assert_allclose(got[path], want, atol=1e-6, err_msg=path)
    if kind == "gpt2":
        assert config["fan_in_fan_out"] is True
        assert config["rank_pattern"] == {
            "transformer.h.0.attn.c_attn": 2 * RANK,
            "transformer.h.1.attn.c_attn": 3 * RANK,
        }
        assert config["alpha_pattern"] == {
            "transformer.h.0.attn.c_attn": 2 * ALPHA,
            "transformer.h.1.attn.c_attn": 3 * ALPHA,
        }
        assert "transformer.h.0.attn.c_proj" in config["target_modules"]
        assert "transformer.h.0.mlp.c_proj" in config["target_modules"]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_files_round_trip_through_peft(tmp_path, kind):
    """dtcli -> folder -> peft loads and saves it again -> the same tensors and ranks; the
    folder read back gives dtcli's arrays bit for bit."""
    base = (
        hf_models.gpt2(tmp_path / "base") if kind == "gpt2" else hf_models.llama(tmp_path / "base")
    )
    model_type, keys = _keys(tmp_path / "base")
    kernels = _kernels(base, model_type, keys)
    pattern = ["query", "key", "attention.proj", "mlp.proj"]
    adapters = _random_adapters(kernels, pattern, np.random.default_rng(1))
    tensors, config = peft_files.to_peft(model_type, keys, adapters, LORA)
    (tmp_path / "ours").mkdir()
    peft_files.write(tmp_path / "ours", tensors, config)

    PeftModel.from_pretrained(base, tmp_path / "ours").save_pretrained(tmp_path / "theirs")
    theirs, their_config = peft_files.read(tmp_path / "theirs")
    assert theirs.keys() == tensors.keys()
    for name in tensors:
        np.testing.assert_array_equal(theirs[name], tensors[name], err_msg=name)
    for key in ("r", "lora_alpha", "rank_pattern", "alpha_pattern", "fan_in_fan_out"):
        assert their_config[key] == config[key], key
    assert sorted(their_config["target_modules"]) == sorted(config["target_modules"])

    shapes = {p: a.shape for p, a in adapters.items()}
    back = peft_files.from_peft(model_type, keys, theirs, their_config, shapes, LORA)
    assert back.keys() == adapters.keys()
    for path in adapters:
        np.testing.assert_array_equal(back[path], adapters[path], err_msg=path)


def _peft_saved(base, folder, targets, rank=RANK, alpha=ALPHA, **kwargs):
    """A peft adapter made by peft (random A and B) on the GPT-2 `base`, saved at `folder`."""
    kwargs.setdefault("fan_in_fan_out", True)  # GPT-2's Conv1D
    model = get_peft_model(
        base, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, **kwargs)
    )
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    return model


def test_a_peft_gpt2_c_attn_with_a_shared_a_reads_as_three_adapters(tmp_path):
    """peft's usual GPT-2 adapter (target_modules c_attn, c_proj: A shared by q/k/v) read as
    dtcli's adapters gives peft's merged weights."""
    base = hf_models.gpt2(tmp_path / "base")
    model_type, keys = _keys(tmp_path / "base")
    kernels = _kernels(base, model_type, keys)
    _peft_saved(base, tmp_path / "adapter", ["c_attn", "c_proj"])
    tensors, config = peft_files.read(tmp_path / "adapter")
    targets = [p for p in kernels if "attention" in p]  # q/k/v and proj (c_proj: attn's and mlp's)
    targets += [p for p in kernels if p.endswith("mlp.proj.kernel")]
    shapes = {}
    for path in targets:
        n = _inputs(path)
        path_a, path_b = peft_files.adapter_paths(path)
        shapes[path_a] = (*kernels[path].shape[:n], RANK)
        shapes[path_b] = (RANK, *kernels[path].shape[n:])
    adapters = peft_files.from_peft(model_type, keys, tensors, config, shapes, LORA)

    fresh = hf_models.gpt2(tmp_path / "again")
    got = _kernels(_peft_merged(fresh, tmp_path / "adapter"), model_type, keys)
    np.testing.assert_array_equal(
        adapters["block_0.attention.query.lora_a"], adapters["block_0.attention.key.lora_a"]
    )
    for path in targets:
        path_a, path_b = peft_files.adapter_paths(path)
        want = peft_files.merged(kernels[path], adapters[path_a], adapters[path_b], ALPHA / RANK)
        np.testing.assert_allclose(got[path], want, atol=1e-6, err_msg=path)


def _refused(tmp_path, targets, shapes_from, lora=LORA, **kwargs):
    base = hf_models.gpt2(tmp_path / "base")
    model_type, keys = _keys(tmp_path / "base")
    kernels = _kernels(base, model_type, keys)
    _peft_saved(base, tmp_path / "adapter", targets, **kwargs)
    tensors, config = peft_files.read(tmp_path / "adapter")
    shapes = {}
    for path in (p for p in kernels if any(s in p for s in shapes_from)):
        n = _inputs(path)
        path_a, path_b = peft_files.adapter_paths(path)
        shapes[path_a] = (*kernels[path].shape[:n], lora.rank)
        shapes[path_b] = (lora.rank, *kernels[path].shape[n:])
    with pytest.raises(UsageError) as caught:
        peft_files.from_peft(model_type, keys, tensors, config, shapes, lora, "lora.from_peft 'A'")
    return str(caught.value)


@pytest.mark.parametrize(
    "targets, shapes_from, lora, expected",
    [
        (
            ["c_attn"],
            ["attention.query", "attention.key", "attention.value", "mlp.fc"],
            LORA,
            "has no adapter of transformer.h.0.mlp.c_fc (dtcli's block_0.mlp.fc.kernel)",
        ),
        (
            ["c_attn", "c_fc"],
            ["attention.query", "attention.key", "attention.value"],
            LORA,
            "adapts transformer.h.0.mlp.c_fc, whose kernels lora.targets does not match",
        ),
        (["c_attn"], ["attention.query"], LORA, "lora_B changes outputs of projections"),
        (
            ["c_fc"],
            ["mlp.fc"],
            types.SimpleNamespace(rank=4, alpha=8.0, dropout=0.0),
            "transformer.h.0.mlp.c_fc's scale is lora_alpha/r = 12/4 = 3; the recipe's "
            "lora.alpha/lora.rank is 8/4 = 2",
        ),
        (
            ["c_fc"],
            ["mlp.fc"],
            types.SimpleNamespace(rank=2, alpha=6.0, dropout=0.0),
            "transformer.h.0.mlp.c_fc's rank is 4; lora.rank makes it 2",
        ),
    ],
)
def test_what_cannot_map_is_refused_in_one_line(tmp_path, targets, shapes_from, lora, expected):
    message = _refused(tmp_path, targets, shapes_from, lora)
    assert message.startswith("lora.from_peft 'A': ")
    assert expected in message
    assert "\n" not in message


def test_other_kinds_of_adapter_refused(tmp_path):
    assert "sets use_dora" in _refused(tmp_path, ["c_fc"], ["mlp.fc"], use_dora=True)
    (tmp_path / "x").mkdir()
    with pytest.raises(UsageError, match="has no adapter_config.json"):
        peft_files.read(tmp_path / "x")
