"""The `data` section's checks: sizes, what each source needs, reading and placement, the
training count, and host memory. No file is read and TensorFlow is not imported.

The checks run in a fixed order (the first failing one is the error shown), so a section's
helpers are called in the order the keys were always checked.
"""

from __future__ import annotations

import importlib.util
import math
import os

from dtcli.errors import UsageError
from dtcli.recipe.configs import (
    MAX_VOCAB,
    MIN_BPE_VOCAB,
    STREAMED_SOURCES,
    TEXT_SOURCES,
    DataConfig,
    TrainTokenizerConfig,
)

# The embedded digits (the UCI 8x8 digits shipped in dtcli/assets, see data._embedded): the first
# 4/5 train unless ranges are given.
EMBEDDED_DIGITS = 1797


def tfds_installed() -> bool:
    """Whether tensorflow-datasets can be imported (an optional extra), without importing it."""
    return importlib.util.find_spec("tensorflow_datasets") is not None


def _physical_memory() -> int | None:
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _known_train_count(d: DataConfig) -> int | None:
    """The training examples the recipe gives, when known without reading any file."""
    if d.source == "synthetic":
        return d.count
    if d.train_range is not None and d.source in ("embedded", "idx"):
        return d.train_range[1] - d.train_range[0]
    if d.source == "embedded":
        return EMBEDDED_DIGITS * 4 // 5 if d.eval_range is None else EMBEDDED_DIGITS // 2
    return None  # IDX files without a range, TFDS splits: see data.check_batch_fits


def check_data(d: DataConfig) -> None:
    """The `data` section on its own (the task and mesh checks that involve it are in checks)."""
    _check_sizes(d)
    _check_source_needs(d)
    _check_tokenizer(d)
    _check_instructions(d)
    _check_reading(d)
    known = _known_train_count(d)
    if known is not None and d.batch_size > known:
        raise UsageError(
            f"recipe key 'data.batch_size': {d.batch_size} is more than the {known} training "
            f"examples of data.source {d.source}; use a batch of at most {known}"
        )
    _check_host_memory(d)


def _check_sizes(d: DataConfig) -> None:
    """Batch sizes, example counts, classes and the example shape."""
    for key in ("batch_size", "count", "eval_count"):
        value = getattr(d, key)
        if value <= 0:
            raise UsageError(f"recipe key 'data.{key}': expected a positive integer, got {value}")
    if d.eval_batch_size is not None and d.eval_batch_size <= 0:
        raise UsageError(
            f"recipe key 'data.eval_batch_size': expected a positive integer or null, "
            f"got {d.eval_batch_size}"
        )
    if d.classes < 2:
        raise UsageError(f"recipe key 'data.classes': expected an integer >= 2, got {d.classes}")
    if not d.shape or not all(n > 0 for n in d.shape):
        raise UsageError(
            f"recipe key 'data.shape': expected at least one dim, each a positive integer, "
            f"got {list(d.shape)}"
        )


def _check_source_needs(d: DataConfig) -> None:
    """What a source cannot do without: its files, a window length, the tfds extra."""
    if d.source == "idx" and not d.path:
        raise UsageError("recipe key 'data.path': source idx needs the folder of IDX files")
    if d.source in ("tfrecord", "images"):
        for key, split in (("path", "training"), ("eval_path", "evaluation")):
            if not getattr(d, key):
                what = (
                    f"a glob of the {split} TFRecord files"
                    if d.source == "tfrecord"
                    else f"the {split} folder, one subfolder of images per class"
                )
                raise UsageError(
                    f"recipe key 'data.{key}': source {d.source} requires it ({what}) and it "
                    "is missing"
                )
    if d.source in ("embedded", "synthetic"):
        _check_no_files(d)
    if d.source == "tokens" and not d.path:
        raise UsageError(
            "recipe key 'data.path': source tokens needs the folder `dtcli prepare-text` wrote"
        )
    if d.source == "jsonl" and not d.path:
        raise UsageError(
            "recipe key 'data.path': source jsonl needs a JSON Lines file of examples, one a line"
        )
    if d.source == "tokens" and d.eval_path:
        raise UsageError(
            "recipe key 'data.eval_path': source tokens evaluates on the eval shards of "
            "data.path (prepare-text's split); remove data.eval_path"
        )
    if d.context is not None and d.context < 1:
        raise UsageError(f"recipe key 'data.context': expected an integer >= 1, got {d.context}")
    tfds_key = (
        "data.source"
        if d.source == "tfds"
        else "data.name"
        if d.source == "text" and d.path is None and d.name != "digits"
        else None
    )
    if tfds_key is not None and not tfds_installed():
        raise UsageError(
            f"recipe key '{tfds_key}': TFDS data sets need the tfds extra, which is not "
            "installed: pip install 'dtensor-cli[tfds]'"
        )


# What a tokenizer option or key takes (its errors list them).
TOKENIZER_FORMS = "bytes | bpe:N | tokenizer.json (a path to one, or to a folder holding one)"


def spec_error(named: str, spec: str, expected: str, why: str = "") -> UsageError:
    """A tokenizer spec refused, in the words of where it came from: an option
    (`--tokenizer 'bpe:9': expected ...`) or a recipe key (`recipe key ...: expected ..., got
    'bpe:9'`); `why`: what is wrong with it, where `expected` alone does not say."""
    why = f"; {why}" if why else ""
    if named.startswith("--"):
        return UsageError(f"{named} {spec!r}: expected {expected}{why}")
    return UsageError(f"{named}: expected {expected}, got {spec!r}{why}")


def bpe_size(spec: str, named: str) -> int | None:
    """The N of a tokenizer given as `bpe:N` (a byte-level BPE of N ids to train), None for any
    other tokenizer; `named`: how errors name it ("--tokenizer", "recipe key 'data.tokenizer'")."""
    if not spec.strip().startswith("bpe:"):
        return None
    size = spec.strip()[len("bpe:") :].strip().replace("_", "")
    if not size.isdigit() or not MIN_BPE_VOCAB <= int(size) <= MAX_VOCAB:
        expected = (
            f"bpe:N with N, the vocabulary size, an integer from {MIN_BPE_VOCAB} (the 256 bytes "
            f"and the end-of-document token) to {MAX_VOCAB:,}, like bpe:4096"
        )
        raise spec_error(named, spec, expected, "" if size else "N is missing")
    return int(size)


# The keys only instruction data (source jsonl) reads, and their defaults.
INSTRUCTION_KEYS = {
    "chat_template": None,
    "mask_prompt": True,
    "packing": False,
    "truncate": "prompt_start",
}


def _check_instructions(d: DataConfig) -> None:
    """The instruction keys: given a value of their own only for source jsonl."""
    if d.source != "jsonl":
        for key, default in INSTRUCTION_KEYS.items():
            if getattr(d, key) != default:
                raise UsageError(
                    f"recipe key 'data.{key}': only instruction data (data.source: jsonl) reads "
                    f"it, and data.source is {d.source}; remove data.{key}"
                )
        return
    if d.chat_template is not None and not d.chat_template.strip():
        raise UsageError(
            "recipe key 'data.chat_template': expected plain, alpaca, chatml, llama3 or a Jinja "
            "template file, got ''"
        )
    if isinstance(d.tokenizer, TrainTokenizerConfig):
        raise UsageError(
            "recipe key 'data.tokenizer': source jsonl reads its examples with a tokenizer it "
            "is given (bytes, or a tokenizer.json), it trains none; train one with `dtcli "
            "prepare-text TEXT --tokenizer bpe:N` and give its tokenizer.json"
        )


def _check_tokenizer(d: DataConfig) -> None:
    """data.tokenizer: only text has one to choose (token shards carry their own); a BPE's
    size within bounds. Whether a tokenizer.json is there is seen when the data is read."""
    t = d.tokenizer
    if t is None:
        return
    if d.source not in TEXT_SOURCES:
        raise UsageError(
            f"recipe key 'data.tokenizer': source {d.source} reads no text (only sources text "
            "and tokens have a tokenizer); remove data.tokenizer"
        )
    if d.source == "tokens":
        raise UsageError(
            "recipe key 'data.tokenizer': source tokens uses the tokenizer its shards were "
            "made with (prepare-text saved it beside them); remove data.tokenizer"
        )
    if isinstance(t, TrainTokenizerConfig):
        if not MIN_BPE_VOCAB <= t.vocab_size <= MAX_VOCAB:
            raise UsageError(
                f"recipe key 'data.tokenizer.vocab_size': expected an integer from "
                f"{MIN_BPE_VOCAB} (the 256 bytes and the end-of-document token) to "
                f"{MAX_VOCAB:,}, got {t.vocab_size}"
            )
    elif not t.strip():
        raise UsageError(
            f"recipe key 'data.tokenizer': expected {TOKENIZER_FORMS} or "
            "{train: bpe, vocab_size: N}, got ''"
        )


def _check_no_files(d: DataConfig) -> None:
    """Embedded and synthetic data read no files: a data.path would be silently ignored."""
    for key in ("path", "eval_path"):
        if getattr(d, key):
            made = "shipped inside dtcli" if d.source == "embedded" else "made in memory"
            raise UsageError(
                f"recipe key 'data.{key}': source {d.source} reads no files (its data is "
                f"{made}); to read MNIST files set data.source=idx (images: data.source=images, "
                "TFRecords: tfrecord, text: text), or remove data." + key
            )


def _check_reading(d: DataConfig) -> None:
    """How the examples are split, placed and shuffled."""
    if not 0 < d.eval_fraction < 1:
        raise UsageError(
            f"recipe key 'data.eval_fraction': expected a number in (0, 1), got {d.eval_fraction}"
        )
    if d.placement == "device" and d.source == "text":
        raise UsageError(
            "recipe key 'data.placement': source text gathers its windows on the host (a few "
            "bytes a step); use auto or host"
        )
    if d.placement == "device" and d.source in STREAMED_SOURCES:
        raise UsageError(
            f"recipe key 'data.placement': device needs an in-memory source (embedded, idx, "
            f"synthetic); source {d.source} is streamed, never held whole (use auto or host)"
        )
    if d.shuffle_buffer <= 0:
        raise UsageError(
            f"recipe key 'data.shuffle_buffer': expected a positive integer, got {d.shuffle_buffer}"
        )
    for key in ("train_range", "eval_range"):
        rng = getattr(d, key)
        if rng is not None and not 0 <= rng[0] < rng[1]:
            raise UsageError(
                f"recipe key 'data.{key}': expected [start, stop) with 0 <= start < stop, "
                f"got {list(rng)}"
            )


def _check_host_memory(d: DataConfig) -> None:
    """Sizes that would not fit in half of this machine's memory (skipped where it is unknown)."""
    memory = _physical_memory()
    if not memory:
        return
    if d.source == "synthetic":
        _check_synthetic_memory(d, memory)
    example = _example_values(d)
    for key in ("batch_size", "eval_batch_size"):
        size = getattr(d, key)
        if size is not None and size * example * 4 > memory // 2:
            raise UsageError(
                f"recipe key 'data.{key}': a batch of {size} examples of {example} values needs "
                f"{_gib(size * example * 4)} of host memory, more than half of this machine's "
                f"{_gib(memory)}"
            )


def _example_values(d: DataConfig) -> int:
    """The values in one example as the source gives it (before the model sees it)."""
    if d.source in ("synthetic", "tfrecord", "images"):
        return math.prod(d.shape)
    if d.source in TEXT_SOURCES:
        return (d.context or 1) * (3 if d.packing else 1)
    return 64 if d.source == "embedded" else 28 * 28


def _check_synthetic_memory(d: DataConfig, memory: int) -> None:
    """Synthetic data is made whole on the host: its examples, and the map that labels them."""
    half = memory // 2
    example = math.prod(d.shape)
    total = (d.count + d.eval_count) * example * 4
    if total > half:
        key = "data.eval_count" if d.eval_count > d.count else "data.count"
        raise UsageError(
            f"recipe key '{key}': synthetic data of {d.count} train + {d.eval_count} eval "
            f"examples (data.count, data.eval_count) of shape {list(d.shape)} (data.shape) "
            f"needs {_gib(total)} of host memory, more than half of this machine's "
            f"{_gib(memory)}"
        )
    weights = example * d.classes * 4  # the linear map that makes the labels
    if weights > half:
        raise UsageError(
            f"recipe key 'data.classes': {d.classes} classes of examples of shape "
            f"{list(d.shape)} need {_gib(weights)} of host memory to label, more than half "
            f"of this machine's {_gib(memory)}"
        )
