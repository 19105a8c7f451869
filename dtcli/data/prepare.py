"""`dtcli prepare-text`: text files (a file, a folder, a glob) or a TFDS text data set tokenized
into the token shards source tokens streams (their format: dtcli.data.tokens).

Memory stays flat whatever the text's size: files are read a megabyte at a time, encoded in
pieces (Tokenizer.encode_blocks: bytes one token each, whatever they are; text for other
tokenizers, in dtcli.data.tokenizer.line_pieces) and written out as they come. Each file (or
TFDS example) is a document; the end-of-document token separates documents (a tokenizer
without one gets `<|endoftext|>` added). The evaluation split is the last --eval-fraction of the
files' bytes, cut at a line's end (a TFDS data set's splits are its own); a BPE (`--tokenizer
bpe:N`) is trained on the training split only. A failure, Ctrl-C or SIGTERM leaves nothing
behind; index.json, written last, marks a finished folder.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtcli import storage, tfruntime
from dtcli.data import tokenizer as tokenizer_lib
from dtcli.data import tokens as tokens_lib
from dtcli.data.text import text_files, tfds_documents
from dtcli.data.tokenizer import Tokenizer
from dtcli.errors import UsageError, cleaned_up_on_stop
from dtcli.recipe import DataConfig
from dtcli.recipe.data_checks import bpe_size

# Token ids per shard file (2 MiB of uint16): enough shards for clients to share, few enough
# files for a file system.
SHARD_TOKENS = 1 << 20
BLOCK = 1 << 20  # bytes read from a file at a time
TFDS_PREFIX = "tfds:"


@dataclass(frozen=True)
class Document:
    """A file's bytes [start, stop), or a TFDS example's text."""

    file: Path | None = None
    start: int = 0
    stop: int = 0
    text: bytes = b""

    def size(self) -> int:
        return self.stop - self.start if self.file is not None else len(self.text)

    def blocks(self) -> Iterator[bytes]:
        """The document's bytes, a block at a time."""
        if self.file is None:
            yield self.text
            return
        with open(self.file, "rb") as f:
            f.seek(self.start)
            left = self.stop - self.start
            while left:
                block = f.read(min(BLOCK, left))
                if not block:
                    break
                left -= len(block)
                yield block


@dataclass(frozen=True)
class TfdsOptions:
    """Where a TFDS text data set (SOURCE tfds:NAME) is and which splits are which."""

    train_split: str = "train"
    eval_split: str = "test"
    data_dir: str | None = None
    download: bool = False


def prepare_text(
    source: str,
    tokenizer: str,
    out: Path,
    eval_fraction: float = 0.1,
    shard_tokens: int = SHARD_TOKENS,
    tfds: TfdsOptions = TfdsOptions(),
) -> dict[str, Any]:
    """Tokenize `source` into shards in the new (or empty) folder `out`; returns its index.
    `tokenizer`: bytes, bpe:N (trained on the training split), or a tokenizer.json (or a
    folder holding one: a run directory, a hub model's)."""
    _check_options(eval_fraction, shard_tokens)
    # Read before any other work (the split, a TFDS read, a folder made): None for bpe:N.
    given = tokenizer_lib.from_spec(tokenizer, "--tokenizer")
    if storage.is_remote(out):
        raise UsageError(f"--out {str(out)!r}: prepare-text writes a local folder; copy it after")
    out = Path(out)
    made = _claim(out)
    quiet = (
        tfruntime.quiet_native_logs if source.startswith(TFDS_PREFIX) else contextlib.nullcontext
    )
    with quiet(), _removed_unless_done(out, made):
        splits = _documents(source, eval_fraction, tfds)
        tok = tokenizer_lib.with_eot(given or _trained_bpe(tokenizer, splits["train"]))
        storage.write_atomic(out / tokens_lib.TOKENIZER, tok.to_json())
        dtype = tokenizer_lib.token_dtype(tok.vocab_size)
        index: dict[str, Any] = {
            "format": tokens_lib.FORMAT,
            "dtype": dtype.name,
            "vocab_size": tok.vocab_size,
            "eot": tok.eot,
            "shard_tokens": shard_tokens,
            "source": source,
            "tokenizer": tok.description,
            "splits": {},
        }
        for split, docs in splits.items():
            index["splits"][split] = _write_split(docs, tok, out, split, dtype, shard_tokens)
        tokens_lib.write_index(out, index)
    return index


def _check_options(eval_fraction: float, shard_tokens: int) -> None:
    if not 0 < eval_fraction < 1:
        raise UsageError(f"--eval-fraction {eval_fraction}: expected a number in (0, 1)")
    if shard_tokens < 2:
        raise UsageError(f"--shard-tokens {shard_tokens}: expected an integer >= 2")


def _claim(out: Path) -> bool:
    """Make `out` (True) or take it empty (False); anything in it is refused."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r}: is a file, expected a folder for the shards")
    if out.is_dir():
        names = {p.name for p in out.iterdir()}
        if tokens_lib.INDEX in names:
            raise UsageError(
                f"--out {str(out)!r}: holds a finished prepare-text output; give a new or empty "
                "folder (or remove that one)"
            )
        if any(n == tokens_lib.TOKENIZER or _SHARD.fullmatch(n) for n in names):
            raise UsageError(
                f"--out {str(out)!r}: holds an incomplete prepare-text output (no "
                f"{tokens_lib.INDEX}: a preparation that was stopped); remove the folder and run "
                "again"
            )
        if names:
            raise UsageError(f"--out {str(out)!r}: the folder exists and is not empty")
        return False
    try:
        out.mkdir(parents=True)
    except OSError as exc:
        raise UsageError(f"--out {str(out)!r}: cannot create it ({exc.strerror})") from None
    return True


_SHARD = re.compile(r"(train|eval)-\d{5}\.bin")


@contextlib.contextmanager
def _removed_unless_done(out: Path, made: bool) -> Iterator[None]:
    """A preparation that fails or is stopped leaves nothing (_remove). SIGTERM (a scheduler's
    stop) stops it as Ctrl-C does, as an exception (errors.Preempted: one line, exit 143)."""
    stopped = (
        f"preempted (SIGTERM); prepare-text stopped and removed what it wrote to --out {str(out)!r}"
    )
    with cleaned_up_on_stop(stopped, lambda: _remove(out, made)):
        yield


def _remove(out: Path, made: bool) -> None:
    """A failed preparation leaves nothing: the folder it made, or its files in an empty one."""
    if made:
        storage.rmtree(out, ignore_errors=True)
        return
    for path in out.iterdir():
        with contextlib.suppress(OSError):
            path.unlink()


def _documents(source: str, eval_fraction: float, tfds: TfdsOptions) -> dict[str, list]:
    """The training and evaluation documents of SOURCE."""
    if source.startswith(TFDS_PREFIX):
        cfg = DataConfig(
            source="text",
            name=source[len(TFDS_PREFIX) :],
            train_split=tfds.train_split,
            eval_split=tfds.eval_split,
            data_dir=tfds.data_dir,
            download=tfds.download,
        )
        return {
            split: _TfdsDocuments(cfg, getattr(cfg, f"{split}_split"), f"{split}_split")
            for split in ("train", "eval")
        }
    return _split_files(text_files(source, "SOURCE"), eval_fraction)


class _TfdsDocuments:
    """A TFDS split's examples as Documents, read anew on each pass (a BPE trains on one)."""

    def __init__(self, cfg: DataConfig, split: str, key: str):
        self.cfg, self.split, self.key = cfg, split, key

    def __iter__(self) -> Iterator[Document]:
        try:
            for text in tfds_documents(self.cfg, self.split, self.key):
                yield Document(text=text)
        except UsageError as exc:
            raise UsageError(_as_options(str(exc))) from None


# The TFDS helpers name the recipe keys of source text; prepare-text has options instead.
_OPTION_NAMES = (
    ("recipe key 'data.name'", "SOURCE"),
    ("recipe key 'data.train_split'", "--train-split"),
    ("recipe key 'data.eval_split'", "--eval-split"),
    ("recipe key 'data.download'", "--download"),
    ("data.download is false", "--download is not given"),
    ("set data.data_dir=DIR, or --set data.download=true", "give --data-dir DIR, or --download"),
    ("set data.data_dir=DIR", "give --data-dir DIR"),
    ("(source text reads text; an image data set is source tfds)", "(prepare-text reads text)"),
)


def _as_options(message: str) -> str:
    for key, option in _OPTION_NAMES:
        message = message.replace(key, option)
    return message


def _split_files(files: list[Path], eval_fraction: float) -> dict[str, list[Document]]:
    """Every file a document; the evaluation split is the last `eval_fraction` of their bytes,
    the file it cuts cut at the end of a line."""
    sizes = [f.stat().st_size for f in files]
    total = sum(sizes)
    if not total:
        empty = f"{files[0]} is empty" if len(files) == 1 else f"its {len(files):,} files are empty"
        raise UsageError(f"SOURCE: {empty} (expected text)")
    cut = int(total * (1 - eval_fraction))
    train: list[Document] = []
    evaluate: list[Document] = []
    offset = 0
    cut_file: tuple = ()  # the file the cut moved to its end: where the split failed if it did
    for file, size in zip(files, sizes):
        if offset + size <= cut:
            train.append(Document(file, 0, size))
        elif offset >= cut:
            evaluate.append(Document(file, 0, size))
        else:
            at = _line_end(file, cut - offset, size)
            train += [Document(file, 0, at)] if at else []
            evaluate += [Document(file, at, size)] if at < size else []
            cut_file = (file, cut - offset, offset, size) if at == size else ()
        offset += size
    if not any(d.size() for d in train):
        raise UsageError(
            f"SOURCE: its training split is empty: {total:,} bytes of text, and --eval-fraction "
            f"{eval_fraction} leaves none to train on"
        )
    if not any(d.size() for d in evaluate):
        raise _no_evaluation(*cut_file, total, eval_fraction)
    return {"train": train, "eval": evaluate}


def _line_end(file: Path, at: int, size: int) -> int:
    """The position after the first newline from `at` on (the file's end if none)."""
    with open(file, "rb") as f:
        f.seek(at)
        while block := f.read(BLOCK):
            found = block.find(b"\n")
            if found >= 0:
                return at + found + 1
            at += len(block)
    return size


def _no_evaluation(
    file: Path, at: int, offset: int, size: int, total: int, eval_fraction: float
) -> UsageError:
    """The split leaves no evaluation text: `file` (the last with any, at `offset` of `total`
    bytes) has no line break from byte `at` to its last one. Says why and what would do."""
    last = _last_break(file, size)
    head = (
        f"SOURCE: its evaluation split is empty: --eval-fraction {eval_fraction} cuts {file} at "
        f"byte {at:,}, the cut moves to a line's end, and the file has no line break"
        f"{' after that' if last >= 0 else ''}"
    )
    boundary = offset + last if last >= 0 else offset  # a cut before it leaves an evaluation
    fraction = math.ceil((1 - boundary / total) * 100) / 100
    larger = f"--eval-fraction {fraction:g} or more, " if boundary > 0 and fraction < 1 else ""
    return UsageError(
        f"{head}; give {larger}text in lines, or several files (the split may fall between two)"
    )


def _last_break(file: Path, size: int) -> int:
    """Where the last line break before the file's last byte is (-1: none)."""
    last, pos = -1, 0
    with open(file, "rb") as f:
        while pos < size - 1 and (block := f.read(min(BLOCK, size - 1 - pos))):
            found = block.rfind(b"\n")
            last = pos + found if found >= 0 else last
            pos += len(block)
    return last


def _trained_bpe(spec: str, train: Any) -> tokenizer_lib.Tokenizer:
    """The BPE of `spec` (bpe:N) trained on the training split's documents."""
    size = bpe_size(spec, "--tokenizer")
    texts = (p for doc in train for p in tokenizer_lib.text_pieces(doc.blocks()))
    return tokenizer_lib.train_bpe(texts, size, "the training split")


def _write_split(
    docs: Any, tok: Tokenizer, out: Path, split: str, dtype: np.dtype, shard_tokens: int
) -> dict[str, Any]:
    """A split's documents as shards, the end-of-document token between two; its index entry."""
    writer = _ShardWriter(out, split, dtype, shard_tokens)
    eot = np.array([tok.eot], dtype)
    count = size = 0
    for doc in docs:
        if count:
            writer.write(eot)
        for ids in tok.encode_blocks(doc.blocks()):
            writer.write(ids)
        count += 1
        size += doc.size()
    shards = writer.close()
    return {
        "shards": shards,
        "documents": count,
        "bytes": size,
        "tokens": sum(n for _, n in shards),
    }


class _ShardWriter:
    """Token ids written out as they come, `shard_tokens` to a file."""

    def __init__(self, out: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.out, self.split, self.dtype, self.limit = out, split, dtype, shard_tokens
        self.shards: list[list] = []
        self.file: Any = None

    def write(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, self.dtype)
        while len(ids):
            if self.file is None or self.shards[-1][1] == self.limit:
                self._next()
            room = self.limit - self.shards[-1][1]
            self.file.write(ids[:room].tobytes())
            self.shards[-1][1] += len(ids[:room])
            ids = ids[room:]

    def _next(self) -> None:
        if self.file is not None:
            self.file.close()
        name = tokens_lib.shard_name(self.split, len(self.shards))
        self.file = (self.out / name).open("wb")
        self.shards.append([name, 0])

    def close(self) -> list[list]:
        if self.file is not None:
            self.file.close()
        return self.shards
