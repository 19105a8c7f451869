"""Instruction examples as token windows: a rendered conversation's ids and which of them are
responses, cut to the context as data.truncate says, then laid out one per window (padded) or
packed several to a window. No TensorFlow.

A window of an example of L ids holds them at positions 0..L-1; the target at position t is
id t+1 where that id is a response token (every id with data.mask_prompt false), else -1, and
-1 at the example's last position (it predicts nothing: in a packed window the next
example's first id follows) and at padding. A packed window's x is [3, context]: the ids, the
segment of each position (1, 2, ... per example, 0 for padding), and its position inside its
example (0 at each example's first id; 0 for padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtcli.data.tokenizer import EOT_TOKEN, ByteTokenizer, Tokenizer
from dtcli.errors import UsageError

# The rows of a packed window's x.
IDS, SEGMENTS, POSITIONS = 0, 1, 2


@dataclass(frozen=True)
class Example:
    ids: np.ndarray  # int32 [L]
    response: np.ndarray  # bool [L]: the id is a response token (assistant text, end of turn)


class TextEncoder:
    """Rendered text -> ids and the [start, end) of each id in the text's characters.

    A Hugging Face tokenizer encodes the text whole without its post-processor (the template
    writes what the model reads; `bos_ids` are what that post-processor would put first);
    bytes: one id per byte, and EOT_TOKEN's text as the end-of-text id."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.bos_ids: tuple[int, ...] = () if isinstance(tok, ByteTokenizer) else _bos_ids(tok)

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not isinstance(self.tok, ByteTokenizer):
            enc = self.tok.tok.encode(text, add_special_tokens=False)
            offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
            return np.asarray(enc.ids, np.int32), offsets[:, 0], offsets[:, 1]
        ids, starts, ends = [], [], []
        at = 0
        for i, part in enumerate(text.split(EOT_TOKEN) if self.tok.eot is not None else [text]):
            if i:  # an end-of-text token before this part
                ids.append(np.array([self.tok.eot], np.int32))
                starts.append(np.array([at], np.int64))
                ends.append(np.array([at + len(EOT_TOKEN)], np.int64))
                at += len(EOT_TOKEN)
            data = np.frombuffer(part.encode(), np.uint8)
            # Each byte's character: a new one at every byte that is no UTF-8 continuation.
            chars = at + np.cumsum((data & 0xC0) != 0x80) - 1
            ids.append(data.astype(np.int32))
            starts.append(chars)
            ends.append(chars + 1)
            at += len(part)
        return np.concatenate(ids), np.concatenate(starts), np.concatenate(ends)

    def single_id(self, text: str) -> int | None:
        """The id `text` encodes to when it is one token of the vocabulary, else None."""
        ids = self.encode(text)[0]
        return int(ids[0]) if len(ids) == 1 else None


def _bos_ids(tok: Tokenizer) -> tuple[int, ...]:
    """The ids a Hugging Face tokenizer's post-processor puts before a text (its BOS)."""
    plain = tok.tok.encode("a", add_special_tokens=False).ids
    full = tok.tok.encode("a", add_special_tokens=True).ids
    at = len(full) - len(plain)
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            at = start
            break
    return tuple(full[:at])


def encoded(encoder: TextEncoder, text: str, spans: list[tuple[int, int]]) -> Example:
    """The ids of a rendered conversation and which lie in its assistant spans (a token that
    overlaps a span is in it: one that straddles the turn's start, " Paris" after "Assistant:",
    is the answer's first token). The tokenizer's BOS is put first where the template did not
    write it (never twice)."""
    ids, starts, ends = encoder.encode(text)
    response = np.zeros(len(ids), bool)
    for a, b in spans:
        response |= (starts < b) & (np.maximum(ends, starts + 1) > a)
    bos = encoder.bos_ids
    if bos and tuple(ids[: len(bos)]) != bos:
        ids = np.concatenate([np.asarray(bos, np.int32), ids])
        response = np.concatenate([np.zeros(len(bos), bool), response])
    return Example(ids, response)


def fit(example: Example, context: int, truncate: str, keep: int, where: str) -> Example:
    """`example` in at most `context` ids. prompt_start: the prompt's start is cut (after its
    first `keep` ids, the BOS) so that the responses fit; where they alone do not, the
    example's end is cut instead. end: the end is cut. refuse: one line naming `where`."""
    n = len(example.ids)
    if n <= context:
        return example
    if truncate == "refuse":
        raise UsageError(
            f"recipe key 'data.truncate': {where}: the example is {n} tokens, more than "
            f"data.context {context} (data.truncate: refuse; prompt_start or end cut it)"
        )
    found = np.flatnonzero(example.response)
    prompt = int(found[0]) if len(found) else n
    cut = n - context
    if truncate == "prompt_start" and prompt - keep >= cut:
        take = np.r_[0:keep, keep + cut : n]
        return Example(example.ids[take], example.response[take])
    return Example(example.ids[:context], example.response[:context])


def targets(example: Example, mask_prompt: bool) -> np.ndarray:
    """y of the example's positions: the next id where it is in the loss, else -1."""
    y = np.full(len(example.ids), -1, np.int32)
    later = example.ids[1:]
    y[:-1] = later if not mask_prompt else np.where(example.response[1:], later, -1)
    return y


def window(
    examples: list[Example], context: int, pad_id: int, packed: bool, mask_prompt: bool
) -> tuple[np.ndarray, np.ndarray]:
    """x ([context], or [3, context] packed) and y [context] of a window holding `examples`
    one after another, then padding (`pad_id`, target -1)."""
    x = np.zeros((3, context), np.int32)
    x[IDS] = pad_id
    y = np.full(context, -1, np.int32)
    at = 0
    for segment, example in enumerate(examples, start=1):
        n = len(example.ids)
        if at + n > context:
            raise ValueError(f"examples of {at + n} ids do not fit a window of {context}")
        x[IDS, at : at + n] = example.ids
        x[SEGMENTS, at : at + n] = segment
        x[POSITIONS, at : at + n] = np.arange(n)
        y[at : at + n] = targets(example, mask_prompt)
        at += n
    return (x if packed else x[IDS]), y


def pack(lengths: np.ndarray, context: int, packed: bool) -> np.ndarray:
    """Window starts of examples of `lengths` taken in order: window i holds examples
    starts[i]:starts[i+1]. Packed: greedily as many as fit; else one each."""
    if not packed:
        return np.arange(len(lengths) + 1, dtype=np.int64)
    starts = [0]
    used = 0
    for i, n in enumerate(lengths):
        if used + n > context:
            starts.append(i)
            used = 0
        used += int(n)
    if len(lengths):
        starts.append(len(lengths))
    return np.asarray(starts, np.int64)
