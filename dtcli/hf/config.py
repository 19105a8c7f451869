"""A Hugging Face `config.json` and dtcli's `model.transformer` keys, each way.

`read(folder)` reads HF_DIR/config.json and gives its model type and the `model.transformer`
keys of the same model (`HfConfig.transformer`: plain recipe values, as a recipe file would hold
them); `to_config(transformer, vocab_size)` is the other way, the config.json of an export.
What does not map is refused in one line naming the config key (import) or the recipe key
(export). Model types: gpt2, llama, mistral (without a sliding window shorter than the context);
qwen2 is refused (biases on q/k/v only, where `model.transformer.bias` puts them on every layer).

No TensorFlow, no transformers: the names and defaults below are transformers' own (GPT2Config,
LlamaConfig, MistralConfig in transformers 5), so a config.json as the hub ships it reads as
transformers would read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtcli import storage
from dtcli.errors import UsageError

CONFIG = "config.json"
MODEL_TYPES = ("gpt2", "llama", "mistral")
# config.json's activation_function (transformers' ACT2FN names) -> model.transformer.activation.
# gelu is the exact erf GELU; gelu_new and gelu_pytorch_tanh are both the tanh approximation.
GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# Each default is transformers' own for a key a config.json may leave out.
GPT2_DEFAULTS = {"n_inner": None, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}
LLAMA_DEFAULTS = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "rope_theta": 10000.0}
# GPT-2 options that change the attention's math: refused when set (their value here is
# transformers' default, the one dtcli's model computes).
GPT2_FIXED = {
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "scale_attn_weights": True,
    "add_cross_attention": False,
}
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class HfConfig:
    """A config.json read: `transformer` holds the model.transformer keys of its model (context
    = the config's positions, dropout 0); `raw` is the file as read."""

    folder: Path
    model_type: str
    transformer: dict[str, Any]
    raw: dict[str, Any]

    @property
    def vocab_size(self) -> int:
        return self.transformer["vocab_size"]


class ConfigError(UsageError):
    """A config.json that dtcli cannot read or map: one line naming the file and the key."""


def read(
    folder: Path | str,
    arg: str = "HF_DIR",
    context: int | None = None,
    context_key: str = "--context",
) -> HfConfig:
    """HF_DIR/config.json read and mapped (see the module's docstring). `context`: the window
    dtcli trains and generates (default the config's positions; it may not exceed them), given
    by `context_key` (messages name it)."""
    folder = storage.as_path(folder)
    path = folder / CONFIG
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "no such folder"
        raise UsageError(f"{arg} {str(folder)!r}: {what}")
    if not path.is_file():
        raise UsageError(
            f"{arg} {str(folder)!r}: has no {CONFIG} (expected a Hugging Face model folder: "
            f"{CONFIG} and model.safetensors)"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: is not a JSON object ({type(exc).__name__})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: is not a JSON object")
    keys = transformer_keys(raw, str(path), context, context_key)
    return HfConfig(folder, raw.get("model_type"), keys, raw)


def transformer_keys(
    raw: dict[str, Any],
    where: str = CONFIG,
    context: int | None = None,
    context_key: str = "--context",
) -> dict:
    """The model.transformer keys of a config.json's model (`where`: the file, in messages)."""
    kind = raw.get("model_type")
    if kind == "qwen2":
        raise ConfigError(
            f"{where}: model_type 'qwen2' has biases on q/k/v only, which dtcli's "
            "model.transformer.bias (every layer or none) cannot express"
        )
    if kind is None:
        raise ConfigError(f"{where}: has no model_type (expected one of {', '.join(MODEL_TYPES)})")
    if kind not in MODEL_TYPES:
        raise ConfigError(
            f"{where}: model_type {kind!r} is not supported (expected one of "
            f"{', '.join(MODEL_TYPES)})"
        )
    keys = _gpt2(raw, where) if kind == "gpt2" else _llama(raw, where)
    positions = keys["max_positions"]
    if isinstance(context, int) and not 0 < context <= positions:
        raise UsageError(
            f"{context_key} {context}: expected 1 to the model's {positions} positions "
            f"({where}: {'n_positions' if kind == 'gpt2' else 'max_position_embeddings'})"
        )
    keys["context"] = context if isinstance(context, int) else positions
    if kind == "mistral":
        window = raw.get("sliding_window")
        if window is not None and _int(raw, "sliding_window", where) < keys["context"]:
            raise ConfigError(
                f"{where}: sliding_window {window} is shorter than the context "
                f"{keys['context']} (dtcli attends to the whole context; use --context {window} "
                "or less)"
            )
    return keys


def _gpt2(raw: dict[str, Any], where: str) -> dict[str, Any]:
    get = {**GPT2_DEFAULTS, **raw}.get
    for key, value in GPT2_FIXED.items():
        if raw.get(key, value) != value:
            raise ConfigError(
                f"{where}: {key} {json.dumps(raw[key])} is not supported (expected "
                f"{json.dumps(value)})"
            )
    act = get("activation_function")
    if act not in GPT2_ACTIVATIONS:
        raise ConfigError(
            f"{where}: activation_function {act!r} is not supported (expected one of "
            f"{', '.join(GPT2_ACTIVATIONS)})"
        )
    d, heads = _int(raw, "n_embd", where), _int(raw, "n_head", where)
    _heads_divide(d, heads, "n_embd", "n_head", where)
    hidden = get("n_inner")
    return {
        "layers": _int(raw, "n_layer", where),
        "d_model": d,
        "heads": heads,
        "kv_heads": None,
        "mlp_hidden": 4 * d if hidden is None else _int(raw, "n_inner", where),
        "activation": GPT2_ACTIVATIONS[act],
        "norm": "layernorm",
        "norm_eps": _float(get("layer_norm_epsilon"), "layer_norm_epsilon", where),
        "positions": "learned",
        "max_positions": _int(raw, "n_positions", where),
        "vocab_size": _int(raw, "vocab_size", where),
        "bias": True,
        "tie_embeddings": _bool(raw, "tie_word_embeddings", True, where),
        "dropout": 0.0,
    }


def _llama(raw: dict[str, Any], where: str) -> dict[str, Any]:
    get = {**LLAMA_DEFAULTS, **raw}.get
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key, False):
            raise ConfigError(f"{where}: {key} true is not supported (dtcli's Llama has no biases)")
    if get("hidden_act") != "silu":
        raise ConfigError(
            f"{where}: hidden_act {get('hidden_act')!r} is not supported (expected silu: SwiGLU)"
        )
    d, heads = _int(raw, "hidden_size", where), _int(raw, "num_attention_heads", where)
    _heads_divide(d, heads, "hidden_size", "num_attention_heads", where)
    head_dim = raw.get("head_dim")
    if head_dim is not None and head_dim != d // heads:
        raise ConfigError(
            f"{where}: head_dim {head_dim} is not hidden_size / num_attention_heads "
            f"({d // heads}); dtcli's heads are always d_model / heads wide"
        )
    kv = raw.get("num_key_value_heads")
    kv = heads if kv is None else _int(raw, "num_key_value_heads", where)
    if heads % kv:
        raise ConfigError(
            f"{where}: num_attention_heads {heads} is no multiple of num_key_value_heads {kv}"
        )
    theta, scaling = _rope(raw, where)
    return {
        "layers": _int(raw, "num_hidden_layers", where),
        "d_model": d,
        "heads": heads,
        "kv_heads": kv,
        "mlp_hidden": _int(raw, "intermediate_size", where),
        "activation": "swiglu",
        "norm": "rmsnorm",
        "norm_eps": _float(get("rms_norm_eps"), "rms_norm_eps", where),
        "positions": "rope",
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_positions": _int(raw, "max_position_embeddings", where),
        "vocab_size": _int(raw, "vocab_size", where),
        "bias": False,
        "tie_embeddings": _bool(raw, "tie_word_embeddings", False, where),
        "dropout": 0.0,
    }


def _rope(raw: dict[str, Any], where: str) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and the llama3 scaling: transformers 5 writes both in `rope_parameters`,
    earlier configs (most of the hub's) `rope_theta` and `rope_scaling` (with `type` or
    `rope_type`)."""
    key = "rope_parameters" if raw.get("rope_parameters") is not None else "rope_scaling"
    params = raw.get(key) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: {key} is not an object")
    theta = params.get("rope_theta", raw.get("rope_theta", LLAMA_DEFAULTS["rope_theta"]))
    theta = _float(theta, "rope_theta", where)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ConfigError(
            f"{where}: {key} of type {kind!r} is not supported (expected llama3 or none)"
        )
    missing = [k for k in LLAMA3_KEYS if k not in params]
    if missing:
        raise ConfigError(f"{where}: {key} of type llama3 lacks {', '.join(missing)}")
    values = [_float(params[k], f"{key}.{k}", where) for k in LLAMA3_KEYS]
    factor, low, high, original = values
    if original != int(original):
        raise ConfigError(f"{where}: {key}.original_max_position_embeddings is no whole number")
    scaling = {
        "type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_context": int(original),
    }
    return theta, scaling


def _heads_divide(d: int, heads: int, width_key: str, heads_key: str, where: str) -> None:
    if d % heads:
        raise ConfigError(f"{where}: {width_key} {d} is no multiple of {heads_key} {heads}")


def _int(raw: dict[str, Any], key: str, where: str) -> int:
    value = raw.get(key)
    if value is None:
        raise ConfigError(f"{where}: has no {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: {key} {value!r} is not a positive whole number")
    return value


def _float(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}: {key} {value!r} is not a positive number")
    return float(value)


def _bool(raw: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} {value!r} is not true or false")
    return value


# --- export: model.transformer -> config.json -------------------------------------------------

# What makes a dtcli GPT a Hugging Face GPT-2 or Llama: the options each model type fixes.
GPT2_OPTIONS = {"positions": "learned", "norm": "layernorm"}
LLAMA_OPTIONS = {"positions": "rope", "norm": "rmsnorm", "activation": "swiglu", "bias": False}
ACTIVATION_NAMES = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
_MODEL_TYPES_TEXT = (
    "gpt2 is positions learned, norm layernorm; llama is positions rope, norm rmsnorm, "
    "activation swiglu, bias false"
)


def model_type_of(transformer: Any) -> str:
    """gpt2 or llama: the Hugging Face model type that computes what this model.transformer
    does; UsageError naming the recipe key that neither can express."""
    get = lambda key, default=None: getattr(transformer, key, default)  # noqa: E731
    if get("positions", "learned") == "rope":
        kind, fixed, why = "llama", LLAMA_OPTIONS, "positions rope"
    elif get("norm", "layernorm") == "rmsnorm":
        kind, fixed, why = "llama", LLAMA_OPTIONS, "norm rmsnorm"
    else:
        kind, fixed, why = "gpt2", GPT2_OPTIONS, "positions learned and norm layernorm"
    for key, value in fixed.items():
        if get(key) != value:
            raise UsageError(
                f"model.transformer.{key}: {_yaml(get(key))} has no Hugging Face equivalent "
                f"beside {why} (Hugging Face's {kind}, the model type with {why}, has {key} "
                f"{_yaml(value)}; {_MODEL_TYPES_TEXT})"
            )
    if kind == "gpt2":
        if get("activation", "gelu") not in ACTIVATION_NAMES:
            raise UsageError(
                f"model.transformer.activation: {get('activation')} has no Hugging Face GPT-2 "
                f"equivalent (expected {' or '.join(ACTIVATION_NAMES)})"
            )
        kv = get("kv_heads")
        if kv not in (None, get("heads")):
            raise UsageError(
                f"model.transformer.kv_heads: {kv} has no Hugging Face GPT-2 equivalent "
                "(GPT-2 has one K/V head per query head)"
            )
    return kind


def to_config(transformer: Any, vocab_size: int, extra: dict[str, Any] | None = None) -> dict:
    """The config.json of a model.transformer whose vocabulary is `vocab_size` rows (the
    padding sliced off). `extra`: keys carried from the imported config (token ids, dtype).
    A GPT-2 without biases exports with zero biases (the same function)."""
    t = transformer
    kind = model_type_of(t)
    positions = t.max_positions or t.context
    hidden = t.mlp_hidden or t.mlp_ratio * t.d_model
    if kind == "gpt2":
        config = {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "n_layer": t.layers,
            "n_embd": t.d_model,
            "n_head": t.heads,
            "n_inner": hidden,
            "n_positions": positions,
            "activation_function": ACTIVATION_NAMES[t.activation],
            "layer_norm_epsilon": t.norm_eps,
            **{key: value for key, value in GPT2_FIXED.items()},
            "attn_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "resid_pdrop": 0.0,
        }
    else:
        config = {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "num_hidden_layers": t.layers,
            "hidden_size": t.d_model,
            "num_attention_heads": t.heads,
            "num_key_value_heads": t.kv_heads or t.heads,
            "head_dim": t.d_model // t.heads,
            "intermediate_size": hidden,
            "hidden_act": "silu",
            "rms_norm_eps": t.norm_eps,
            "max_position_embeddings": positions,
            "rope_parameters": _rope_parameters(t.rope_theta, t.rope_scaling),
            "attention_bias": False,
            "mlp_bias": False,
            "attention_dropout": 0.0,
        }
    config.update(vocab_size=vocab_size, tie_word_embeddings=t.tie_embeddings)
    config.update(extra or {})
    return config


def _rope_parameters(theta: float, scaling: Any) -> dict[str, Any]:
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    get = scaling.get if isinstance(scaling, dict) else lambda k: getattr(scaling, k)
    return {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": get("factor"),
        "low_freq_factor": get("low_freq_factor"),
        "high_freq_factor": get("high_freq_factor"),
        "original_max_position_embeddings": get("original_context"),
    }


def _yaml(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)
