"""Data sets: where examples come from, and their splits.

Small data sets (embedded, IDX files, synthetic, text) are read whole into host memory as numpy
(`Split`); large ones (TFRecord files, image folders, TFDS, token shards) are streamed through
tf.data as they train (`Stream`), never held whole. dtcli.pipeline batches both kinds the same way.

One module per source, named in `SOURCES` (the values of data.source). Each has
`load(cfg, split_names) -> Dataset` and `describe(cfg) -> (example shape, class count)`; a
streamed one also `examples`, `share_counts` and `read_error`, picked by `Stream.kind`. A new
source is one module and one line here (and its recipe checks).

The language-model sources (text, tokens, jsonl) also take `saved`: where the run keeps its
tokenizer (read there when it exists; see dtcli.data.tokenizer), and have `tokenizer(cfg,
saved)`; their Dataset carries the tokenizer.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dtcli.data import (
    embedded,
    idx,
    images,
    jsonl,
    streams,
    synthetic,
    text,
    tfds,
    tfrecord,
    tokens,
)
from dtcli.data.base import (
    Dataset,
    Split,
    Stream,
    TextSplit,
    check_batch_fits,
    model_shape,
)
from dtcli.data.idx import read_idx
from dtcli.data.text import stdlib_sources
from dtcli.data.tokenizer import vocab_for
from dtcli.recipe import DataConfig

SOURCES: dict[str, ModuleType] = {
    "embedded": embedded,
    "idx": idx,
    "synthetic": synthetic,
    "text": text,
    "tfds": tfds,
    "tfrecord": tfrecord,
    "images": images,
    "tokens": tokens,
    "jsonl": jsonl,
}
# The sources of language-model tokens: they take the run's saved tokenizer.
TOKENIZED = ("text", "tokens", "jsonl")

__all__ = [
    "SOURCES",
    "Dataset",
    "Split",
    "Stream",
    "TextSplit",
    "check_batch_fits",
    "describe",
    "examples",
    "load",
    "no_data",
    "read_idx",
    "reading",
    "share_counts",
    "stdlib_sources",
]


def load(
    cfg: DataConfig,
    split_names: tuple[str, ...] = ("train", "eval"),
    saved: Path | None = None,
    vocab_size: int | None = None,
) -> Dataset:
    """Load the configured data set, scaled to [0, 1] and shaped for the model. `saved`: where
    a language-model run keeps its tokenizer; `vocab_size`: the model's real vocabulary
    (ModelConfig.real_vocab; tokenizer.vocab_for)."""
    if cfg.source in TOKENIZED:
        dataset = SOURCES[cfg.source].load(cfg, split_names, saved)
        if vocab_size is None:
            return dataset
        return replace(dataset, num_classes=vocab_for(dataset.tokenizer, vocab_size))
    return SOURCES[cfg.source].load(cfg, split_names)


def describe(
    cfg: DataConfig, saved: Path | None = None, vocab_size: int | None = None
) -> tuple[tuple[int, ...], int]:
    """(input shape the model sees, class count) without loading the examples (for `dtcli plan`).

    Reads only headers and labels: IDX headers, TFDS' static feature info, the recipe itself,
    a tokenizer.json (its size: the model's vocabulary, unless `vocab_size` names it).
    """
    source = SOURCES[cfg.source]
    tokenized = cfg.source in TOKENIZED
    example, classes = source.describe(cfg, saved) if tokenized else source.describe(cfg)
    if tokenized and vocab_size is not None:
        classes = vocab_for(source.tokenizer(cfg, saved), vocab_size)
    # A language model's windows as they are (data.flatten is a classifier's).
    return (example if tokenized else model_shape(example, cfg)), classes


def no_data(cfg: DataConfig, saved: Path | None = None, vocab_size: int | None = None) -> Dataset:
    """A data set of no examples with the shapes `cfg` gives (describe): a model needs them; a
    language model's with its tokenizer (generate encodes and decodes with it). Instruction
    data's windows are unpacked here: generate and score feed one sequence of ids a row."""
    shape, classes = describe(replace(cfg, packing=False), saved, vocab_size)
    empty = Split(np.zeros((0, *shape), np.float32), np.zeros(0, np.int32))
    tokenizer = SOURCES[cfg.source].tokenizer(cfg, saved) if cfg.source in TOKENIZED else None
    return Dataset(empty, empty, classes, "none", tokenizer)


def examples(stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int) -> Any:
    """A tf.data.Dataset of (x, y), one epoch of group `group`'s share of `stream`, in an order
    that is a pure function of (seed, epoch): files permuted, then a seeded shuffle buffer
    (image folders: every file permuted, no buffer needed)."""
    return SOURCES[stream.kind].examples(stream, seed, epoch, shuffle, group, groups)


def share_counts(stream: Stream, groups: int) -> list[int]:
    """The examples each of `groups` client groups reads of `stream` in one epoch."""
    return SOURCES[stream.kind].share_counts(stream, groups)


def reading(stream: Stream) -> AbstractContextManager[None]:
    """Errors while reading a stream, in one line naming the recipe key to change."""
    return streams.reading(stream, SOURCES[stream.kind].read_error)
