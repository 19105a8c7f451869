"""What this host's CPU is, read once from /proc/cpuinfo (Linux; elsewhere nothing is known):
its model name and its instruction-set flags. No TensorFlow: the XLA cache's key, the cost
model's probe name and the choice of how bf16 steps compile all read it here."""

from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# Flags of CPUs whose matmul units take bfloat16 (Intel AMX, AVX512-BF16, as on Sapphire Rapids
# and Zen 4): oneDNN runs TensorFlow's bf16 matmuls on them, elsewhere it converts to float32.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.cache
def lines() -> tuple[str, ...]:
    """The lines that say what the CPU is ("model name", "flags"), each distinct one once (every
    core repeats them); () where unreadable."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return ()
    wanted = (line for line in text.splitlines() if line.startswith(("model name", "flags")))
    return tuple(dict.fromkeys(wanted))


def model_name() -> str:
    """The CPU's model name, "" where unknown."""
    return next((v for k, v in _fields() if k == "model name"), "")


def flags() -> frozenset[str]:
    """The CPU's instruction-set flags (`avx512f`, `amx_bf16`...), empty where unknown."""
    return frozenset(next((v for k, v in _fields() if k == "flags"), "").split())


def bf16_units() -> list[str]:
    """The CPU's BF16_FLAGS, sorted; [] where its matmul units do not take bfloat16."""
    return sorted(flags() & set(BF16_FLAGS))


def runs_bf16() -> bool:
    """Whether the CPU's matmul units take bfloat16 (BF16_FLAGS)."""
    return bool(bf16_units())


def _fields() -> list[tuple[str, str]]:
    return [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines())]
