"""source images: a folder with one subfolder of image files per class, streamed (each file
decoded and resized to data.shape as it trains)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dtcli.data import streams
from dtcli.data.base import Dataset, Stream, empty_like, model_shape
from dtcli.errors import UsageError
from dtcli.recipe import DataConfig

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


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    return tuple(cfg.shape), len(_class_folders(Path(cfg.path or ""), "path"))


def _check_shape(cfg: DataConfig) -> None:
    if len(cfg.shape) != 3:
        raise UsageError(
            f"recipe key 'data.shape': source images needs [height, width, channels], "
            f"got {list(cfg.shape)}"
        )
    if cfg.shape[2] not in (1, 3):
        raise UsageError(
            f"recipe key 'data.shape': images have 1 or 3 channels, got {cfg.shape[2]}"
        )


def _image_files(folder: Path, classes: list[str], key: str) -> tuple[list[str], list[int]]:
    """The image files under `folder`'s class folders, and their labels (index in `classes`)."""
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
    return files, labels


def _stream(cfg: DataConfig, classes: list[str], folder: Path, key: str) -> Stream:
    files, labels = _image_files(folder, classes, key)
    s = Stream(
        "images",
        tuple(files),
        (1,) * len(files),
        tuple(labels),
        model_shape(tuple(cfg.shape), cfg),
        cfg,
        len(classes),
        where=f"data.{key}",
    )
    streams.check_first(s, examples, read_error)
    return s


def load(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    _check_shape(cfg)
    classes = _class_folders(Path(cfg.path or ""), "path")
    if not cfg.eval_path:
        raise UsageError(
            "recipe key 'data.eval_path': source images needs a folder of the same class "
            "subfolders to evaluate on"
        )
    evaluate = _stream(cfg, classes, Path(cfg.eval_path), "eval_path")
    if "train" in split_names:
        train = _stream(cfg, classes, Path(cfg.path or ""), "path")
    else:
        train = empty_like(evaluate)
    return Dataset(
        train,
        evaluate,
        len(classes),
        f"images in {cfg.path} ({len(train)} train, {len(classes)} classes), "
        f"{cfg.eval_path} ({len(evaluate)} eval)",
    )


def examples(stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int) -> Any:
    """Every file permuted (image files are examples: no shuffle buffer), then dealt out."""
    import tensorflow as tf

    n = len(stream.files)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    order = order[group::groups]  # image files are examples: deal them out
    ds = tf.data.Dataset.from_tensor_slices(
        (np.array(stream.files)[order], np.array(stream.labels, np.int32)[order])
    )
    return ds.map(_decoder(stream), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _decoder(stream: Stream) -> Any:
    import tensorflow as tf

    height, width, channels = stream.cfg.shape

    def decode(path: Any, label: Any) -> tuple[Any, Any]:
        raw = tf.io.read_file(path)
        image = tf.io.decode_image(raw, channels=channels, expand_animations=False)
        image = tf.image.resize(image, (height, width))  # float32 in [0, 255]
        return streams.as_model_input(image / 255.0, label, stream)

    return decode


# Image files are examples: a group's share is every n-th of them.
share_counts = streams.example_shares


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


def read_error(stream: Stream, text: str) -> str:
    """An image that does not decode is named, to remove or replace."""
    if "image" not in text.lower():
        return streams.read_error(stream, text)
    bad = _first_undecodable(stream)
    if bad is None:
        return streams.failed(stream, text)
    return f"recipe key '{stream.where}': cannot decode {bad} ({text}); remove or replace that file"
