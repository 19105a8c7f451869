"""dtcli.hf.safetensors_io and dtcli.hf.names against the safetensors package and transformers'
own checkpoints (small random models; no TensorFlow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from dtcli.errors import UsageError
from dtcli.hf import names, safetensors_io


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(3, 5, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "c": torch.randn(2, 2, generator=g).to(torch.float16),
    }


def test_reads_every_dtype_exactly(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / "model.safetensors")
    files = safetensors_io.ModelFiles(tmp_path)
    assert {n: e.dtype for n, e in files.entries.items()} == {"a": "F32", "b": "BF16", "c": "F16"}
    for name, t in tensors.items():
        np.testing.assert_array_equal(files.read(name), t.float().numpy())


def test_writes_what_safetensors_reads_back_bit_for_bit_and_shards(tmp_path):
    tensors = _tensors()
    values = {n: t.float().numpy() for n, t in tensors.items()}
    order = [(n, tuple(v.shape)) for n, v in values.items()]
    safetensors_io.write_model(tmp_path, order, values.__getitem__, "BF16", max_shard_bytes=30)
    index = json.loads((tmp_path / safetensors_io.INDEX).read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    back = {}
    for file in set(index["weight_map"].values()):
        back.update(load_file(tmp_path / file))
    # b was bf16 and comes back bit for bit; a, c are rounded to bf16 as torch rounds them.
    for name, t in tensors.items():
        assert back[name].dtype == torch.bfloat16
        assert torch.equal(back[name], t.to(torch.bfloat16)), name
    assert safetensors_io.ModelFiles(tmp_path).entries.keys() == tensors.keys()


def test_truncated_and_missing_files_refused(tmp_path):
    save_file(_tensors(), tmp_path / "model.safetensors")
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-3])
    with pytest.raises(UsageError, match="is truncated"):
        safetensors_io.ModelFiles(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(UsageError, match="has neither model.safetensors nor"):
        safetensors_io.ModelFiles(tmp_path)
    (tmp_path / safetensors_io.INDEX).write_text(json.dumps({"weight_map": {"a": "x.safetensors"}}))
    with pytest.raises(UsageError, match="names 'x.safetensors', which is not a file"):
        safetensors_io.ModelFiles(tmp_path)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_names_cover_transformers_checkpoint_and_invert(tmp_path, kind):
    """Every tensor transformers saves is mapped (buffers aside), with its shape, and each
    transform's inverse gives it back exactly."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    from dtcli.hf import config as hf_config

    if kind == "gpt2":
        cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=131)
    else:
        cfg = LlamaConfig(
            num_hidden_layers=2,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=48,
            vocab_size=131,
            max_position_embeddings=16,
            tie_word_embeddings=False,
        )
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    read = hf_config.read(tmp_path)
    files = safetensors_io.ModelFiles(tmp_path)
    by_name = names.file_names(kind, list(files.entries))
    maps = names.mappings(kind, read.transformer)
    assert sorted(m.hf for m in maps) == sorted(by_name)
    for m in maps:
        value = files.read(by_name[m.hf])
        assert value.shape == m.hf_shape
        np.testing.assert_array_equal(m.to_hf(m.to_dtcli(value)), value)


def test_gpt2_without_prefix_and_with_buffers():
    found = names.file_names("gpt2", ["h.0.attn.bias", "h.0.attn.c_attn.weight", "wte.weight"])
    assert found == {
        "transformer.h.0.attn.c_attn.weight": "h.0.attn.c_attn.weight",
        "transformer.wte.weight": "wte.weight",
    }
