"""source text: language-model windows of a file, a folder or a glob of files, the Python
standard library's sources, or a TFDS text data set, in the recipe's tokens: bytes (one token
per byte, the default), a tokenizer.json, or a byte-level BPE trained on the training text
(dtcli.data.tokenizer). Held in memory: text too large for it goes through `dtcli prepare-text`
and source tokens."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dtcli.data import tfds as tfds_source
from dtcli.data import tokenizer as tokenizer_lib
from dtcli.data.base import Dataset, TextSplit
from dtcli.data.tokenizer import ByteTokenizer, Tokenizer
from dtcli.errors import UsageError, one_line
from dtcli.recipe import DataConfig, TrainTokenizerConfig

TOKENIZER_KEY = "recipe key 'data.tokenizer'"


def describe(cfg: DataConfig, saved: Path | None = None) -> tuple[tuple[int, ...], int]:
    """The window and the model's vocabulary (`_vocab`). A BPE to train is trained here (once per
    process and text, see `_trained_bpe`): its size is the size it reaches, not the one asked."""
    return (int(cfg.context or 1),), _vocab(tokenizer(cfg, saved))


def _vocab(tok: Tokenizer) -> int:
    """The model's vocabulary: the tokenizer's ids rounded up (tokenizer.model_vocab), a capped
    BPE's (a text with fewer pairs than `bpe:N` asks) the size it reached, as prepare-text's
    shards and the tokenizer.json a run saves have it: the same recipe gives one model shape
    whichever of them it is built from."""
    return tokenizer_lib.model_vocab(tok.vocab_size)


def tokenizer(
    cfg: DataConfig, saved: Path | None = None, train_text: bytes | None = None
) -> Tokenizer:
    """The run's tokenizer: the one it saved at `saved`, else the recipe's: bytes, a
    tokenizer.json, or a BPE trained on the training text (`train_text`, read here where not
    given: training is deterministic, so it is the tokenizer the run trained)."""
    found = tokenizer_lib.read_saved(saved)
    if found is not None:
        return found
    spec = cfg.tokenizer
    if spec is None:
        return ByteTokenizer()
    if isinstance(spec, str):  # bpe:N is a TrainTokenizerConfig since the recipe loaded
        return tokenizer_lib.from_spec(spec, TOKENIZER_KEY)
    if train_text is None:
        train_text = _byte_parts(cfg, whole_chars=True)[0].tobytes()
    return _trained_bpe(train_text, spec.vocab_size)


@functools.lru_cache(maxsize=2)
def _trained_bpe(train_text: bytes, vocab_size: int) -> Tokenizer:
    """The BPE of `vocab_size` trained on `train_text`, kept for the next call with the same text:
    `describe` (the memory check, plan) and `load` of one run train it once."""
    text = train_text.decode("utf-8", errors="replace")
    return tokenizer_lib.train_bpe(tokenizer_lib.line_pieces([text]), vocab_size)


def text_files(pattern: str, named: str) -> list[Path]:
    """A file, every file under a folder (sorted), or a glob's files (sorted). `named`: how
    errors name the pattern ("recipe key 'data.path'", "SOURCE")."""
    import glob

    path = Path(pattern).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise UsageError(f"{named}: folder {pattern!r} holds no files")
        return files
    if path.exists():  # neither a file nor a folder
        raise UsageError(f"{named}: {pattern!r} is a {_kind(path)}, expected a file or a folder")
    matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
    files = [p for p in matches if p.is_file()]
    if not files and matches:
        kinds: dict[str, list[str]] = {}
        for match in matches:
            kinds.setdefault(_kind(match), []).append(str(match))
        found = "; ".join(
            f"{len(paths):,} {kind}{'s' * (len(paths) > 1)} ({', '.join(paths[:3])}"
            f"{', ...' if len(paths) > 3 else ''})"
            for kind, paths in kinds.items()
        )
        raise UsageError(
            f"{named}: {pattern!r} matches no file, only {found}; a glob reads the files it "
            "matches (give a folder itself to read every file under it)"
        )
    if not files:
        raise UsageError(f"{named}: no file, folder or glob match at {pattern!r}")
    return files


def _kind(path: Path) -> str:
    """What a path that is not a regular file is, in a word or two."""
    import stat

    if path.is_dir():
        return "folder"
    try:
        mode = path.stat().st_mode
    except OSError:
        return "broken link"
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"))
    return next((name for test, name in kinds if test(mode)), "device file")


def stdlib_sources() -> list[Path]:
    """The text corpus every Python installation carries: its standard library's top-level
    modules' source files, sorted by name."""
    import sysconfig

    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _read_tokens(files: list[Path], key: str) -> np.ndarray:
    """The files' bytes back to back as uint8 tokens (one file: memory-mapped, not read)."""
    try:
        if len(files) == 1:
            if files[0].stat().st_size == 0:
                raise UsageError(f"recipe key '{key}': {files[0]} is empty")
            return np.memmap(files[0], dtype=np.uint8, mode="r")
        return np.concatenate([np.fromfile(f, dtype=np.uint8) for f in files])
    except OSError as exc:
        raise UsageError(
            f"recipe key '{key}': cannot read {exc.filename} ({exc.strerror})"
        ) from None


def _windows(tokens: np.ndarray, context: int, stride: int) -> TextSplit:
    view = np.lib.stride_tricks.sliding_window_view(tokens, context + 1)[::stride]
    return TextSplit(view[:, :-1], view[:, 1:], tokens)


Parts = tuple[np.ndarray, np.ndarray, str, tuple[str, str]]


def _byte_parts(cfg: DataConfig, whole_chars: bool = False) -> Parts:
    """(training bytes, evaluation bytes, what they are, the recipe keys that gave each).
    `whole_chars`: an eval_fraction cut moves to the next UTF-8 character's first byte (a
    tokenizer reads characters; bytes keep the exact cut)."""
    if cfg.path is None and cfg.name != "digits":
        return _tfds_parts(cfg)
    if cfg.path is None:
        files, what = stdlib_sources(), "the Python standard library's sources"
        if not files:
            raise UsageError("recipe key 'data.path': this Python has no standard library sources")
    else:
        files = text_files(cfg.path, "recipe key 'data.path'")
        what = files[0].name if len(files) == 1 else f"{len(files)} files in {cfg.path}"
    tokens = _read_tokens(files, "data.path")
    if cfg.eval_path is not None:
        files = text_files(cfg.eval_path, "recipe key 'data.eval_path'")
        return tokens, _read_tokens(files, "data.eval_path"), what, ("data.path", "data.eval_path")
    # Without eval_path the evaluation bytes are the end of data.path's: eval_fraction's.
    cut = int(len(tokens) * (1 - cfg.eval_fraction))
    while whole_chars and cut < len(tokens) and tokens[cut] & 0xC0 == 0x80:
        cut += 1  # a UTF-8 continuation byte
    return tokens[:cut], tokens[cut:], what, ("data.path", "data.eval_fraction")


def load(cfg: DataConfig, split_names: tuple[str, ...], saved: Path | None = None) -> Dataset:
    """Language-model windows: training windows start at every token, evaluation windows tile
    the evaluation tokens without overlap (each token predicted once)."""
    context = int(cfg.context or 1)
    tok = tokenizer_lib.read_saved(saved)
    if tok is None and not isinstance(cfg.tokenizer, TrainTokenizerConfig):
        tok = tokenizer(cfg)  # bytes (any byte tokens: those of prepare-text too) or a file
    train, evaluate, what, keys = _byte_parts(cfg, not isinstance(tok, ByteTokenizer))
    if not isinstance(tok, ByteTokenizer):  # else the bytes are the tokens, every one
        tok = tok or tokenizer(cfg, None, train.tobytes())
        train, evaluate = (tok.encode(part.tobytes()) for part in (train, evaluate))
    return _text_dataset(context, train, evaluate, what, keys, tok, _vocab(tok))


def _text_dataset(
    context: int,
    train: np.ndarray,
    evaluate: np.ndarray,
    what: str,
    keys: tuple[str, str],
    tok: Tokenizer,
    vocab: int,
) -> Dataset:
    """Training and evaluation tokens -> windows, refusing a part shorter than one window
    (naming `keys`: the recipe keys that gave the training and the evaluation tokens)."""
    unit = "bytes" if isinstance(tok, ByteTokenizer) else "tokens"
    for key, part, name in zip(keys, (train, evaluate), ("training", "evaluation")):
        if len(part) < context + 1:
            raise UsageError(
                f"recipe key '{key}': the {name} text has {len(part)} {unit}, fewer than one "
                f"window of data.context + 1 = {context + 1}"
            )
    held_out = _windows(evaluate, context, context)
    held_out = TextSplit(held_out.x, held_out.y, evaluate, tok.target_bytes(held_out.y))
    return Dataset(
        _windows(train, context, 1),
        held_out,
        vocab,
        f"text {what} ({len(train):,} train / {len(evaluate):,} eval {unit}, "
        f"{tok.description}, windows of {context})",
        tok,
    )


def _tfds_parts(cfg: DataConfig) -> Parts:
    """A TFDS text data set by name (tiny_shakespeare): the UTF-8 bytes of every example's text
    feature in data.train_split and data.eval_split (e.g. "validation+test")."""
    train = b"".join(tfds_documents(cfg, cfg.train_split, "train_split"))
    evaluate = b"".join(tfds_documents(cfg, cfg.eval_split, "eval_split"))
    what = f"TFDS {cfg.name} {cfg.train_split} / {cfg.eval_split}"
    keys = ("data.train_split", "data.eval_split")
    return np.frombuffer(train, np.uint8), np.frombuffer(evaluate, np.uint8), what, keys


def tfds_documents(cfg: DataConfig, split: str, key: str) -> Iterator[bytes]:
    """The UTF-8 text of each example of TFDS data set cfg.name's `split`, in TFDS' order
    (prepared first where data.download asks); `key`: the recipe key that gave the split."""
    import tensorflow_datasets as tfds

    builder = tfds_source.builder(cfg)
    texts = [k for k, f in builder.info.features.items() if isinstance(f, tfds.features.Text)]
    if not texts:
        raise UsageError(
            f"recipe key 'data.name': TFDS {cfg.name!r} has no text feature (source text reads "
            "text; an image data set is source tfds)"
        )
    tfds_source.download(builder, cfg)
    records = tfds_source.records(cfg, split, key, supervised=False)
    try:
        for record in tfds.as_numpy(records):
            yield bytes(record[texts[0]])
    except Exception as exc:  # noqa: BLE001 - TFDS/tf.data read errors, in one line
        raise UsageError(
            f"recipe key 'data.{key}': reading TFDS {cfg.name!r} {split!r} failed "
            f"({one_line(exc, named=True)})"
        ) from None
