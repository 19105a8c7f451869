"""Reading recipe files: YAML that refuses a key given twice, `base:` files merged under the
file that names them, and ${NAME} references filled from the environment."""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from dtcli import storage
from dtcli.errors import UsageError, one_line


class DuplicateKey(Exception):
    """A mapping in the YAML text names one key twice (PyYAML would keep the last silently)."""

    def __init__(self, path: str, first: int, second: int):
        super().__init__(path)
        self.path, self.first, self.second = path, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key that appears twice in one mapping."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_unique_keys(node, "", set())
        return super().construct_document(node)


def _check_unique_keys(node: yaml.Node, path: str, seen: set[int]) -> None:
    if id(node) in seen:  # an alias to a node already walked (or a recursive structure)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                name = f"{path}.{key.value}" if path else str(key.value)
                line = key.start_mark.line + 1
                if (key.tag, key.value) in first:
                    raise DuplicateKey(name, first[(key.tag, key.value)], line)
                first[(key.tag, key.value)] = line
                _check_unique_keys(value, name, seen)
            else:
                _check_unique_keys(value, path, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{path}[{i}]", seen)


def load_yaml(text: str) -> Any:
    """Parse YAML like yaml.safe_load, raising DuplicateKey for a key given twice."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: plain data only


def yaml_reason(exc: yaml.YAMLError, text: str) -> str:
    """Where the parser stopped and why, as ' at line L, column C: REASON' (and a hint for the
    two mistakes users make most: a tab indent, a ${NAME} inside {...} or [...])."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return ""
    problem = getattr(exc, "problem", None) or ""
    where = f" at line {mark.line + 1}, column {mark.column + 1}"
    line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
    if "\\t" in problem or line[: mark.column + 1].strip(" ") == "\t":
        return f"{where}: a tab character; indent with spaces"
    if "${" in line and ("{" in line.split("${")[0] or "[" in line.split("${")[0]):
        return f"{where}: {problem} (quote a ${{NAME}} inside {{...}} or [...]: '${{NAME}}')"
    return f"{where}: {problem}" if problem else where


def _read_file(p: Any) -> dict:
    """One recipe file as a raw mapping, exactly as written (no base, no ${VAR} yet)."""
    if p.is_dir():
        raise UsageError(f"recipe {str(p)!r}: is a folder, expected a recipe file")
    if not p.is_file():
        raise UsageError(f"recipe {str(p)!r}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"recipe {str(p)!r}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"recipe {str(p)!r}: cannot read it (not UTF-8 text)") from None
    try:
        raw = load_yaml(text)
    except DuplicateKey as dup:
        raise UsageError(
            f"recipe {str(p)!r}: key '{dup.path}' appears twice (lines {dup.first} and "
            f"{dup.second})"
        ) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"recipe {str(p)!r}: not valid YAML{yaml_reason(exc, text)}") from None
    except (ValueError, OverflowError) as exc:  # a scalar YAML resolves but cannot build
        first = one_line(exc)
        raise UsageError(f"recipe {str(p)!r}: not valid YAML ({first})") from None
    if raw is None:
        raise UsageError(
            f"recipe {str(p)!r}: is empty (expected a mapping of recipe keys; "
            "`dtcli config --schema` lists them)"
        )
    if not isinstance(raw, dict):
        raise UsageError(f"recipe {str(p)!r}: expected a mapping at the top level")
    return raw


# ${NAME} or ${NAME:-default}; $${ writes a literal ${.
_ENV_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{[^}]*\}?")


def _interpolate(
    value: Any,
    path: str,
    where: str,
    environ: typing.Mapping[str, str],
    inside: frozenset[int] = frozenset(),
) -> Any:
    """Replace ${NAME} / ${NAME:-default} in the string values of a raw recipe. A value that is
    one reference and nothing else is read as a YAML scalar (`batch_size: ${BATCH}` gives an
    integer)."""
    if isinstance(value, (dict, list)):
        if id(value) in inside:
            raise UsageError(
                f"recipe {where}: key '{path or '<top>'}': a YAML alias refers to a mapping or "
                "list that contains it (the value would never end)"
            )
        inside = inside | {id(value)}
    if isinstance(value, dict):
        return {
            k: _interpolate(v, f"{path}.{k}" if path else str(k), where, environ, inside)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _interpolate(v, f"{path}[{i}]", where, environ, inside) for i, v in enumerate(value)
        ]
    if not isinstance(value, str) or "${" not in value:
        return value
    text = _ENV_REF.sub(lambda match: _substitute(match, path, where, environ), value)
    whole = _ENV_REF.fullmatch(value)
    if whole is not None and whole.group(1) is not None:
        return _as_scalar(text)
    return text


def _substitute(match: re.Match, path: str, where: str, environ: typing.Mapping[str, str]) -> str:
    """The text one `_ENV_REF` match stands for."""
    if match.group(0) == "$${":
        return "${"
    name, default = match.group(1), match.group(2)
    if default is not None and "${" in default:
        raise UsageError(
            f"recipe {where}: key '{path}': a default holding another reference "
            f"({match.group(0)}...) is not supported; give a plain default"
        )
    if name is None:
        raise UsageError(
            f"recipe {where}: key '{path}': {match.group(0)!r} is not a variable reference; "
            "expected ${NAME} or ${NAME:-default} (write $${ for a literal ${)"
        )
    if name in environ:
        return environ[name]
    if default is not None:
        return default
    raise UsageError(
        f"recipe {where}: key '{path}': environment variable {name} is not set "
        f"(set it, or give a default: ${{{name}:-VALUE}})"
    )


def _as_scalar(text: str) -> Any:
    """A value that was one ${NAME} reference, read as YAML when that gives a scalar."""
    try:
        if not text.strip():
            return text  # an empty value stays an empty string, not null
        parsed = load_yaml(text)
    except (yaml.YAMLError, DuplicateKey, ValueError, OverflowError):
        return text
    # Only scalars: a variable holding "{a: 1}" stays a string, not a new subtree.
    return parsed if not isinstance(parsed, (dict, list)) else text


# Mappings whose order means something (axis order, first matching rule) are replaced whole.
_REPLACED_WHOLE = {"mesh", "layouts.rules"}


def _merge(base: dict, child: dict, path: str = "") -> dict:
    """The child's keys over the base's: mappings merge key by key (except the ordered ones),
    anything else is replaced."""
    out = dict(base)
    for key, value in child.items():
        name = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            if name not in _REPLACED_WHOLE:
                value = _merge(out[key], value, name)
        out[key] = value
    return out


def read_raw(
    path: str | Path,
    environ: typing.Mapping[str, str] | None = None,
    _chain: tuple[Path, ...] = (),
) -> dict:
    """Read a recipe file as a raw mapping (no validation yet): its `base:` files merged under
    it (a base path is relative to the file naming it), then ${NAME} references filled from
    the environment."""
    env = os.environ if environ is None else environ
    p = storage.as_path(path)
    raw = _read_file(p)
    where = repr(str(p))
    raw = _interpolate(raw, "", where, env)
    model = raw.get("model")
    if isinstance(model, dict) and model.get("build") and "build_path" not in model:
        # model.build names a module next to the file that names it (a base's own folder).
        model["build_path"] = str(p.resolve().parent)
    if "base" not in raw:
        return raw
    base = raw.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise UsageError(
            f"recipe {where}: key 'base': expected the path of another recipe file, got {base!r}"
        )
    base_path = storage.as_path(base)
    if not base_path.is_absolute():
        base_path = p.parent / base
    here = p.resolve()
    chain = (*_chain, here)
    if base_path.resolve() in chain:
        names = " -> ".join(str(c.name) for c in (*chain, base_path.resolve()))
        raise UsageError(f"recipe {where}: key 'base': the base chain loops ({names})")
    if not base_path.is_file():
        what = "is a folder, not a recipe file:" if base_path.is_dir() else "no such file"
        raise UsageError(f"recipe {where}: key 'base': {what} {str(base_path)!r}")
    return _merge(read_raw(base_path, env, chain), raw)
