"""source tokens: language-model windows streamed from the token shards `dtcli prepare-text`
wrote (data.path: its folder), never the whole corpus in memory.

The folder holds `index.json` (FORMAT: the token dtype, the vocabulary, each split's shards and
their token counts, the text's documents and bytes), `tokenizer.json`, and per split shard files
of raw little-endian token ids (`train-00000.bin`, ..., `eval-00000.bin`), all but each split's
last holding exactly `shard_tokens` ids; documents are separated by the end-of-document token.

Windows of data.context + 1 tokens lie inside one shard. An evaluation window starts every
`context` tokens from the shard's start (each token predicted once). A training epoch reads
each shard from a seeded offset in [0, context) (so epochs see different windows), its shards
permuted and read 4 at a time, then a seeded shuffle buffer (data.shuffle_buffer): the order is
a pure function of (seed, epoch), and a resume skips to its position in it. Client groups read
disjoint shards where there are as many as groups (else every n-th window).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dtcli import storage
from dtcli.data import streams
from dtcli.data import tokenizer as tokenizer_lib
from dtcli.data.base import Dataset, Stream, empty_like
from dtcli.data.tokenizer import Tokenizer
from dtcli.errors import UsageError
from dtcli.recipe import DataConfig

INDEX = "index.json"
TOKENIZER = "tokenizer.json"
FORMAT = "dtcli-tokens-1"
SPLITS = ("train", "eval")
KEY = "recipe key 'data.path'"


def shard_name(split: str, i: int) -> str:
    return f"{split}-{i:05d}.bin"


def write_index(folder: Path, index: dict[str, Any]) -> None:
    """index.json, written last by prepare-text: a folder without it is not ready."""
    storage.write_atomic(storage.as_path(folder) / INDEX, json.dumps(index, indent=1) + "\n")


def _check_folder(folder: str, named: str) -> None:
    """`folder` is there and is a folder: what it is not, said before any file in it is read
    (a missing folder read as "holds no index.json")."""
    where = storage.as_path(folder)
    try:
        exists, is_dir = where.exists(), where.is_dir()
    except OSError:  # a file system that cannot be reached: reading the index says why
        return
    expected = "expected the folder `dtcli prepare-text` wrote"
    if not exists:
        raise UsageError(f"{named}: {folder!r} does not exist ({expected})")
    if not is_dir:
        raise UsageError(f"{named}: {folder!r} is a file, not a folder ({expected})")


def read_index(folder: str, named: str = KEY) -> dict[str, Any]:
    """A prepare-text folder's index, checked to be one."""
    _check_folder(folder, named)
    path = storage.as_path(folder) / INDEX
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"{named}: {folder!r} holds no {INDEX} (expected a folder `dtcli prepare-text` "
            "wrote, and finished)"
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{named}: cannot read {str(path)!r} ({exc})") from None
    if (
        not isinstance(index, dict)
        or index.get("format") != FORMAT
        or index.get("dtype") not in ("uint16", "uint32")
    ):
        raise UsageError(f"{named}: {str(path)!r} is not a {FORMAT} index")
    return index


def shards_tokenizer(folder: str) -> Tokenizer:
    """The tokenizer the shards at `folder` were made with."""
    read_index(folder)  # a folder that is none of prepare-text's says so before its tokenizer
    return tokenizer_lib.load(str(storage.as_path(folder) / TOKENIZER), KEY)


def tokenizer(cfg: DataConfig, saved: Path | None = None) -> Tokenizer:
    """The run's saved tokenizer, else the shards' (data.path may be gone once it trained)."""
    found = tokenizer_lib.read_saved(saved)
    return found if found is not None else shards_tokenizer(cfg.path)


def describe(cfg: DataConfig, saved: Path | None = None) -> tuple[tuple[int, ...], int]:
    return (int(cfg.context or 1),), tokenizer_lib.model_vocab(tokenizer(cfg, saved).vocab_size)


def train_windows(n: int, context: int) -> int:
    """Training windows of a shard of `n` tokens read from any offset below `context`: each
    reads its `context` tokens and the next record's first (hence the 2 records spare)."""
    return max((n + 1) // context - 2, 0)


def eval_windows(n: int, context: int) -> int:
    """Evaluation windows of a shard of `n` tokens, from its start: each predicts `context`."""
    return max(n // context - 1, 0)


def load(cfg: DataConfig, split_names: tuple[str, ...], saved: Path | None = None) -> Dataset:
    index = read_index(cfg.path)
    tok = shards_tokenizer(cfg.path)
    found = tokenizer_lib.read_saved(saved)
    if found is not None and json.loads(found.to_json()) != json.loads(tok.to_json()):
        raise UsageError(
            f"{KEY}: its shards were made with another tokenizer than this run's ({saved}); "
            "prepare the text again with --tokenizer RUN_DIR"
        )
    if tok.vocab_size != index["vocab_size"]:
        raise UsageError(
            f"{KEY}: {INDEX} says {index['vocab_size']} ids, its {TOKENIZER} {tok.vocab_size}"
        )
    vocab = tokenizer_lib.model_vocab(tok.vocab_size)
    evaluate = _stream(cfg, index, "eval", vocab, tok)
    train = _stream(cfg, index, "train", vocab) if "train" in split_names else empty_like(evaluate)
    info = index["splits"]
    return Dataset(
        train,
        evaluate,
        vocab,
        f"token shards {cfg.path} ({info['train']['tokens']:,} train / "
        f"{info['eval']['tokens']:,} eval tokens in {len(train.files)} + {len(evaluate.files)} "
        f"shards, {tok.description}, windows of {cfg.context})",
        tok,
    )


def _stream(
    cfg: DataConfig, index: dict, split: str, vocab: int, tok: Tokenizer | None = None
) -> Stream:
    """A split's shards as a Stream (`tok`: count the text bytes of its targets, eval_bpb)."""
    context = int(cfg.context or 1)
    folder = storage.as_path(cfg.path)
    shards = index["splits"][split]["shards"]
    files = tuple(str(folder / name) for name, _ in shards)
    sizes = tuple(int(n) for _, n in shards)
    _check_sizes(files, sizes, np.dtype(index["dtype"]).itemsize)
    windows = train_windows if split == "train" else eval_windows
    counts = tuple(windows(n, context) for n in sizes)
    if not sum(counts):
        raise UsageError(
            f"{KEY}: the {split} shards hold {sum(sizes)} tokens, not one window of "
            f"data.context + 1 = {context + 1} in any shard"
        )
    s = Stream(
        "tokens",
        files,
        counts,
        (),
        (context,),
        cfg,
        vocab,
        where="data.path",
        x_dtype="int32",
        y_shape=(context,),
        file_tokens=sizes,
        token_dtype=index["dtype"],
        target_bytes=None if tok is None else _target_bytes(files, counts, context, tok, index),
    )
    streams.check_first(s, examples, read_error)
    return s


def _check_sizes(files: tuple[str, ...], sizes: tuple[int, ...], width: int) -> None:
    """Each shard holds the tokens the index says (a shard cut short or replaced is refused)."""
    for file, n in zip(files, sizes):
        try:
            size = storage.as_path(file).stat().st_size
        except OSError as exc:
            raise UsageError(f"{KEY}: cannot read {file} ({exc.strerror or exc})") from None
        if size != n * width:
            raise UsageError(
                f"{KEY}: {file} holds {size} bytes, {INDEX} says {n} tokens of {width} bytes"
            )


def _target_bytes(
    files: tuple[str, ...], counts: tuple[int, ...], context: int, tok: Tokenizer, index: dict
) -> int:
    """The text bytes of every evaluation target: tokens 1 .. windows x context of each shard,
    read a million at a time."""
    dtype = np.dtype(index["dtype"])
    total = 0
    for file, windows in zip(files, counts):
        with storage.as_path(file).open("rb") as f:
            f.seek(dtype.itemsize)  # token 0 is never a target
            left = windows * context
            while left:
                chunk = np.frombuffer(f.read(min(left, 1 << 20) * dtype.itemsize), dtype)
                total += tok.target_bytes(chunk)
                left -= len(chunk)
    return total


def _file_shares(stream: Stream, groups: int) -> list[list[int]] | None:
    """Shards dealt to groups (None: too few shards, every group deals out windows)."""
    if len(stream.files) >= groups:
        return [list(range(g, len(stream.files), groups)) for g in range(groups)]
    return None


def share_counts(stream: Stream, groups: int) -> list[int]:
    shares = _file_shares(stream, groups)
    if shares is None:
        return streams.example_shares(stream, groups)
    return [sum(stream.counts[i] for i in share) for share in shares]


def examples(stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int) -> Any:
    """(x, y) int32 windows of this group's shards (all of them if too few), permuted, each from
    its seeded offset, then a seeded shuffle buffer; unshuffled: in order, from offset 0."""
    import tensorflow as tf

    context = int(stream.cfg.context or 1)
    width = np.dtype(stream.token_dtype).itemsize
    shares = _file_shares(stream, groups)
    mine = np.array(shares[group] if shares is not None else range(len(stream.files)), int)
    if shuffle:
        mine = mine[np.random.default_rng([seed, epoch]).permutation(len(mine))]
    record = context * width
    heads, feet = [], []
    for i in mine:
        # Each shard's offset: a pure function of (seed, epoch, shard).
        offset = int(np.random.default_rng([seed, epoch, i]).integers(context)) if shuffle else 0
        heads.append(offset * width)
        feet.append((stream.file_tokens[i] * width - offset * width) % record)
    counts = [stream.counts[i] for i in mine]
    files = [stream.files[i] for i in mine]
    slices = tf.data.Dataset.from_tensor_slices(
        (files, np.array(heads, np.int64), np.array(feet, np.int64), np.array(counts, np.int64))
    )
    # DecodeRaw has no uint32: 32-bit ids read as int32 are the same below 2**31.
    decode = tf.int32 if width == 4 else tf.uint16

    def windows(file: Any, head: Any, foot: Any, n: Any) -> Any:
        records = tf.data.FixedLengthRecordDataset(file, record, head, foot)
        pairs = tf.data.Dataset.zip((records.take(n), records.skip(1).take(n)))
        return pairs.map(lambda a, b: _window(a, b, decode))

    ds = slices.interleave(
        windows,
        cycle_length=min(len(files), 4) if shuffle else 1,
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if shuffle:
        group_seed = streams.shuffle_seed(seed, epoch, group if shares else 0)
        ds = ds.shuffle(stream.cfg.shuffle_buffer, seed=group_seed)
    if shares is None and groups > 1:
        ds = ds.shard(groups, group)  # every group reads the same order, keeps its n-th
    return ds


def _window(record: Any, following: Any, decode: Any) -> tuple[Any, Any]:
    """A record of `context` ids and the next record: x the record, y x shifted by one."""
    import tensorflow as tf

    x = tf.cast(tf.io.decode_raw(record, decode), tf.int32)
    after = tf.cast(tf.io.decode_raw(following, decode), tf.int32)
    return x, tf.concat([x[1:], after[:1]], axis=0)


def read_error(stream: Stream, text: str) -> str:
    return streams.failed(stream, text)
