"""safetensors files read one tensor at a time, and written from one tensor at a time.

The format (github.com/huggingface/safetensors): 8 bytes little-endian N, N bytes of JSON (each
tensor's dtype, shape and [begin, end) byte offsets after the header; `__metadata__`), then the
bytes. It is parsed here with NumPy, no torch: NumPy has no bfloat16, so a BF16 tensor is read
as its 16-bit patterns and widened to float32 exactly (a shift), and float32 is narrowed back to
BF16 by rounding to nearest even, which gives an imported BF16 weight back bit for bit.

A model folder holds `model.safetensors`, or shards named by `model.safetensors.index.json`'s
weight_map. A file shorter than its header says, a shard the index names that is missing, a
header that is no JSON: refused in one line naming the file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtcli.errors import UsageError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# safetensors' dtype names -> NumPy; BF16 is read as its bit patterns (uint16).
DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
# --dtype's names -> safetensors'.
WRITE_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
FLOATS = ("F64", "F32", "F16", "BF16")
# The largest header a reader accepts (safetensors' own limit is 100 MB).
MAX_HEADER = 100_000_000
# transformers' default --max-shard-size: 5 GB (decimal, as transformers counts).
DEFAULT_SHARD_BYTES = 5_000_000_000


@dataclass(frozen=True)
class Entry:
    """One tensor of a file: where its bytes are."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in `file`
    end: int


class ModelFiles:
    """The safetensors tensors of a model folder, by name; `read` one at a time."""

    def __init__(self, folder: Path, arg: str = "HF_DIR"):
        self.folder = Path(folder)
        self.entries: dict[str, Entry] = {}
        index, single = self.folder / INDEX, self.folder / SINGLE
        if index.is_file():
            files = _index_files(index)
        elif single.is_file():
            files = [single]
        else:
            raise UsageError(
                f"{arg} {str(self.folder)!r}: has neither {SINGLE} nor {INDEX} (dtcli reads "
                "safetensors weights only)"
            )
        for path in files:
            for name, entry in read_header(path).items():
                if name in self.entries:
                    raise UsageError(
                        f"{path}: tensor {name!r} is also in {self.entries[name].file}"
                    )
                self.entries[name] = entry

    def dtype(self) -> str:
        """The floating dtype the model's weights are stored in (the most common one)."""
        kinds = [e.dtype for e in self.entries.values() if e.dtype in FLOATS]
        return max(set(kinds), key=kinds.count) if kinds else "F32"

    def read(self, name: str) -> np.ndarray:
        """One tensor; floating dtypes as float32 (exactly: every BF16 and F16 value is one)."""
        return read_tensor(self.entries[name], name)


def read_tensor(entry: Entry, name: str) -> np.ndarray:
    """The tensor `entry` locates (its `name` for the message where the file is cut short);
    floating dtypes as float32."""
    # Read straight into the array returned (float32 as stored): one host copy of the
    # tensor, not the file's bytes and an array made from them.
    data = np.empty(entry.end - entry.begin, np.uint8)
    with entry.file.open("rb") as f:
        f.seek(entry.begin)
        got = f.readinto(memoryview(data))
    if got != len(data):
        raise UsageError(f"{entry.file}: is truncated (tensor {name!r} is cut short)")
    array = data.view(DTYPES[entry.dtype]).reshape(entry.shape)
    if entry.dtype == "BF16":
        return bf16_to_float32(array)
    return array.astype(np.float32, copy=False) if entry.dtype in FLOATS else array


def _index_files(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"{index}: is not a safetensors index (JSON with a weight_map)") from None
    for name in files:
        if not isinstance(name, str) or "/" in name or not (index.parent / name).is_file():
            raise UsageError(f"{index}: names {name!r}, which is not a file in {index.parent}")
    return [index.parent / name for name in files]


def read_header(path: Path) -> dict[str, Entry]:
    """A safetensors file's tensors (the header only), checked against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise UsageError(f"{path}: is truncated (no safetensors header)")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise UsageError(
                f"{path}: is truncated or no safetensors file (header of {length} bytes)"
            )
        try:
            header = json.loads(f.read(length).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise UsageError(f"{path}: its safetensors header is no JSON") from None
    if not isinstance(header, dict):
        raise UsageError(f"{path}: its safetensors header is no JSON object")
    entries, start = {}, 8 + length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = info["dtype"], tuple(int(n) for n in info["shape"])
            begin, end = (int(n) for n in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise UsageError(
                f"{path}: tensor {name!r} has no dtype, shape and data_offsets"
            ) from None
        if dtype not in DTYPES:
            raise UsageError(f"{path}: tensor {name!r} has dtype {dtype}, which dtcli cannot read")
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
        if end - begin != want:
            raise UsageError(
                f"{path}: tensor {name!r} has {end - begin} bytes, its shape needs {want}"
            )
        if start + end > size:
            raise UsageError(
                f"{path}: is truncated ({size} bytes; tensor {name!r} ends at byte {start + end})"
            )
        entries[name] = Entry(path, dtype, shape, start + begin, start + end)
    return entries


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (NaN kept a NaN)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _encoded(array: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return float32_to_bf16(array).tobytes()
    return np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()


def write_model(
    folder: Path,
    tensors: list[tuple[str, tuple[int, ...]]],
    produce: Callable[[str], np.ndarray],
    dtype: str = "F32",
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[Path]:
    """Write `tensors` (name, shape), in this order, as model.safetensors, or as shards with an
    index where they exceed `max_shard_bytes`; `produce(name)` gives each one's values when its
    turn comes, so only one tensor is held at a time. Returns the files written."""
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    sizes = [int(np.prod(shape, dtype=np.int64)) * itemsize for _, shape in tensors]
    shards: list[list[int]] = [[]]
    for i, size in enumerate(sizes):
        if shards[-1] and sum(sizes[j] for j in shards[-1]) + size > max_shard_bytes:
            shards.append([])
        shards[-1].append(i)
    names = (
        [SINGLE]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    written = []
    for name, shard in zip(names, shards):
        chosen = [(tensors[i][0], tensors[i][1], sizes[i]) for i in shard]
        written.append(write_file(folder / name, chosen, produce, dtype))
    if len(shards) > 1:
        weight_map = {tensors[i][0]: names[k] for k, shard in enumerate(shards) for i in shard}
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
        (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        written.append(folder / INDEX)
    return written


def write_file(
    path: Path,
    tensors: Iterable[tuple[str, tuple[int, ...], int]],
    produce: Callable[[str], np.ndarray],
    dtype: str,
) -> Path:
    """One safetensors file of `tensors` (name, shape, bytes), in this order, each made by
    `produce(name)` when its turn comes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset, order = 0, []
    for name, shape, size in tensors:
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
        order.append((name, shape))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in order:
            array = produce(name)
            if tuple(array.shape) != tuple(shape):
                raise RuntimeError(f"tensor {name} has shape {array.shape}, expected {shape}")
            f.write(_encoded(array, dtype))
    return path
