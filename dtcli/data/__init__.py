"""Data sets: where examples come from, and their splits.

Small data sets (embedded, IDX files, synthetic) are read whole into host memory as numpy
(`Split`); large ones (TFRecord files, image folders, TFDS) are streamed through tf.data as they
train (`Stream`), never held whole. dtcli.pipeline batches both kinds the same way.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.recipe import BYTE_VOCAB, DataConfig


@dataclass(frozen=True)
class Split:
    x: np.ndarray  # float32, (N, *example_shape), scaled to [0, 1]
    y: np.ndarray  # int32, (N,)

    def __len__(self) -> int:
        return len(self.y)

    @property
    def example_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


@dataclass(frozen=True)
class TextSplit(Split):
    """Token windows of a byte string: x[i] the `context` tokens of window i, y[i] the same
    shifted by one (the next token at every position). x and y are views of `tokens` (a
    memory-mapped file where it is one file): a batch copies only its own windows."""

    tokens: np.ndarray  # uint8, one token per byte


@dataclass(frozen=True)
class Stream:
    """A split read from files as it trains.

    tfrecord: `files` are TFRecord files, `counts` the records in each; images: `files` are image
    files (one example each) and `labels` their classes; tfds: `files` is empty and `counts` holds
    the split's size (TFDS reads its own files)."""

    kind: str  # "tfrecord" | "images" | "tfds"
    files: tuple[str, ...]
    counts: tuple[int, ...]
    labels: tuple[int, ...]
    example_shape: tuple[int, ...]  # as the model sees one example
    cfg: DataConfig
    classes: int
    tfds_split: str = ""
    where: str = ""  # the recipe key the files came from, for errors

    def __len__(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Dataset:
    train: Split | Stream
    eval: Split | Stream
    num_classes: int
    description: str

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.eval.example_shape


def load(cfg: DataConfig, split_names: tuple[str, ...] = ("train", "eval")) -> Dataset:
    """Load the configured data set, scaled to [0, 1] and shaped for the model."""
    if cfg.source == "embedded":
        ds = _embedded(cfg)
    elif cfg.source == "idx":
        ds = _idx(cfg)
    elif cfg.source == "tfds":
        return _tfds(cfg, split_names)
    elif cfg.source == "tfrecord":
        return _tfrecord(cfg, split_names)
    elif cfg.source == "images":
        return _images(cfg, split_names)
    elif cfg.source == "text":
        return _text(cfg)
    else:
        ds = _synthetic(cfg)
    return Dataset(_shape(ds.train, cfg), _shape(ds.eval, cfg), ds.num_classes, ds.description)


def no_data(cfg: DataConfig) -> Dataset:
    """A data set of no examples with the shapes `cfg` gives (describe): a model needs them."""
    shape, classes = describe(cfg)
    empty = Split(np.zeros((0, *shape), np.float32), np.zeros(0, np.int32))
    return Dataset(empty, empty, classes, "none")


def check_batch_fits(cfg: DataConfig, dataset: Dataset) -> None:
    """Refuse a batch larger than the training split (every step would be mostly padding).

    The recipe check (recipe._check_data) catches this already where the training count is
    known without reading files (synthetic, embedded, ranges); this is for the rest, right after
    `load` with the train split (IDX files without a train_range, TFDS splits).
    """
    examples = len(dataset.train)
    if cfg.batch_size > examples:
        raise UsageError(
            f"recipe key 'data.batch_size': {cfg.batch_size} is more than the {examples} "
            f"training examples of {dataset.description}; use a batch of at most {examples}"
        )


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    """(input shape the model sees, class count) without loading the examples (for `dtcli plan`).

    Reads only headers and labels: IDX headers, TFDS' static feature info, the recipe itself.
    """
    if cfg.source == "embedded":
        _embedded_path(cfg)
        example, classes = (8, 8), 10
    elif cfg.source == "idx":
        folder = _idx_folder(cfg)
        images = [_find_idx(folder, p, "images") for p in ("train", "t10k")]
        labels = [_find_idx(folder, p, "labels") for p in ("train", "t10k")]
        header = _idx_header(next(p for p in images if p is not None))
        example = tuple(header[1:])
        classes = max(int(_read_labels(p).max()) + 1 for p in labels if p is not None)
    elif cfg.source == "tfds":
        info = _tfds_builder(cfg).info
        example = tuple(int(d) for d in info.features["image"].shape)
        classes = info.features["label"].num_classes
    elif cfg.source == "images":
        example, classes = tuple(cfg.shape), len(_class_folders(Path(cfg.path or ""), "path"))
    elif cfg.source == "text":
        return (int(cfg.context or 1),), BYTE_VOCAB
    else:
        example, classes = tuple(cfg.shape), cfg.classes
    if cfg.flatten:
        return (int(np.prod(example)),), classes
    return (example + (1,) if len(example) == 2 else example), classes


def _shape(split: Split, cfg: DataConfig) -> Split:
    x = split.x
    if cfg.flatten:
        x = x.reshape(len(x), -1)
    elif x.ndim == 3:  # (N, H, W) images get a channel dim for Conv2D
        x = x[..., None]
    return Split(np.ascontiguousarray(x, dtype=np.float32), split.y.astype(np.int32))


def _scale(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    return x.astype(np.float32)


def _ranges(n: int, cfg: DataConfig, where: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Default ranges when one array serves train and eval: first half trains, second evaluates."""
    train = cfg.train_range or (0, n // 2)
    evaluate = cfg.eval_range or (n // 2, n)
    for key, (lo, hi) in (("train_range", train), ("eval_range", evaluate)):
        if hi > n:
            raise UsageError(
                f"recipe key 'data.{key}': [{lo}, {hi}) is past the {n} examples of {where}"
            )
    if train[0] < evaluate[1] and evaluate[0] < train[1]:
        raise UsageError(
            f"recipe key 'data.eval_range': {list(evaluate)} overlaps "
            f"data.train_range {list(train)}"
        )
    return train, evaluate


def _embedded_path(cfg: DataConfig) -> Path:
    if cfg.name != "digits":
        raise UsageError(
            f"recipe key 'data.name': the embedded data set is 'digits', got {cfg.name!r}"
        )
    # The UCI "Optical Recognition of Handwritten Digits" test set (1797 examples, 8x8 values
    # 0..16, CC BY 4.0; Alpaydin & Kaynak 1998) ships inside dtcli, as scikit-learn ships it.
    return Path(__file__).parent / "assets" / "digits.csv.gz"


def _embedded(cfg: DataConfig) -> Dataset:
    table = np.loadtxt(_embedded_path(cfg), delimiter=",", dtype=np.float32)
    x = table[:, :-1].reshape(-1, 8, 8) / 16.0
    y = table[:, -1].astype(np.int32)
    # The file is ordered by writer; a fixed permutation makes both halves alike.
    order = np.random.default_rng(1797).permutation(len(y))
    x, y = x[order], y[order]
    cut = len(y) * 4 // 5
    if cfg.train_range is None and cfg.eval_range is None:
        train, evaluate = (0, cut), (cut, len(y))
    else:
        train, evaluate = _ranges(len(y), cfg, "the embedded digits")
    return Dataset(
        Split(x[slice(*train)], y[slice(*train)]),
        Split(x[slice(*evaluate)], y[slice(*evaluate)]),
        10,
        f"embedded digits 8x8 ({train[1] - train[0]} train, {evaluate[1] - evaluate[0]} eval)",
    )


# --------------------------------------------------------------------------- text


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


def _text(cfg: DataConfig) -> Dataset:
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

    builder = _tfds_builder(cfg)
    texts = [k for k, f in builder.info.features.items() if isinstance(f, tfds.features.Text)]
    if not texts:
        raise UsageError(
            f"recipe key 'data.name': TFDS {cfg.name!r} has no text feature (source text reads "
            "text; an image data set is source tfds)"
        )
    _download(builder, cfg)

    def read(split: str, key: str) -> np.ndarray:
        records = _tfds_records(cfg, split, key, supervised=False)
        try:
            chunks = [bytes(r[texts[0]]) for r in tfds.as_numpy(records)]
        except Exception as exc:  # noqa: BLE001 - TFDS/tf.data read errors, in one line
            raise UsageError(
                f"recipe key 'data.{key}': reading TFDS {cfg.name!r} {split!r} failed "
                f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]})"
            ) from None
        return np.frombuffer(b"".join(chunks), np.uint8)

    train = read(cfg.train_split, "train_split")
    evaluate = read(cfg.eval_split, "eval_split")
    what = f"TFDS {cfg.name} {cfg.train_split} / {cfg.eval_split}"
    keys = ("data.train_split", "data.eval_split")
    return _text_dataset(context, train, evaluate, what, keys)


def _idx_dims(raw: bytes, path: Path) -> list[int]:
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise UsageError(f"recipe key 'data.path': {path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise UsageError(f"recipe key 'data.path': {path} is truncated")
    return [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]


def _unreadable(path: Path, exc: BaseException) -> UsageError:
    """A file that cannot be read or decompressed, in one line."""
    if isinstance(exc, OSError) and exc.strerror:
        why = exc.strerror
    else:
        text = str(exc).strip()
        why = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    if isinstance(exc, EOFError):
        why = "the compressed file is truncated"
    return UsageError(f"recipe key 'data.path': cannot read {path} ({why})")


# What reading a missing, unreadable, corrupt or truncated (gzipped) file raises.
_READ_ERRORS = (OSError, EOFError, zlib.error)


def _idx_header(path: Path) -> list[int]:
    """The dims of an IDX file, reading only its header."""
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:
            head = f.read(4 + 4 * 255)
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None
    return _idx_dims(head, path)


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a numpy array."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None
    dims = _idx_dims(raw, path)
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * len(dims))
    want = int(np.prod(dims, dtype=np.int64))
    if body.size < want:
        raise UsageError(
            f"recipe key 'data.path': {path} is truncated (its header {dims} needs {want} bytes "
            f"of data, it holds {body.size})"
        )
    if body.size > want:
        raise UsageError(
            f"recipe key 'data.path': {path} is not a valid IDX file (its header {dims} needs "
            f"{want} bytes of data, it holds {body.size})"
        )
    return body.reshape(dims)


def _read_labels(path: Path) -> np.ndarray:
    y = read_idx(path)
    if y.ndim != 1:
        raise UsageError(
            f"recipe key 'data.path': {path} holds {y.ndim}-D data, expected one label per example"
        )
    if len(y) == 0:
        raise UsageError(f"recipe key 'data.path': {path} holds no examples")
    return y


def _find_idx(folder: Path, prefix: str, kind: str) -> Path | None:
    hits = sorted(folder.glob(f"{prefix}-{kind}-idx*-ubyte*"))
    return hits[0] if hits else None


def _idx_pair(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray] | None:
    images, labels = _find_idx(folder, prefix, "images"), _find_idx(folder, prefix, "labels")
    if images is None or labels is None:
        return None
    x, y = read_idx(images), _read_labels(labels)
    if x.ndim < 2:
        raise UsageError(
            f"recipe key 'data.path': {images} holds {x.ndim}-D data, expected images "
            "(examples x height x width)"
        )
    if len(x) != len(y):
        raise UsageError(
            f"recipe key 'data.path': {images.name} and {labels.name} differ in length"
        )
    return x, y


def _idx_folder(cfg: DataConfig) -> Path:
    folder = Path(cfg.path or "")
    if not folder.is_dir():
        raise UsageError(f"recipe key 'data.path': {str(folder)!r} is not a folder")
    for prefix in ("train", "t10k"):
        if _find_idx(folder, prefix, "images") and _find_idx(folder, prefix, "labels"):
            return folder
    for prefix in ("train", "t10k"):
        for kind, other in (("images", "labels"), ("labels", "images")):
            found = _find_idx(folder, prefix, kind)
            if found:
                raise UsageError(
                    f"recipe key 'data.path': {found.name} in {folder} has no "
                    f"{prefix}-{other}-idx*-ubyte[.gz] beside it"
                )
    raise UsageError(
        f"recipe key 'data.path': no IDX files (train-*-idx*-ubyte[.gz] or t10k-*) in {folder}"
    )


def _idx(cfg: DataConfig) -> Dataset:
    folder = _idx_folder(cfg)
    train_pair = _idx_pair(folder, "train")
    eval_pair = _idx_pair(folder, "t10k")
    if train_pair is not None and eval_pair is not None:
        tx, ty = train_pair
        ex, ey = eval_pair
        tr = cfg.train_range or (0, len(ty))
        er = cfg.eval_range or (0, len(ey))
        for key, (lo, hi), n in (("train_range", tr, len(ty)), ("eval_range", er, len(ey))):
            if hi > n:
                raise UsageError(f"recipe key 'data.{key}': [{lo}, {hi}) is past the {n} examples")
    else:
        x, y = train_pair or eval_pair  # one pair serves both, in disjoint ranges
        tx = ex = x
        ty = ey = y
        tr, er = _ranges(len(y), cfg, str(folder))
    return Dataset(
        Split(_scale(tx[slice(*tr)]), ty[slice(*tr)]),
        Split(_scale(ex[slice(*er)]), ey[slice(*er)]),
        int(max(ty.max(), ey.max())) + 1,
        f"IDX files in {folder} (train {tr[0]}-{tr[1] - 1}, eval {er[0]}-{er[1] - 1})",
    )


def _tfds_builder(cfg: DataConfig) -> Any:
    import tensorflow_datasets as tfds
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # TFDS' folder notices are not for users

    try:
        return tfds.builder(cfg.name, data_dir=cfg.data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        import difflib

        close = difflib.get_close_matches(cfg.name, tfds.list_builders(), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise UsageError(
            f"recipe key 'data.name': no TFDS data set named {cfg.name!r}{hint}"
        ) from None


def _download(builder: Any, cfg: DataConfig) -> None:
    """Prepare a TFDS data set where data.download asks for it."""
    if cfg.download:
        try:
            builder.download_and_prepare()
        except Exception as exc:  # TFDS raises many kinds; any of them means "not prepared"
            raise UsageError(
                f"recipe key 'data.download': preparing TFDS {cfg.name!r} failed "
                f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]})"
            ) from None


def _model_shape(example: tuple[int, ...], cfg: DataConfig) -> tuple[int, ...]:
    """The shape the model sees: flattened, or with a channel dim for (H, W) images."""
    if cfg.flatten:
        return (int(np.prod(example)),)
    return example + (1,) if len(example) == 2 else example


def _tfds(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    """A TFDS data set, streamed from its prepared files (converted to nothing)."""
    builder = _tfds_builder(cfg)
    info = builder.info
    num_classes = info.features["label"].num_classes
    _download(builder, cfg)

    def stream(split: str, key: str) -> Stream:
        try:
            count = int(info.splits[split].num_examples)
        except (KeyError, ValueError, AssertionError):
            # The metadata does not know the split (a data set without split info, TFDS' mock
            # data): count by reading it, which also says whether it is prepared and valid.
            import tensorflow as tf

            records = _tfds_records(cfg, split, key)
            try:
                count = int(records.reduce(np.int64(0), lambda n, _: n + 1))
            except tf.errors.OpError as exc:
                raise UsageError(
                    f"recipe key 'data.{key}': reading TFDS {cfg.name!r} {split!r} failed "
                    f"({_op_error_text(exc)})"
                ) from None
        if count == 0:
            raise UsageError(f"recipe key 'data.{key}': split {split!r} holds no examples")
        example = tuple(int(d) for d in info.features["image"].shape)
        return Stream(
            "tfds",
            (),
            (count,),
            (),
            _model_shape(example, cfg),
            cfg,
            num_classes,
            split,
            f"data.{key}",
        )

    evaluate = stream(cfg.eval_split, "eval_split")
    train = stream(cfg.train_split, "train_split") if "train" in split_names else _empty(evaluate)
    return Dataset(
        train,
        evaluate,
        num_classes,
        f"TFDS {cfg.name} ({cfg.train_split}: {len(train)}, {cfg.eval_split}: {len(evaluate)})",
    )


def _empty(like: Stream) -> Stream:
    return Stream(
        like.kind, (), (0,), (), like.example_shape, like.cfg, like.classes, where=like.where
    )


def _glob(pattern: str, key: str) -> tuple[str, ...]:
    import glob

    files = sorted(glob.glob(pattern))
    if not files:
        raise UsageError(f"recipe key 'data.{key}': no files match {pattern!r}")
    return tuple(files)


def _op_error_text(exc: BaseException) -> str:
    """The cause in a TensorFlow op error, without the function and iterator names around it."""
    text = getattr(exc, "message", None) or str(exc)
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    cause = re.search(r"with iterator: Iterator::\S+?: (.*)", text, re.S)
    if cause:
        text = cause.group(1)
    text = text.strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _tfrecord(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    """TFRecord files of tf.train.Examples: the image under data.image_key (raw bytes of
    data.shape in data.dtype, or an encoded PNG/JPEG), the class under data.label_key."""
    import tensorflow as tf

    def stream(pattern: str | None, key: str) -> Stream:
        if not pattern:
            raise UsageError(f"recipe key 'data.{key}': source tfrecord needs a glob of files")
        files = _glob(pattern, key)
        counts = []
        for f in files:
            try:
                counts.append(
                    int(tf.data.TFRecordDataset(f).reduce(np.int64(0), lambda n, _: n + 1))
                )
            except tf.errors.OpError as exc:
                raise UsageError(
                    f"recipe key 'data.{key}': cannot read {f} as TFRecords ({_op_error_text(exc)})"
                ) from None
        s = Stream(
            "tfrecord",
            files,
            tuple(counts),
            (),
            _model_shape(tuple(cfg.shape), cfg),
            cfg,
            cfg.classes,
            where=f"data.{key}",
        )
        if not len(s):
            raise UsageError(f"recipe key 'data.{key}': {pattern!r} holds no records")
        _check_first(s)
        return s

    evaluate = stream(cfg.eval_path, "eval_path")
    train = stream(cfg.path, "path") if "train" in split_names else _empty(evaluate)
    return Dataset(
        train,
        evaluate,
        cfg.classes,
        f"TFRecords {cfg.path} ({len(train)} train in {len(train.files)} files), "
        f"{cfg.eval_path} ({len(evaluate)} eval)",
    )


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")


def _class_folders(folder: Path, key: str) -> list[str]:
    if not folder.is_dir():
        raise UsageError(f"recipe key 'data.{key}': {str(folder)!r} is not a folder")
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise UsageError(
            f"recipe key 'data.{key}': {folder} needs one subfolder per class (at least 2), "
            f"found {len(classes)}"
        )
    return classes


def _images(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    """A folder with one subfolder of images per class (decoded, resized to data.shape)."""
    if len(cfg.shape) != 3:
        raise UsageError(
            f"recipe key 'data.shape': source images needs [height, width, channels], "
            f"got {list(cfg.shape)}"
        )
    if cfg.shape[2] not in (1, 3):
        raise UsageError(
            f"recipe key 'data.shape': images have 1 or 3 channels, got {cfg.shape[2]}"
        )
    classes = _class_folders(Path(cfg.path or ""), "path")

    def stream(folder: Path, key: str) -> Stream:
        found = _class_folders(folder, key)
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise UsageError(
                f"recipe key 'data.{key}': class folders {unknown} of {folder} are not among "
                f"data.path's {classes}"
            )
        files, labels = [], []
        for label, name in enumerate(classes):
            sub = folder / name
            if not sub.is_dir():
                continue
            for f in sorted(sub.iterdir()):
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    files.append(str(f))
                    labels.append(label)
        if not files:
            raise UsageError(
                f"recipe key 'data.{key}': no images ({', '.join(IMAGE_SUFFIXES)}) in the class "
                f"folders of {folder}"
            )
        s = Stream(
            "images",
            tuple(files),
            (1,) * len(files),
            tuple(labels),
            _model_shape(tuple(cfg.shape), cfg),
            cfg,
            len(classes),
            where=f"data.{key}",
        )
        _check_first(s)
        return s

    if not cfg.eval_path:
        raise UsageError(
            "recipe key 'data.eval_path': source images needs a folder of the same class "
            "subfolders to evaluate on"
        )
    evaluate = stream(Path(cfg.eval_path), "eval_path")
    train = stream(Path(cfg.path or ""), "path") if "train" in split_names else _empty(evaluate)
    return Dataset(
        train,
        evaluate,
        len(classes),
        f"images in {cfg.path} ({len(train)} train, {len(classes)} classes), "
        f"{cfg.eval_path} ({len(evaluate)} eval)",
    )


def _check_first(stream: Stream) -> None:
    """Decode the first example now, so that a wrong key, shape or type is a recipe error
    before any training rather than a failure mid-epoch."""

    ds = examples(stream, 0, 0, False, 0, 1).take(1)
    with reading(stream):
        for _ in ds:
            pass


@contextlib.contextmanager
def reading(stream: Stream) -> Iterator[None]:
    """Errors while reading a stream, in one line naming the recipe key to change."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        raise UsageError(_read_error(stream, _op_error_text(exc))) from None


# The message of the check that a raw record holds data.shape values of data.dtype.
RAW_SIZE = "raw image bytes do not make data.shape in data.dtype"


def _raw_size_error(stream: Stream) -> str:
    """Which of data.dtype or data.shape disagrees with the records, from the first one's size."""
    import tensorflow as tf

    cfg = stream.cfg
    record = next(iter(tf.data.TFRecordDataset(stream.files[:1]).take(1)))
    parsed = tf.io.parse_single_example(
        record, {cfg.image_key: tf.io.FixedLenFeature([], tf.string)}
    )
    size = len(parsed[cfg.image_key].numpy())
    values = int(np.prod(cfg.shape))
    for dtype, width in (("uint8", 1), ("float32", 4)):
        if dtype != cfg.dtype and size == values * width:
            return (
                f"recipe key 'data.dtype': the records' {cfg.image_key!r} holds {size} bytes, "
                f"data.shape {list(cfg.shape)} of {dtype}, not {cfg.dtype}"
            )
    width = np.dtype(cfg.dtype).itemsize
    return (
        f"recipe key 'data.shape': the records' {cfg.image_key!r} holds {size} bytes, "
        f"{size / width:g} values of {cfg.dtype} (data.dtype), not data.shape "
        f"{list(cfg.shape)} ({values} values)"
    )


def _first_undecodable(stream: Stream) -> str | None:
    """The first image file that does not decode (after a decoding error: the error of a tf.data
    pipeline does not say which file it was)."""
    import tensorflow as tf

    for path in stream.files:
        try:
            tf.io.decode_image(tf.io.read_file(path), expand_animations=False)
        except tf.errors.OpError:
            return path
    return None


def _read_error(stream: Stream, text: str) -> str:
    cfg = stream.cfg
    key, hint = stream.where, ""
    if RAW_SIZE in text:
        with contextlib.suppress(Exception):  # a courtesy: the data.shape line below says it too
            return _raw_size_error(stream)
    if stream.kind == "images" and "image" in text.lower():
        bad = _first_undecodable(stream)
        if bad is not None:
            return (
                f"recipe key '{stream.where}': cannot decode {bad} ({text}); remove or replace "
                "that file"
            )
    elif "data.classes" in text:
        key = "data.classes"
        hint = f"; every label must be in [0, {stream.classes})"
    elif stream.kind == "tfrecord" and "Feature:" in text:
        missing = cfg.image_key if f"Feature: {cfg.image_key} " in text else cfg.label_key
        key = "data.image_key" if missing == cfg.image_key else "data.label_key"
        hint = f"; the records have no feature {missing!r} of that type"
    elif stream.kind == "tfrecord" and (RAW_SIZE in text or "reshape" in text):
        key = "data.shape"
        hint = f" as {cfg.dtype}; the raw image bytes do not make data.shape {list(cfg.shape)}"
    elif stream.kind == "tfrecord" and ("decode" in text.lower() or "image" in text.lower()):
        key = "data.encoding"
    return f"recipe key '{key}': reading {stream.kind} data failed ({text}){hint}"


def share_counts(stream: Stream, groups: int) -> list[int]:
    """The examples each of `groups` client groups reads of `stream` in one epoch."""
    files = _file_shares(stream, groups)
    if files is None:
        total = len(stream)
        return [len(range(g, total, groups)) for g in range(groups)]
    return [sum(stream.counts[i] for i in share) for share in files]


def _file_shares(stream: Stream, groups: int) -> list[list[int]] | None:
    """Files dealt to groups (None: too few TFRecord files, every group deals out examples)."""
    if stream.kind == "tfrecord" and len(stream.files) >= groups:
        return [list(range(g, len(stream.files), groups)) for g in range(groups)]
    return None


def _seed(seed: int, epoch: int, group: int) -> int:
    return int(np.random.default_rng([seed, epoch, group]).integers(2**31 - 1))


def examples(stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int) -> Any:
    """A tf.data.Dataset of (x, y), one epoch of group `group`'s share of `stream`, in an order
    that is a pure function of (seed, epoch): files permuted, then a seeded shuffle buffer
    (image folders: every file permuted, no buffer needed)."""
    import tensorflow as tf

    cfg = stream.cfg
    auto = tf.data.AUTOTUNE
    rng = np.random.default_rng([seed, epoch])
    if stream.kind == "images":
        order = rng.permutation(len(stream.files)) if shuffle else np.arange(len(stream.files))
        order = order[group::groups]  # image files are examples: deal them out
        ds = tf.data.Dataset.from_tensor_slices(
            (np.array(stream.files)[order], np.array(stream.labels, np.int32)[order])
        )
        return ds.map(_image_decoder(stream), num_parallel_calls=auto, deterministic=True)
    if stream.kind == "tfds":
        ds = _tfds_records(cfg, stream.tfds_split, stream.where.removeprefix("data."))
        if shuffle:
            ds = ds.shuffle(cfg.shuffle_buffer, seed=_seed(seed, epoch, 0))
        ds = ds.shard(groups, group) if groups > 1 else ds
        return ds.map(_tfds_decoder(stream), num_parallel_calls=auto, deterministic=True)
    shares = _file_shares(stream, groups)
    mine = shares[group] if shares is not None else list(range(len(stream.files)))
    files = np.array(stream.files)[mine]
    if shuffle:
        files = files[rng.permutation(len(files))]
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset,
        # In file order without shuffling (record i of the files in turn is example i).
        cycle_length=min(len(files), 4) if shuffle else 1,
        block_length=1,
        num_parallel_calls=auto,
        deterministic=True,
    )
    if shuffle:  # the serialized records: the buffer holds compact bytes, not decoded floats
        ds = ds.shuffle(cfg.shuffle_buffer, seed=_seed(seed, epoch, group if shares else 0))
    if shares is None and groups > 1:
        ds = ds.shard(groups, group)  # every group reads the same order, keeps its n-th
    return ds.map(_record_decoder(stream), num_parallel_calls=auto, deterministic=True)


def _finish(x: Any, y: Any, stream: Stream) -> tuple[Any, Any]:
    """Scale to [0, 1] (from uint8), shape for the model, check the label is a class."""
    import tensorflow as tf

    x = tf.cast(x, tf.float32) / 255.0 if x.dtype == tf.uint8 else tf.cast(x, tf.float32)
    x = tf.reshape(x, stream.example_shape)
    y = tf.cast(y, tf.int32)
    classes = stream.classes
    with tf.control_dependencies(
        [
            tf.debugging.assert_non_negative(y, message="a label below 0 (data.classes)"),
            tf.debugging.assert_less(
                y, classes, message=f"a label not below data.classes = {classes}"
            ),
        ]
    ):
        return tf.identity(x), tf.identity(y)


def _record_decoder(stream: Stream) -> Any:
    import tensorflow as tf

    cfg = stream.cfg
    spec = {
        cfg.image_key: tf.io.FixedLenFeature([], tf.string),
        cfg.label_key: tf.io.FixedLenFeature([], tf.int64),
    }
    shape = tuple(cfg.shape)

    def decode(record: Any) -> tuple[Any, Any]:
        parsed = tf.io.parse_single_example(record, spec)
        raw = parsed[cfg.image_key]
        if cfg.encoding == "raw":
            values = tf.io.decode_raw(raw, getattr(tf, cfg.dtype))
            # An explicit check: a reshape alone was optimized into a later one and failed
            # only when batching, naming nothing useful.
            with tf.control_dependencies(
                [tf.debugging.assert_equal(tf.size(values), int(np.prod(shape)), RAW_SIZE)]
            ):
                x = tf.reshape(values, shape)
        else:
            channels = shape[2] if len(shape) == 3 else 1
            x = tf.io.decode_image(raw, channels=channels, expand_animations=False)
            x = tf.ensure_shape(tf.reshape(x, shape), shape)
        return _finish(x, parsed[cfg.label_key], stream)

    return decode


def _image_decoder(stream: Stream) -> Any:
    import tensorflow as tf

    height, width, channels = stream.cfg.shape

    def decode(path: Any, label: Any) -> tuple[Any, Any]:
        raw = tf.io.read_file(path)
        image = tf.io.decode_image(raw, channels=channels, expand_animations=False)
        image = tf.image.resize(image, (height, width))  # float32 in [0, 255]
        return _finish(image / 255.0, label, stream)

    return decode


def _tfds_records(cfg: DataConfig, split: str, key: str, supervised: bool = True) -> Any:
    import tensorflow_datasets as tfds

    builder = _tfds_builder(cfg)
    try:
        return builder.as_dataset(
            split=split,
            as_supervised=supervised,
            shuffle_files=False,
            read_config=tfds.ReadConfig(try_autocache=False),
        )
    except AssertionError:  # TFDS' way of saying "not prepared"
        where = cfg.data_dir or "~/tensorflow_datasets"
        raise UsageError(
            f"recipe key 'data.name': TFDS data set {cfg.name!r} is not prepared in {where} and "
            f"data.download is false; prepare it where there is network (`tfds build {cfg.name} "
            "--data_dir DIR`) and set data.data_dir=DIR, or --set data.download=true"
        ) from None
    except (ValueError, KeyError) as exc:
        text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"recipe key 'data.{key}': {split!r} is not a valid split ({text})"
        ) from None


def _tfds_decoder(stream: Stream) -> Any:
    def decode(x: Any, y: Any) -> tuple[Any, Any]:
        return _finish(x, y, stream)

    return decode


def write_tfrecords(
    x: np.ndarray, y: np.ndarray, folder: Path, prefix: str, files: int = 1
) -> list[Path]:
    """Write examples as `source: tfrecord` reads them by default (`image`: the raw bytes of x[i],
    `label`: int64), in order over `files` files named PREFIX-00000-of-0000N.tfrecord."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(y)), files)):
        path = folder / f"{prefix}-{i:05d}-of-{files:05d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for j in part:
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "image": tf.train.Feature(
                                bytes_list=tf.train.BytesList(value=[x[j].tobytes()])
                            ),
                            "label": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=[int(y[j])])
                            ),
                        }
                    )
                )
                w.write(example.SerializeToString())
        paths.append(path)
    return paths


def _synthetic(cfg: DataConfig) -> Dataset:
    rng = np.random.default_rng(12345)
    dim = int(np.prod(cfg.shape))
    # Labels are a fixed linear function of the inputs, so the task is learnable.
    w = rng.standard_normal((dim, cfg.classes)).astype(np.float32)

    def make(n: int) -> Split:
        x = rng.random((n, *cfg.shape), dtype=np.float32)
        y = np.argmax(x.reshape(n, dim) @ w, axis=1).astype(np.int32)
        return Split(x, y)

    return Dataset(
        make(cfg.count),
        make(cfg.eval_count),
        cfg.classes,
        f"synthetic {list(cfg.shape)} x {cfg.classes} classes "
        f"({cfg.count} train, {cfg.eval_count} eval)",
    )
