"""What makes a file a tokenizer.json, checked before `tokenizers` parses it: UTF-8 text (a
binary file is refused from its first bytes), JSON, an object with a 'model' object.
`NotATokenizer` says what it is instead, in words."""

from __future__ import annotations

import codecs
import json
from typing import Any

# A tokenizer.json's first bytes, read to refuse a binary file before reading the rest.
HEAD_BYTES = 1 << 16


class NotATokenizer(ValueError):
    """A file that is not a tokenizer.json: why, in words."""


def read_text(where: Any) -> str:
    """The file's text (`where`: a storage path); a file that is not UTF-8 (a .npy, a gzip, a
    program) is refused from its first HEAD_BYTES, before the rest is read."""
    with where.open("rb") as f:
        head = bytes(f.read(HEAD_BYTES))
        try:  # not final: a character may go on past the head
            codecs.getincrementaldecoder("utf-8")().decode(head)
        except UnicodeDecodeError as exc:
            raise NotATokenizer(_binary(head, exc)) from None
        data = head + bytes(f.read())
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotATokenizer(_binary(data, exc)) from None


def _binary(data: bytes, exc: UnicodeDecodeError) -> str:
    return f"a binary file, not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start:,})"


def parsed(text: str) -> dict[str, Any]:
    """tokenizer.json's text as JSON: an object with a 'model' object (what `tokenizers` reads
    further says the rest)."""
    try:
        spec = json.loads(text)
    except ValueError as exc:
        raise NotATokenizer(f"not JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise NotATokenizer(f"JSON, but {_json_kind(spec)} where a tokenizer.json holds an object")
    if "model" not in spec:
        keys = ", ".join(map(repr, list(spec)[:5])) or "none"
        raise NotATokenizer(
            f"JSON, but without the 'model' every tokenizer.json has; its keys: {keys}"
        )
    if not isinstance(spec["model"], dict):
        raise NotATokenizer(
            f"JSON, but its 'model' is {_json_kind(spec['model'])} where a tokenizer.json holds "
            "an object"
        )
    return spec


def _json_kind(value: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")
