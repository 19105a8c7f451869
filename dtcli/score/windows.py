"""The windows that score a text, and what each scores (no TensorFlow).

A text of n tokens has n - 1 predictions: prediction k is token k + 1 given tokens 0..k. A window
is up to `context` consecutive tokens [start, end) of the model's input; its position j predicts
token start + j + 1 from tokens start..start + j. A text of at most context + 1 tokens is one
window. A longer one is scored as Hugging Face's perplexity recipe does, a sliding window:
windows start at 0, stride, 2 x stride, ... while a window ends before the last prediction, and
a last window ends at the last prediction (it starts context tokens before it, so it too is
whole). Each window scores only the predictions no earlier window made, so every token after
the first is scored exactly once, and one scored in a later window sees at least
context - stride tokens before it (the default stride, context // 2, gives each at least half a
context). stride = context: windows that do not overlap, each token scored in the window that
holds the token before it (the cheapest; a window's first predictions see few tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtcli.errors import UsageError


def default_stride(context: int) -> int:
    return max(1, context // 2)


def check_stride(stride: int | None, context: int | None = None) -> int:
    """--stride: above 0 and at most the context (once it is known); None: the default."""
    if stride is not None and stride < 1:
        raise UsageError(f"--stride {stride}: expected a positive integer (at most the context)")
    if context is None:
        return stride or 0
    if stride is None:
        return default_stride(context)
    if stride > context:
        raise UsageError(
            f"--stride {stride}: expected at most the model's context, {context} tokens "
            "(a larger stride would leave tokens unscored)"
        )
    return stride


@dataclass(frozen=True)
class Window:
    start: int  # its first token
    end: int  # one past its last token: it predicts tokens start + 1 .. end
    scored: int  # the first prediction it scores (it scores predictions scored .. end - 1)


def windows(tokens: int, context: int, stride: int) -> list[Window]:
    """The windows of a text of `tokens` tokens (see the module's docstring), in order."""
    predictions = tokens - 1
    last = max(0, predictions - context)
    starts = [*range(0, last, stride), last]
    out, done = [], 0
    for start in starts:
        end = min(start + context, predictions)
        out.append(Window(start, end, done))
        done = end
    return out


def batch(
    ids: np.ndarray, group: list[Window], context: int, rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A batch of `rows` rows for the windows `group` (padding rows after them): each row's
    input tokens [rows, context] and targets [rows, context] (right-padded with 0s: a causal
    model's predictions before the padding do not see it), and which of its predictions it
    scores [rows, context] (bool; none in padding)."""
    inputs = np.zeros((rows, context), np.int32)
    targets = np.zeros((rows, context), np.int32)
    scored = np.zeros((rows, context), bool)
    for row, w in enumerate(group):
        length = w.end - w.start
        inputs[row, :length] = ids[w.start : w.end]
        targets[row, :length] = ids[w.start + 1 : w.end + 1]
        scored[row, w.scored - w.start : length] = True
    return inputs, targets, scored
