"""YAML to recipe dataclasses: each value checked against its key's type hint, and the JSON schema
drawn from the same hints.

A wrong type, an unknown key (with the closest known key suggested) or a float that is not
finite raises UsageError naming the full key path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal, Union

import yaml

from dtcli.errors import UsageError
from dtcli.recipe.configs import Recipe
from dtcli.recipe.trackers import TRACKERS


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in inner) + " or null"
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0]).removeprefix('an ').removeprefix('a ')}s"
        return f"a list of {len(args)} items"
    if origin is list:
        return "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


def shown(value: Any) -> str:
    """A value as the user wrote it in YAML (true, null, {a: 1}), not as Python prints it; a
    string quoted."""
    if isinstance(value, str):
        return repr(value)
    try:
        text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 30)
    except yaml.YAMLError:
        return repr(value)
    return text.removesuffix("\n...\n").strip()


def _fail(path: str, tp: Any, value: Any) -> UsageError:
    return UsageError(f"recipe key '{path}': expected {_describe(tp)}, got {shown(value)}")


class _NotFinite(UsageError):
    """A float key holding NaN or infinity (kept apart so `float | None` keeps the message)."""


def _finite(value: Any, path: str) -> float:
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise _NotFinite(f"recipe key '{path}': expected a finite number, got {shown(value)}")
    return number


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """Check `value` against the type `tp` and return it in canonical form."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if origin in (Union, types.UnionType):
        return _coerce_optional(tp, value, path)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise _fail(path, tp, value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _fail(path, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(path, tp, value)
    if tp is float:
        return _coerce_float(value, path)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _fail(path, tp, value)
    if origin is tuple:
        return _coerce_tuple(tp, value, path)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise _fail(path, tp, value)
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        return _coerce_dict(tp, value, path)
    raise TypeError(f"unsupported recipe type {tp!r} at {path}")  # a bug in this module


def _coerce_optional(tp: Any, value: Any, path: str) -> Any:
    """`X | None`: null, or a value of X (the message names the whole union)."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
        return build(inner[0], value, path)  # its own errors name the key inside it
    if len(inner) == 1:
        try:
            return _coerce(inner[0], value, path)
        except _NotFinite:
            raise
        except UsageError as exc:
            if f"{path}[" in str(exc):  # about an item's own key (track[1].mlflow.x): as said
                raise
            raise _fail(path, tp, value) from None
    # `str | Section | None` (data.tokenizer): a mapping is the section, anything else a str.
    section = next((a for a in inner if dataclasses.is_dataclass(a)), None)
    if section is not None and isinstance(value, dict):
        names = [f.name for f in dataclasses.fields(section)]
        if len(value) == 1 and next(iter(value)) not in names:
            ((key, item),) = value.items()
            # `bpe: 300`: YAML reads a space after the colon as a mapping, not the string bpe:300
            raise UsageError(
                f"recipe key '{path}': got the mapping {shown(value)}, whose keys may be "
                f"{', '.join(names)} (for the string {key}:{shown(item)}, leave out the space "
                "after the colon: YAML reads 'a: b' as a mapping)"
            )
        return build(section, value, path)
    for option in (a for a in inner if not dataclasses.is_dataclass(a)):
        with contextlib.suppress(UsageError):
            return _coerce(option, value, path)
    raise _fail(path, tp, value)


def _coerce_float(value: Any, path: str) -> float:
    # YAML 1.1 reads `1e-3` (no dot) as a string: accept anything float() parses.
    # NaN and infinity (YAML's .nan/.inf, or strings float() reads) are refused.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(value, path)
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:
            return _finite(value, path)
    raise _fail(path, float, value)


def _coerce_tuple(tp: Any, value: Any, path: str) -> tuple:
    """`tuple[X, ...]` (any length) or `tuple[X, Y]` (exactly that many), from a YAML list."""
    args = typing.get_args(tp)
    if not isinstance(value, (list, tuple)):
        raise _fail(path, tp, value)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise _fail(path, tp, value)
    return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))


def _coerce_dict(tp: Any, value: Any, path: str) -> dict:
    """`dict[str, X]`: null is the empty mapping; every key a string, every value an X."""
    _, val_tp = typing.get_args(tp)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, tp, value)
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise UsageError(f"recipe key '{path}': keys must be strings, got {shown(k)}")
        out[k] = _coerce(val_tp, v, f"{path}.{k}")
    return out


def build(cls: type, raw: Any, path: str) -> Any:
    """The dataclass `cls` from a raw mapping at key `path` ("" for the top), every value
    checked against its type hint; a key `cls` does not have is an error."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"recipe key '{path or '<top>'}': expected a mapping, got {shown(raw)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            full = f"{path}.{key}" if path else str(key)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"unknown recipe key '{full}'{hint}")
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(hints[name], raw[name], f"{path}.{name}" if path else name)
    return cls(**kwargs)


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if tp is Any:
        return {}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        # YAML 1.1 reads 1e-3 as a string; the loader accepts any string float() parses.
        return {"anyOf": [{"type": "number"}, {"type": "string", "pattern": _FLOAT_PATTERN}]}
    if tp is str:
        return {"type": "string"}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        options = [_type_schema(a) for a in inner] + [{"type": "null"}]
        return {"anyOf": options}
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0])}
        return {
            "type": "array",
            "prefixItems": [_type_schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(typing.get_args(tp)[1])}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        instance = tp()
        properties = {}
        for f in dataclasses.fields(tp):
            prop = _type_schema(hints[f.name])
            default = getattr(instance, f.name)
            if not dataclasses.is_dataclass(default):
                prop["default"] = plain(default)
            properties[f.name] = prop
        return {"type": "object", "properties": properties, "additionalProperties": False}
    raise TypeError(f"unsupported recipe type {tp!r}")  # a bug in this module


_FLOAT_PATTERN = r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$"


def plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists, all the way down."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def schema() -> dict[str, Any]:
    """The recipe's JSON schema (draft 2020-12), for editors and for checking recipes elsewhere.
    The loader checks more than types (mesh arithmetic, ranges); `dtcli config` runs all of it."""
    out = _type_schema(Recipe)
    out["properties"]["base"] = {
        "type": "string",
        "description": "Another recipe file this one extends (relative to this file); "
        "mappings merge key by key, other values are replaced.",
    }
    # `track`'s items: a tracker's name alone, or {NAME: {options}} with one key.
    items = out["properties"]["track"]["anyOf"][0]["items"]
    items["maxProperties"] = 1
    out["properties"]["track"]["anyOf"][0]["items"] = {"anyOf": [{"enum": list(TRACKERS)}, items]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "dtcli recipe",
        **out,
    }
