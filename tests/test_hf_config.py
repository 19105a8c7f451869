"""dtcli.hf.config: config.json <-> model.transformer keys (pure: no TensorFlow, no torch)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dtcli.errors import UsageError
from dtcli.hf import config as hf_config

GPT2 = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 4,
    "n_positions": 64,
    "vocab_size": 131,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
}
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "max_position_embeddings": 128,
    "vocab_size": 203,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "tie_word_embeddings": False,
}


def _folder(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_gpt2_keys(tmp_path):
    read = hf_config.read(_folder(tmp_path, GPT2))
    assert read.model_type == "gpt2"
    assert read.transformer == {
        "layers": 2,
        "d_model": 32,
        "heads": 4,
        "kv_heads": None,
        "mlp_hidden": 128,
        "activation": "gelu_tanh",
        "norm": "layernorm",
        "norm_eps": 1e-5,
        "positions": "learned",
        "max_positions": 64,
        "context": 64,
        "vocab_size": 131,
        "bias": True,
        "tie_embeddings": True,
        "dropout": 0.0,
    }


def test_llama_keys_both_rope_spellings(tmp_path):
    t = hf_config.read(_folder(tmp_path, LLAMA), context=32).transformer
    assert (t["kv_heads"], t["mlp_hidden"], t["activation"], t["norm"]) == (
        2,
        96,
        "swiglu",
        "rmsnorm",
    )
    assert (t["positions"], t["rope_theta"], t["rope_scaling"]) == ("rope", 500000.0, None)
    assert (t["context"], t["max_positions"], t["tie_embeddings"], t["bias"]) == (
        32,
        128,
        False,
        False,
    )
    old = {k: v for k, v in LLAMA.items() if k != "rope_parameters"}
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    t = hf_config.transformer_keys({**old, "rope_theta": 5e5, "rope_scaling": scaling})
    assert t["rope_theta"] == 5e5
    assert t["rope_scaling"] == {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_context": 64,
    }


@pytest.mark.parametrize(
    "config, named",
    [
        ({**GPT2, "model_type": "bert"}, "model_type 'bert' is not supported"),
        ({k: v for k, v in GPT2.items() if k != "model_type"}, "has no model_type (expected"),
        ({**GPT2, "model_type": "qwen2"}, "model_type 'qwen2' has biases on q/k/v only"),
        ({**GPT2, "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ({**GPT2, "reorder_and_upcast_attn": True}, "reorder_and_upcast_attn"),
        ({**GPT2, "activation_function": "relu"}, "activation_function 'relu'"),
        ({**GPT2, "n_head": 5}, "n_embd 32 is no multiple of n_head 5"),
        ({**GPT2, "n_layer": None}, "has no n_layer"),
        ({**LLAMA, "attention_bias": True}, "attention_bias true"),
        ({**LLAMA, "mlp_bias": True}, "mlp_bias true"),
        ({**LLAMA, "head_dim": 32}, "head_dim 32 is not hidden_size / num_attention_heads"),
        ({**LLAMA, "num_key_value_heads": 3}, "no multiple of num_key_value_heads 3"),
        ({**LLAMA, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "of type 'yarn'"),
        ({**LLAMA, "model_type": "mistral", "sliding_window": 64}, "sliding_window 64"),
    ],
)
def test_refused_naming_the_config_key(tmp_path, config, named):
    with pytest.raises(UsageError, match="config.json: ") as info:
        hf_config.read(_folder(tmp_path, config))
    assert named in str(info.value) and "\n" not in str(info.value)


def test_mistral_window_at_least_the_context_maps(tmp_path):
    config = {**LLAMA, "model_type": "mistral", "sliding_window": 64}
    assert hf_config.read(_folder(tmp_path, config), context=64).transformer["context"] == 64


def _transformer(**keys):
    base = dict(
        layers=2,
        d_model=32,
        heads=4,
        kv_heads=None,
        mlp_ratio=4,
        mlp_hidden=None,
        activation="gelu_tanh",
        norm="layernorm",
        norm_eps=1e-5,
        positions="learned",
        rope_theta=10000.0,
        rope_scaling=None,
        max_positions=None,
        context=64,
        vocab_size=131,
        bias=True,
        tie_embeddings=True,
    )
    return SimpleNamespace(**{**base, **keys})


def test_export_config_round_trips_the_keys():
    t = hf_config.transformer_keys(hf_config.to_config(_transformer(), 131))
    assert (t["activation"], t["mlp_hidden"], t["max_positions"], t["vocab_size"]) == (
        "gelu_tanh",
        128,
        64,
        131,
    )
    llama = hf_config.transformer_keys(LLAMA)
    back = hf_config.to_config(_transformer(**{**llama, "mlp_ratio": 4}), 203)
    assert hf_config.transformer_keys(back) == llama


@pytest.mark.parametrize(
    "keys, named",
    [
        ({"activation": "swiglu"}, "model.transformer.activation: swiglu"),
        ({"kv_heads": 2}, "model.transformer.kv_heads: 2"),
        ({"positions": "rope"}, "model.transformer.norm: layernorm"),
        ({"positions": "rope", "norm": "rmsnorm", "activation": "swiglu"}, "bias: true"),
        # rmsnorm with learned positions: the norm is what makes it no GPT-2, and is named
        ({"norm": "rmsnorm"}, "positions: learned has no Hugging Face equivalent beside norm "),
    ],
)
def test_export_refuses_what_hf_cannot_express(keys, named):
    with pytest.raises(UsageError, match=named):
        hf_config.to_config(_transformer(**keys), 131)


def test_an_export_of_a_run_dtcli_trained_names_its_own_end_of_document_id():
    """transformers' GPT2Config defaults bos/eos to 50256: past a small vocabulary (it warns on
    load). An export writes the tokenizer's end-of-document id, or none; an import's own ids
    travel as they are."""
    from dtcli.data.tokenizer import ByteTokenizer
    from dtcli.export import hf as export_hf

    bpe = json.dumps({"added_tokens": [{"id": 300, "content": "<|endoftext|>"}]})
    assert export_hf._token_ids({}, bpe) == {"bos_token_id": 300, "eos_token_id": 300}
    assert export_hf._token_ids({}, ByteTokenizer().to_json()) == {
        "bos_token_id": None,
        "eos_token_id": None,
    }
    own = {"eos_token_id": [1, 2], "bos_token_id": 0, "vocab_size": 9}
    assert export_hf._token_ids(own, bpe) == {"eos_token_id": [1, 2], "bos_token_id": 0}


def test_an_export_keeps_the_source_dtype_of_an_import_or_of_a_fine_tuned_run():
    """An import's checkpoint records its files' dtype; a run fine-tuned with model.from_hf
    has only the folder's config.json (RUN_DIR/hf/), whose dtype an export keeps too."""
    from dtcli.export import hf as export_hf

    assert export_hf._source_dtype({"hf_dtype": "BF16"}, {"dtype": "float32"}) == "BF16"
    assert export_hf._source_dtype({}, {"dtype": "bfloat16"}) == "BF16"
    assert export_hf._source_dtype({}, {"torch_dtype": "float16"}) == "F16"
    assert export_hf._source_dtype({}, {}) == "F32"
