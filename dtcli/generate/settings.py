"""`dtcli generate`'s settings of a generation (how many tokens, how they are picked), checked
before anything is built."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtcli.errors import UsageError

# One compiled forward pass per token: a million takes hours on a CPU; more is a typo.
MAX_TOKENS = 1_000_000


@dataclass(frozen=True)
class Settings:
    tokens: int  # new tokens per prompt
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    cache: bool = True  # the K/V cache (dtcli's GPT); False: the window pass for every token


def check_options(s: Settings) -> None:
    if not 1 <= s.tokens <= MAX_TOKENS:
        raise UsageError(f"--tokens {s.tokens}: expected an integer from 1 to {MAX_TOKENS:,}")
    if not (s.temperature >= 0 and np.isfinite(s.temperature)):
        raise UsageError(f"--temperature {s.temperature}: expected a number >= 0 (0: greedy)")
    if s.top_k is not None and s.top_k < 1:
        raise UsageError(f"--top-k {s.top_k}: expected a positive integer")
    if s.top_p is not None and not 0 < s.top_p <= 1:
        raise UsageError(f"--top-p {s.top_p}: expected a number above 0, at most 1")
    if not 0 <= s.seed < 2**32:
        raise UsageError(f"--seed {s.seed}: expected an integer from 0 to 2**32 - 1")
