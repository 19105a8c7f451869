"""What the streamed sources (tfrecord, images, tfds) share: a seed per (epoch, group), shares of
examples dealt to client groups, the last step of every decoder (`as_model_input`), and read
errors turned into one line naming the recipe key to change.

Each streamed source module has `examples`, `share_counts` and `read_error` for its own kind;
dtcli.data picks the module by `Stream.kind`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from dtcli.data.base import Stream
from dtcli.errors import UsageError, one_line

# A source's `examples`: (stream, seed, epoch, shuffle, group, groups) -> tf.data.Dataset.
Examples = Callable[[Stream, int, int, bool, int, int], Any]
# A source's `read_error`: (stream, the op error's text) -> the one line to raise.
ReadError = Callable[[Stream, str], str]


def shuffle_seed(seed: int, epoch: int, group: int) -> int:
    """The shuffle buffer's seed of one group in one epoch."""
    return int(np.random.default_rng([seed, epoch, group]).integers(2**31 - 1))


def example_shares(stream: Stream, groups: int) -> list[int]:
    """The examples each of `groups` client groups reads when every group keeps every n-th."""
    total = len(stream)
    return [len(range(g, total, groups)) for g in range(groups)]


def as_model_input(x: Any, y: Any, stream: Stream) -> tuple[Any, Any]:
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


def op_error_text(exc: BaseException) -> str:
    """The cause in a TensorFlow op error, without the function and iterator names around it."""
    text = getattr(exc, "message", None) or str(exc)
    cause = re.search(r"with iterator: Iterator::\S+?: (.*)", text, re.S)
    return one_line(exc, text=cause.group(1) if cause else text)


@contextlib.contextmanager
def reading(stream: Stream, read_error: ReadError) -> Iterator[None]:
    """Errors while reading a stream, in one line naming the recipe key to change."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        raise UsageError(read_error(stream, op_error_text(exc))) from None


def check_first(stream: Stream, examples: Examples, read_error: ReadError) -> None:
    """Decode the first example now, so that a wrong key, shape or type is a recipe error
    before any training rather than a failure mid-epoch."""

    ds = examples(stream, 0, 0, False, 0, 1).take(1)
    with reading(stream, read_error):
        for _ in ds:
            pass


def failed(stream: Stream, text: str, key: str = "", hint: str = "") -> str:
    """The line for a failed read: the recipe key (default: the one the files came from)."""
    return f"recipe key '{key or stream.where}': reading {stream.kind} data failed ({text}){hint}"


def read_error(stream: Stream, text: str) -> str:
    """The line for a failed read that no source knows better: a label outside the classes
    names data.classes, anything else the key the files came from."""
    if "data.classes" in text:
        return failed(
            stream, text, "data.classes", f"; every label must be in [0, {stream.classes})"
        )
    return failed(stream, text)
