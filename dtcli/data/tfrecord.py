"""source tfrecord: TFRecord files of tf.train.Examples, streamed. The image is under
data.image_key (raw bytes of data.shape in data.dtype, or an encoded PNG/JPEG), the class under
data.label_key. Client groups read disjoint files where there are enough of them."""

from __future__ import annotations

import contextlib
import glob
from typing import Any

import numpy as np

from dtcli.data import streams
from dtcli.data.base import Dataset, Stream, empty_like, model_shape
from dtcli.errors import UsageError
from dtcli.recipe import DataConfig

# The message of the check that a raw record holds data.shape values of data.dtype.
RAW_SIZE = "raw image bytes do not make data.shape in data.dtype"


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    return tuple(cfg.shape), cfg.classes


def _glob(pattern: str, key: str) -> tuple[str, ...]:
    files = sorted(glob.glob(pattern))
    if not files:
        raise UsageError(f"recipe key 'data.{key}': no files match {pattern!r}")
    return tuple(files)


def _count(file: str, key: str) -> int:
    import tensorflow as tf

    try:
        return int(tf.data.TFRecordDataset(file).reduce(np.int64(0), lambda n, _: n + 1))
    except tf.errors.OpError as exc:
        raise UsageError(
            f"recipe key 'data.{key}': cannot read {file} as TFRecords "
            f"({streams.op_error_text(exc)})"
        ) from None


def _stream(cfg: DataConfig, pattern: str | None, key: str) -> Stream:
    if not pattern:
        raise UsageError(f"recipe key 'data.{key}': source tfrecord needs a glob of files")
    files = _glob(pattern, key)
    counts = tuple(_count(f, key) for f in files)
    s = Stream(
        "tfrecord",
        files,
        counts,
        (),
        model_shape(tuple(cfg.shape), cfg),
        cfg,
        cfg.classes,
        where=f"data.{key}",
    )
    if not len(s):
        raise UsageError(f"recipe key 'data.{key}': {pattern!r} holds no records")
    streams.check_first(s, examples, read_error)
    return s


def load(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    evaluate = _stream(cfg, cfg.eval_path, "eval_path")
    train = _stream(cfg, cfg.path, "path") if "train" in split_names else empty_like(evaluate)
    return Dataset(
        train,
        evaluate,
        cfg.classes,
        f"TFRecords {cfg.path} ({len(train)} train in {len(train.files)} files), "
        f"{cfg.eval_path} ({len(evaluate)} eval)",
    )


def _file_shares(stream: Stream, groups: int) -> list[list[int]] | None:
    """Files dealt to groups (None: too few files, every group deals out examples)."""
    if len(stream.files) >= groups:
        return [list(range(g, len(stream.files), groups)) for g in range(groups)]
    return None


def share_counts(stream: Stream, groups: int) -> list[int]:
    files = _file_shares(stream, groups)
    if files is None:
        return streams.example_shares(stream, groups)
    return [sum(stream.counts[i] for i in share) for share in files]


def examples(stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int) -> Any:
    """This group's files (all of them if too few), permuted, then a seeded shuffle buffer."""
    import tensorflow as tf

    shares = _file_shares(stream, groups)
    mine = shares[group] if shares is not None else list(range(len(stream.files)))
    files = np.array(stream.files)[mine]
    if shuffle:
        files = files[np.random.default_rng([seed, epoch]).permutation(len(files))]
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset,
        # In file order without shuffling (record i of the files in turn is example i).
        cycle_length=min(len(files), 4) if shuffle else 1,
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if shuffle:  # the serialized records: the buffer holds compact bytes, not decoded floats
        group_seed = streams.shuffle_seed(seed, epoch, group if shares else 0)
        ds = ds.shuffle(stream.cfg.shuffle_buffer, seed=group_seed)
    if shares is None and groups > 1:
        ds = ds.shard(groups, group)  # every group reads the same order, keeps its n-th
    return ds.map(_decoder(stream), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _decoder(stream: Stream) -> Any:
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
        return streams.as_model_input(x, parsed[cfg.label_key], stream)

    return decode


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


def read_error(stream: Stream, text: str) -> str:
    """A missing feature names data.image_key or data.label_key; raw bytes that do not make
    data.shape name data.dtype or data.shape; an undecodable image names data.encoding."""
    cfg = stream.cfg
    if RAW_SIZE in text:
        with contextlib.suppress(Exception):  # a courtesy: the data.shape line below says it too
            return _raw_size_error(stream)
    if "data.classes" in text:
        return streams.read_error(stream, text)
    if "Feature:" in text:
        missing = cfg.image_key if f"Feature: {cfg.image_key} " in text else cfg.label_key
        key = "data.image_key" if missing == cfg.image_key else "data.label_key"
        return streams.failed(
            stream, text, key, f"; the records have no feature {missing!r} of that type"
        )
    if RAW_SIZE in text or "reshape" in text:
        hint = f" as {cfg.dtype}; the raw image bytes do not make data.shape {list(cfg.shape)}"
        return streams.failed(stream, text, "data.shape", hint)
    if "decode" in text.lower() or "image" in text.lower():
        return streams.failed(stream, text, "data.encoding")
    return streams.failed(stream, text)
