"""What every data source returns: in-memory splits (`Split`, `TextSplit`), streamed splits
(`Stream`), the `Dataset` of both, and the rules they share (the shape the model sees, uint8
scaling, default train/eval ranges)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.recipe import DataConfig


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
    """Token windows of a token string: x[i] the `context` tokens of window i, y[i] the same
    shifted by one (the next token at every position). x and y are views of `tokens` (a
    memory-mapped file where it is one file of byte tokens): a batch copies only its own
    windows."""

    tokens: np.ndarray  # uint8 (byte tokens) or the tokenizer's token_dtype
    # An evaluation split's UTF-8 bytes of the text its targets (every y) cover: bits per
    # byte's denominator (None: not counted, a training split).
    target_bytes: int | None = None


@dataclass(frozen=True)
class Stream:
    """A split read from files as it trains.

    tfrecord: `files` are TFRecord files, `counts` the records in each; images: `files` are image
    files (one example each) and `labels` their classes; tfds: `files` is empty and `counts` holds
    the split's size (TFDS reads its own files); tokens: `files` are token shards, `counts` the
    windows of each."""

    kind: str  # "tfrecord" | "images" | "tfds" | "tokens" | "jsonl": its source in data.SOURCES
    files: tuple[str, ...]
    counts: tuple[int, ...]
    labels: tuple[int, ...]
    example_shape: tuple[int, ...]  # as the model sees one example
    cfg: DataConfig
    classes: int
    tfds_split: str = ""
    where: str = ""  # the recipe key the files came from, for errors
    x_dtype: str = "float32"  # of x as `examples` gives it (token shards: int32 ids)
    y_shape: tuple[int, ...] = ()  # of one example's y: () a class, (context,) next tokens
    file_tokens: tuple[int, ...] = ()  # tokens: the token ids each shard file holds
    token_dtype: str = ""  # tokens: the shards' ids, uint16 or uint32
    target_bytes: int | None = None  # as TextSplit's
    # jsonl: where its examples lie in the file and the windows they fill (data.jsonl.Lines).
    lines: Any = field(default=None, compare=False)

    def __len__(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Dataset:
    train: Split | Stream
    eval: Split | Stream
    num_classes: int
    description: str
    # A language model's tokenizer (data.tokenizer.Tokenizer); None for classifiers.
    tokenizer: Any = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.eval.example_shape


def model_shape(example: tuple[int, ...], cfg: DataConfig) -> tuple[int, ...]:
    """The shape the model sees: flattened, or with a channel dim for (H, W) images (Conv2D)."""
    if cfg.flatten:
        return (int(np.prod(example)),)
    return example + (1,) if len(example) == 2 else example


def shaped(split: Split, cfg: DataConfig) -> Split:
    """An in-memory split as the model sees it: float32 of `model_shape`, int32 labels."""
    x = split.x.reshape(len(split.x), *model_shape(split.example_shape, cfg))
    return Split(np.ascontiguousarray(x, dtype=np.float32), split.y.astype(np.int32))


def empty_like(stream: Stream) -> Stream:
    """A stream of no examples shaped as `stream` (the train split of an eval-only load)."""
    return Stream(
        stream.kind,
        (),
        (0,),
        (),
        stream.example_shape,
        stream.cfg,
        stream.classes,
        where=stream.where,
        x_dtype=stream.x_dtype,
        y_shape=stream.y_shape,
        file_tokens=(),
        token_dtype=stream.token_dtype,
    )


def scale(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    return x.astype(np.float32)


def ranges(n: int, cfg: DataConfig, where: str) -> tuple[tuple[int, int], tuple[int, int]]:
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
