"""lm-eval's requests on the host, no TensorFlow and no lm_eval: each loglikelihood request cut
as lm-eval's `hf` model cuts it, the batches they run in (fixed shapes, so each lowers once), and
a generation's prompt cut to leave room for its new tokens.

A loglikelihood request (context ids, continuation ids) is scored over (context +
continuation)[-(max_length + 1):]: its input all but the last of those tokens, its targets all
but the first, its continuation's log probabilities the last len(continuation) targets' (all of
them where the continuation alone is longer than the context). Requests run in batches of `rows`
rows, longest first (lm-eval's order too), each batch padded on the right (which a causal
model's real positions never see) to a length of a small fixed set, so that each shape lowers
and compiles once: dtcli's own GPT takes the smallest power of two from MIN_WINDOW (16) that holds
the batch's longest request, at most the context (a multiple-choice request of 20 tokens need not
cost a 1,024-token window: at most log2(context / MIN_WINDOW) + 1 shapes); any other model
takes the context (its input is built at that length).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Scored:
    """One loglikelihood request as the model sees it."""

    inputs: tuple[int, ...]  # the window: (context + continuation)[-(max_length + 1):][:-1]
    targets: tuple[int, ...]  # the token after each input token
    continuation: int  # the last this many targets are the continuation's

    @property
    def length(self) -> int:
        return len(self.inputs)


def scored(context: Sequence[int], continuation: Sequence[int], max_length: int) -> Scored:
    """The request (context ids, continuation ids) left-truncated to `max_length` input
    tokens, as lm-eval's hf model truncates it."""
    whole = [*context, *continuation][-(max_length + 1) :]
    return Scored(tuple(whole[:-1]), tuple(whole[1:]), min(len(continuation), len(whole) - 1))


def rows_for(batch: int, shards: int) -> int:
    """Rows of a batch: `batch` rounded up to a multiple of the data axis' `shards`."""
    return -(-batch // shards) * shards


def batches(requests: Sequence[Scored], rows: int) -> Iterator[list[int]]:
    """The request indices of each batch of `rows`, longest requests first (a stable sort: the
    same batches on every client)."""
    order = sorted(range(len(requests)), key=lambda i: -requests[i].length)
    for first in range(0, len(order), rows):
        yield order[first : first + rows]


MIN_WINDOW = 16  # the shortest window a batch is padded to


def window_length(longest: int, context: int, any_length: bool) -> int:
    """The length a batch whose longest request has `longest` input tokens is padded to."""
    if not any_length:
        return context
    length = MIN_WINDOW
    while length < longest:
        length *= 2
    return min(length, context)


def batch_arrays(
    group: Sequence[Scored], rows: int, length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """inputs and targets [rows, length] int32 (`length`: window_length's; right-padded with 0s,
    padding rows after the requests) and which targets are a continuation's [rows, length]
    bool."""
    inputs = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length), np.int32)
    continuation = np.zeros((rows, length), bool)
    for row, request in enumerate(group):
        n = request.length
        inputs[row, :n] = request.inputs
        targets[row, :n] = request.targets
        continuation[row, n - request.continuation : n] = True
    return inputs, targets, continuation


def generation_prompt(ids: Sequence[int], max_length: int, max_gen_toks: int) -> list[int]:
    """A generation's prompt left-truncated to max_length - max_gen_toks tokens, as lm-eval's hf
    model cuts it, so that the prompt and its new tokens fit the context."""
    keep = max_length - max_gen_toks
    return list(ids)[-keep:] if keep > 0 else []


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """`text` before the first occurrence of any of `until` (empty strings ignored)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text
