"""What a Hugging Face model folder's safetensors files hold, from their headers alone: each
tensor's dtype and shape, checked against the tensors its config.json implies. No tensor data
is read (a safetensors file is an 8-byte little-endian header length, that many bytes of JSON,
then the data), so a folder of 16 GB answers in milliseconds; no TensorFlow, no `safetensors`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtcli.errors import UsageError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}
# A header larger than this is no safetensors header (the format caps it at 100 MB).
MAX_HEADER = 100_000_000
# Buffers the hub's files carry beside the parameters: GPT-2's causal masks, Llama's rotary
# frequencies. Not parameters; never compared.
BUFFERS = re.compile(r"(\.attn\.(bias|masked_bias)|\.rotary_emb\.inv_freq)$")


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]
    file: str  # the file that holds it (its name in the folder)

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES.get(self.dtype, 0)


def read_folder(folder: Path) -> dict[str, Tensor] | None:
    """Every tensor of the folder's model.safetensors, or of the files its
    model.safetensors.index.json names; None where the folder has neither (a config alone)."""
    index = folder / INDEX_FILE
    if index.is_file():
        files = sorted(set(_weight_map(index).values()))
    elif (folder / WEIGHTS_FILE).is_file():
        files = [WEIGHTS_FILE]
    else:
        return None
    out: dict[str, Tensor] = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise UsageError(f"{index}: names {name!r}, which is not in {str(folder)!r}")
        out.update(read_header(path))
    return out


def _weight_map(index: Path) -> dict[str, str]:
    try:
        found = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{index}: expected JSON with a 'weight_map' ({exc})") from None
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        raise UsageError(f"{index}: 'weight_map' should map tensor names to file names")
    return found


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors one safetensors file holds, from its header; a header that is cut short or
    no safetensors header, or a tensor whose bytes lie beyond the end of the file, is refused
    in one line naming the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 2 or length > min(MAX_HEADER, size - 8):
            raise UsageError(
                f"{path}: no safetensors header ({size:,} bytes; truncated, or another format)"
            )
        text = f.read(length)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"{path}: its safetensors header is no JSON (damaged?)") from None
    if not isinstance(header, dict):
        raise UsageError(f"{path}: its safetensors header is no JSON object (damaged?)")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - length
    return {name: _tensor(path, name, entry, data_bytes) for name, entry in header.items()}


def _tensor(path: Path, name: str, entry: Any, data_bytes: int) -> Tensor:
    try:
        dtype, shape = str(entry["dtype"]), tuple(int(n) for n in entry["shape"])
        begin, end = (int(n) for n in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise UsageError(f"{path}: tensor {name!r} has no dtype, shape and data_offsets") from None
    if dtype not in DTYPE_BYTES:
        raise UsageError(f"{path}: tensor {name!r} has dtype {dtype!r}, unknown to safetensors")
    tensor = Tensor(dtype, shape, path.name)
    if end > data_bytes:
        raise UsageError(
            f"{path}: tensor {name!r} ends at byte {end:,} of the data, the file holds "
            f"{data_bytes:,} (truncated)"
        )
    if end - begin != tensor.bytes:
        raise UsageError(
            f"{path}: tensor {name!r} takes {end - begin:,} bytes, its shape "
            f"{list(shape)} in {dtype} {tensor.bytes:,}"
        )
    return tensor


def check(
    found: dict[str, Tensor],
    implied: dict[str, tuple[int, ...]],
    optional: set[str],
    folder: Path,
    prefix: str = "",
) -> None:
    """Every tensor of the files against `implied` (name -> shape, what config.json implies;
    `optional`: names that may be absent, a tied head's), one line naming the first that
    disagrees: a shape, a tensor the config has no place for, one the config needs and the
    files lack. `prefix`: a name prefix the files may carry or not (GPT-2's `transformer.`)."""
    seen = set()
    for name, tensor in found.items():
        key = name[len(prefix) :] if prefix and name.startswith(prefix) else name
        if BUFFERS.search(key):
            continue
        where = f"{folder / tensor.file}: tensor {name!r}"
        if key not in implied:
            raise UsageError(f"{where} has no place in the model config.json describes")
        if tensor.shape != implied[key]:
            raise UsageError(
                f"{where} has shape {list(tensor.shape)}; config.json implies {list(implied[key])}"
            )
        seen.add(key)
    missing = [k for k in implied if k not in seen and k not in optional]
    if missing:
        raise UsageError(
            f"{folder}: config.json implies a tensor {missing[0]!r} its safetensors files "
            f"lack ({len(missing)} missing)"
        )
