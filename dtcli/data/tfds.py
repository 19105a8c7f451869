"""source tfds: a TensorFlow Datasets image data set by name, streamed from its prepared files
(converted to nothing). Also the TFDS helpers source text uses for TFDS text data sets."""

from __future__ import annotations

from typing import Any

import numpy as np

from dtcli.data import streams
from dtcli.data.base import Dataset, Stream, empty_like, model_shape
from dtcli.errors import UsageError, one_line
from dtcli.recipe import DataConfig


def builder(cfg: DataConfig) -> Any:
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


# How long one download host may take to accept a connection before dtcli calls it unreachable.
REACH_TIMEOUT_S = 5.0


def check_reachable(builder: Any, cfg: DataConfig, timeout: float = REACH_TIMEOUT_S) -> None:
    """Fail at once, naming the host, where the data set's files cannot be fetched: without
    network TFDS' downloader retries for minutes (urllib3's retries, then its own)."""
    import socket
    from urllib.parse import urlsplit

    hosts = sorted({(u.hostname, u.port or 443) for u in map(urlsplit, builder.url_infos or {})})
    for host, port in hosts:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise UsageError(
                f"recipe key 'data.download': cannot reach {host} to download TFDS "
                f"{cfg.name!r} ({reason}); offline, prepare it where there is network (`tfds "
                f"build {cfg.name} --data_dir DIR`), copy DIR here and set data.data_dir=DIR"
            ) from None


def download(builder: Any, cfg: DataConfig) -> None:
    """Prepare a TFDS data set where data.download asks for it."""
    if cfg.download and not builder.is_prepared():
        check_reachable(builder, cfg)
        try:
            builder.download_and_prepare()
        except Exception as exc:  # TFDS raises many kinds; any of them means "not prepared"
            raise UsageError(
                f"recipe key 'data.download': preparing TFDS {cfg.name!r} failed "
                f"({one_line(exc, named=True)})"
            ) from None


def records(cfg: DataConfig, split: str, key: str, supervised: bool = True) -> Any:
    """The split's records as a tf.data.Dataset, in TFDS' file order."""
    import tensorflow_datasets as tfds

    found = builder(cfg)
    try:
        return found.as_dataset(
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
        text = one_line(exc)
        raise UsageError(
            f"recipe key 'data.{key}': {split!r} is not a valid split ({text})"
        ) from None


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    """From TFDS' static feature info: nothing is read."""
    info = builder(cfg).info
    return tuple(int(d) for d in info.features["image"].shape), info.features["label"].num_classes


def _count(cfg: DataConfig, info: Any, split: str, key: str) -> int:
    try:
        return int(info.splits[split].num_examples)
    except (KeyError, ValueError, AssertionError):
        # The metadata does not know the split (a data set without split info, TFDS' mock
        # data): count by reading it, which also says whether it is prepared and valid.
        import tensorflow as tf

        split_records = records(cfg, split, key)
        try:
            return int(split_records.reduce(np.int64(0), lambda n, _: n + 1))
        except tf.errors.OpError as exc:
            raise UsageError(
                f"recipe key 'data.{key}': reading TFDS {cfg.name!r} {split!r} failed "
                f"({streams.op_error_text(exc)})"
            ) from None


def _stream(cfg: DataConfig, info: Any, split: str, key: str) -> Stream:
    count = _count(cfg, info, split, key)
    if count == 0:
        raise UsageError(f"recipe key 'data.{key}': split {split!r} holds no examples")
    example = tuple(int(d) for d in info.features["image"].shape)
    return Stream(
        "tfds",
        (),
        (count,),
        (),
        model_shape(example, cfg),
        cfg,
        info.features["label"].num_classes,
        split,
        f"data.{key}",
    )


def load(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    found = builder(cfg)
    info = found.info
    num_classes = info.features["label"].num_classes
    download(found, cfg)
    evaluate = _stream(cfg, info, cfg.eval_split, "eval_split")
    if "train" in split_names:
        train = _stream(cfg, info, cfg.train_split, "train_split")
    else:
        train = empty_like(evaluate)
    return Dataset(
        train,
        evaluate,
        num_classes,
        f"TFDS {cfg.name} ({cfg.train_split}: {len(train)}, {cfg.eval_split}: {len(evaluate)})",
    )


def examples(stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int) -> Any:
    """TFDS' records in its file order, through a seeded shuffle buffer; a group keeps every
    n-th."""
    import tensorflow as tf

    cfg = stream.cfg
    ds = records(cfg, stream.tfds_split, stream.where.removeprefix("data."))
    if shuffle:
        ds = ds.shuffle(cfg.shuffle_buffer, seed=streams.shuffle_seed(seed, epoch, 0))
    ds = ds.shard(groups, group) if groups > 1 else ds

    def decode(x: Any, y: Any) -> tuple[Any, Any]:
        return streams.as_model_input(x, y, stream)

    return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


share_counts = streams.example_shares
read_error = streams.read_error
