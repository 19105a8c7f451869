"""The checks of model.transformer's keys between themselves: sizes, dropout with remat, and the
architecture options (key/value heads, positions, rope scaling)."""

from __future__ import annotations

from dtcli.errors import UsageError
from dtcli.recipe.configs import TransformerConfig


def check_transformer(t: TransformerConfig) -> None:
    for key in ("layers", "d_model", "heads", "mlp_ratio", "context"):
        if getattr(t, key) < 1:
            raise UsageError(
                f"recipe key 'model.transformer.{key}': expected an integer >= 1, "
                f"got {getattr(t, key)}"
            )
    if t.d_model % t.heads:
        raise UsageError(
            f"recipe key 'model.transformer.heads': d_model {t.d_model} does not divide into "
            f"{t.heads} heads (expected a divisor of d_model)"
        )
    if not 0 <= t.dropout < 1:
        raise UsageError(
            f"recipe key 'model.transformer.dropout': expected a number in [0, 1), got {t.dropout}"
        )
    _check_architecture(t)
    if t.remat and t.dropout:
        # The recompute would draw new dropout masks: gradients of another network than the
        # forward pass ran.
        raise UsageError(
            f"recipe key 'model.transformer.remat': recomputing a block would draw new dropout "
            f"masks; set model.transformer.dropout to 0 (got {t.dropout}) or remat to false"
        )


def _check_architecture(t: TransformerConfig) -> None:
    """The architecture options (activation, norm, positions, key/value heads, vocabulary)."""
    key = "recipe key 'model.transformer"
    for name in ("mlp_hidden", "max_positions", "kv_heads", "vocab_size"):
        value = getattr(t, name)
        if value is not None and value < 1:
            raise UsageError(f"{key}.{name}': expected an integer >= 1 or null, got {value}")
    if t.heads % t.key_heads:
        raise UsageError(
            f"{key}.kv_heads': {t.heads} query heads do not divide into groups of "
            f"{t.kv_heads} key/value heads (expected a divisor of heads {t.heads})"
        )
    if t.context > t.position_rows:
        raise UsageError(
            f"{key}.context': {t.context} is longer than model.transformer.max_positions "
            f"{t.max_positions} (the positions the model has)"
        )
    for name in ("norm_eps", "rope_theta"):
        if getattr(t, name) <= 0:
            raise UsageError(f"{key}.{name}': expected a number > 0, got {getattr(t, name)}")
    if t.positions == "rope" and t.head_dim % 2:
        raise UsageError(
            f"{key}.positions': rope rotates pairs of a head's dims, and d_model / heads = "
            f"{t.head_dim} is odd"
        )
    if t.positions != "rope" and t.rope_theta != TransformerConfig.rope_theta:  # its default
        raise UsageError(
            f"{key}.rope_theta': sets rope's base, and model.transformer.positions is "
            f"{t.positions}; set model.transformer.positions: rope or remove it"
        )
    if t.rope_scaling is not None:
        _check_rope_scaling(t)


def _check_rope_scaling(t: TransformerConfig) -> None:
    s, key = t.rope_scaling, "recipe key 'model.transformer.rope_scaling"
    if t.positions != "rope":
        raise UsageError(f"{key}': scales rope; set model.transformer.positions: rope or remove it")
    for name in ("factor", "low_freq_factor", "high_freq_factor", "original_context"):
        if getattr(s, name) <= 0:
            raise UsageError(f"{key}.{name}': expected a number > 0, got {getattr(s, name)}")
    if s.high_freq_factor <= s.low_freq_factor:
        raise UsageError(
            f"{key}.high_freq_factor': expected more than low_freq_factor {s.low_freq_factor}, "
            f"got {s.high_freq_factor}"
        )
