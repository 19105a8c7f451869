"""source text: byte-level language-model windows (one token per byte) of a file, a folder or a
glob of files, the Python standard library's sources, or a TFDS text data set."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dtcli.data import tfds as tfds_source
from dtcli.data.base import Dataset, TextSplit
from dtcli.errors import UsageError, one_line
from dtcli.recipe import BYTE_VOCAB, DataConfig


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    return (int(cfg.context or 1),), BYTE_VOCAB


def _text_files(pattern: str, key: str) -> list[Path]:
    """A file, every file under a folder (sorted), or a glob's files (sorted)."""
    import glob

    path = Path(pattern).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise UsageError(f"recipe key '{key}': folder {pattern!r} holds no files")
        return files
    files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    if not files:
        raise UsageError(f"recipe key '{key}': no file, folder or glob match at {pattern!r}")
    return files


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


def load(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    """Byte-level language-model windows: training windows start at every byte, evaluation
    windows tile the evaluation bytes without overlap (each token predicted once)."""
    context = int(cfg.context or 1)
    if cfg.path is None and cfg.name != "digits":
        return _tfds_text(cfg, context)
    if cfg.path is None:
        files, what = stdlib_sources(), "the Python standard library's sources"
        if not files:
            raise UsageError("recipe key 'data.path': this Python has no standard library sources")
    else:
        files = _text_files(cfg.path, "data.path")
        what = files[0].name if len(files) == 1 else f"{len(files)} files in {cfg.path}"
    tokens = _read_tokens(files, "data.path")
    if cfg.eval_path is not None:
        train, evaluate = (
            tokens,
            _read_tokens(_text_files(cfg.eval_path, "data.eval_path"), "data.eval_path"),
        )
    else:
        cut = int(len(tokens) * (1 - cfg.eval_fraction))
        train, evaluate = tokens[:cut], tokens[cut:]
    # Without eval_path the evaluation bytes are the end of data.path's: eval_fraction's.
    keys = ("data.path", "data.eval_path" if cfg.eval_path is not None else "data.eval_fraction")
    return _text_dataset(context, train, evaluate, what, keys)


def _text_dataset(
    context: int, train: np.ndarray, evaluate: np.ndarray, what: str, keys: tuple[str, str]
) -> Dataset:
    """Training and evaluation tokens -> windows, refusing a part shorter than one window
    (naming `keys`: the recipe keys that gave the training and the evaluation tokens)."""
    for key, part, name in zip(keys, (train, evaluate), ("training", "evaluation")):
        if len(part) < context + 1:
            raise UsageError(
                f"recipe key '{key}': the {name} text has {len(part)} bytes, fewer than one "
                f"window of data.context + 1 = {context + 1}"
            )
    return Dataset(
        _windows(train, context, 1),
        _windows(evaluate, context, context),
        BYTE_VOCAB,
        f"text {what} ({len(train):,} train / {len(evaluate):,} eval bytes, byte tokens, "
        f"windows of {context})",
    )


def _tfds_text(cfg: DataConfig, context: int) -> Dataset:
    """A TFDS text data set by name (tiny_shakespeare): the UTF-8 bytes of every example's text
    feature in data.train_split and data.eval_split (e.g. "validation+test"), as byte tokens."""
    import tensorflow_datasets as tfds

    builder = tfds_source.builder(cfg)
    texts = [k for k, f in builder.info.features.items() if isinstance(f, tfds.features.Text)]
    if not texts:
        raise UsageError(
            f"recipe key 'data.name': TFDS {cfg.name!r} has no text feature (source text reads "
            "text; an image data set is source tfds)"
        )
    tfds_source.download(builder, cfg)

    def read(split: str, key: str) -> np.ndarray:
        records = tfds_source.records(cfg, split, key, supervised=False)
        try:
            chunks = [bytes(r[texts[0]]) for r in tfds.as_numpy(records)]
        except Exception as exc:  # noqa: BLE001 - TFDS/tf.data read errors, in one line
            raise UsageError(
                f"recipe key 'data.{key}': reading TFDS {cfg.name!r} {split!r} failed "
                f"({one_line(exc, named=True)})"
            ) from None
        return np.frombuffer(b"".join(chunks), np.uint8)

    train = read(cfg.train_split, "train_split")
    evaluate = read(cfg.eval_split, "eval_split")
    what = f"TFDS {cfg.name} {cfg.train_split} / {cfg.eval_split}"
    keys = ("data.train_split", "data.eval_split")
    return _text_dataset(context, train, evaluate, what, keys)
