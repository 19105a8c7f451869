"""A sweep's trials, pure (no TensorFlow, no files): `--grid KEY=V1,V2,...` as the cross product
of the keys' values, `--random N KEY=DIST ... --seed S` as N draws; each trial's overrides typed
as `--set` types them (YAML), its `--set` arguments, and its deterministic folder name."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

from dtcli.errors import UsageError
from dtcli.recipe import load_yaml

DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")


@dataclass(frozen=True)
class Trial:
    """One trial: its index (from 0, in the order the sweep lists them) and its overrides, each
    KEY with the text its `--set` gives (`texts`) and the value that text types to (`values`)."""

    index: int
    texts: tuple[tuple[str, str], ...]

    @property
    def values(self) -> dict[str, Any]:
        return {key: load_yaml(text) for key, text in self.texts}

    @property
    def sets(self) -> list[str]:
        return [f"{key}={text}" for key, text in self.texts]

    @property
    def folder(self) -> str:
        """NNN-DIGEST: the index and the first 8 hex digits of the SHA-256 of the overrides as
        canonical JSON (the same overrides: the same name, whatever the command's order)."""
        return f"{self.index:03d}-{digest(self.values)}"

    def shown(self) -> str:
        return " ".join(self.sets)


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def split_values(text: str) -> list[str]:
    """`1e-3,3e-3` -> ['1e-3', '3e-3']; commas inside brackets, braces or quotes do not split
    (`[64,64],[128]` is two YAML lists)."""
    parts: list[str] = []
    depth, quote, start = 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _key_and_text(arg: str, option: str, expected: str) -> tuple[str, str]:
    key, sep, text = arg.partition("=")
    if not sep or not key.strip() or not text.strip():
        raise UsageError(f"{option} {arg!r}: expected {expected}")
    return key.strip(), text.strip()


def _typed(option: str, arg: str, text: str) -> None:
    """A value's text must be YAML, as `--set` reads it."""
    try:
        load_yaml(text)
    except (yaml.YAMLError, ValueError, OverflowError):
        raise UsageError(f"{option} {arg!r}: {text!r} is not valid YAML") from None


def grid(args: list[str]) -> list[Trial]:
    """The cross product of each `--grid KEY=V1,V2,...`'s values, in the order given (the last
    key varies fastest)."""
    axes: list[tuple[str, list[str]]] = []
    for arg in args:
        key, text = _key_and_text(
            arg, "--grid", "KEY=V1,V2,... like optimizer.learning_rate=1e-3,3e-3"
        )
        values = split_values(text)
        if any(not v for v in values):
            raise UsageError(f"--grid {arg!r}: an empty value (between two commas or at an end)")
        for value in values:
            _typed("--grid", arg, value)
        _check_values_once(arg, key, values)
        _check_new_key("--grid", arg, key, [k for k, _ in axes])
        axes.append((key, values))
    keys = [key for key, _ in axes]
    return [
        Trial(i, tuple(zip(keys, combo)))
        for i, combo in enumerate(itertools.product(*(values for _, values in axes)))
    ]


def _check_values_once(arg: str, key: str, values: list[str]) -> None:
    """A value given twice makes two identical trials (the plan compares the values as typed)."""
    for i, value in enumerate(values):
        if value in values[:i]:
            raise UsageError(
                f"--grid {arg!r}: the value {value} of '{key}' is given twice; give each value once"
            )


def _check_new_key(option: str, arg: str, key: str, seen: list[str]) -> None:
    if key in seen:
        raise UsageError(f"{option} {arg!r}: key '{key}' is swept twice; give its values once")


@dataclass(frozen=True)
class Distribution:
    key: str
    kind: str  # DISTRIBUTIONS
    args: tuple[str, ...]  # the bounds' texts, or choice's values

    @property
    def log_scale(self) -> bool:
        return self.kind == "loguniform"


_DIST = re.compile(r"\s*(\w+)\s*\((.*)\)\s*", re.S)


def distribution(arg: str) -> Distribution:
    """`KEY=loguniform(1e-4,1e-2)` (or uniform(a,b), int(a,b) inclusive, choice(v1,v2,...))."""
    expected = (
        "KEY=DIST, DIST one of uniform(a,b), loguniform(a,b), int(a,b), choice(v1,v2,...) "
        "(like optimizer.learning_rate=loguniform(1e-4,1e-2))"
    )
    key, text = _key_and_text(arg, "--random", expected)
    found = _DIST.fullmatch(text)
    if found is None or found.group(1) not in DISTRIBUTIONS:
        raise UsageError(f"--random {arg!r}: expected {expected}")
    kind, args = found.group(1), tuple(split_values(found.group(2)))
    if kind == "choice":
        if any(not a for a in args):
            raise UsageError(f"--random {arg!r}: choice(...) needs values, none empty")
        for value in args:
            _typed("--random", arg, value)
        return Distribution(key, kind, args)
    low, high = _bounds(arg, kind, args)
    if kind == "loguniform" and low <= 0:
        raise UsageError(f"--random {arg!r}: loguniform needs 0 < a < b")
    return Distribution(key, kind, args)


def _bound(text: str, kind: str) -> float | None:
    """A bound's number (YAML reads 1e-4 as text: float() takes it), or None."""
    try:
        value = load_yaml(text)
        if kind == "int":
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        return None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, yaml.YAMLError):
        return None


def _bounds(arg: str, kind: str, args: tuple[str, ...]) -> tuple[float, float]:
    low, high = (_bound(a, kind) for a in args) if len(args) == 2 else (None, None)
    if low is None or high is None or not low < high:
        what = "integers" if kind == "int" else "numbers"
        raise UsageError(f"--random {arg!r}: {kind}(a,b) needs two {what} with a < b")
    return low, high


def random(count: int, args: list[str], seed: int | None) -> list[Trial]:
    """`count` trials, each drawing every distribution in turn from numpy's default_rng(seed):
    the same command draws the same trials. A float drawn is written with repr, so the trial's
    recipe holds exactly the value drawn."""
    import numpy as np

    if count < 1:
        raise UsageError(f"--random {count}: expected at least 1 trial")
    if seed is None:
        raise UsageError("--random: needs --seed S (the same command then draws the same trials)")
    if not args:
        raise UsageError(
            "--random: name what to draw after the recipe, like --random 8 "
            "'optimizer.learning_rate=loguniform(1e-4,1e-2)'"
        )
    dists: list[Distribution] = []
    for arg in args:
        dist = distribution(arg)
        _check_new_key("--random", arg, dist.key, [d.key for d in dists])
        dists.append(dist)
    rng = np.random.default_rng(seed)
    trials = []
    for i in range(count):
        trials.append(Trial(i, tuple((d.key, _draw(rng, d)) for d in dists)))
    return trials


def _draw(rng: Any, dist: Distribution) -> str:
    if dist.kind == "choice":
        return dist.args[int(rng.integers(len(dist.args)))]
    if dist.kind == "int":
        low, high = (int(load_yaml(a)) for a in dist.args)
        return str(int(rng.integers(low, high, endpoint=True)))
    low, high = (float(load_yaml(a)) for a in dist.args)
    if dist.kind == "loguniform":
        import math

        return repr(float(math.exp(rng.uniform(math.log(low), math.log(high)))))
    return repr(float(rng.uniform(low, high)))


def log_keys(args: list[str]) -> set[str]:
    """The keys drawn on a log scale (their plots get a log x axis)."""
    return {d.key for d in map(distribution, args) if d.log_scale}
