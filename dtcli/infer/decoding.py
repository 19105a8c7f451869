"""Generation's host side, without TensorFlow: the windowing policy, the rows of a batch of
prompts, sampling (temperature, top-k, top-p) and stopping at end of document.

The windowing policy (one for both forward passes, so greedy text is the same with and without
the K/V cache): a model with learned absolute positions sees at most `context` tokens, each at
its position from the window's start. While the text (prompt and new tokens) fits, the window is
all of it. When a new token would not fit, the window starts anew at the last `context // 2`
tokens (`restart_keep`) and grows again, one token per step, up to `context`; and so on. The
window of a text of n tokens is a function of n alone (`window_start`), so a long prompt starts
where a short one that grew to its length would be. The cached forward pass refills its cache
with one pass over the new window at each restart, then adds one position per token; the window
forward pass (--no-cache) runs the same window again for every token.

nanoGPT instead crops to the last `block_size` tokens at every step: each token past the first
`context` sees a full window, and costs a pass over all of it (no cache can slide absolute
positions). Here a token sees between context // 2 and context tokens once the text is longer
than the context; up to there the text is the same as nanoGPT's.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import numpy as np


def restart_keep(context: int) -> int:
    """The tokens a window keeps when it starts anew."""
    return max(1, context // 2)


def window_start(n: int, context: int) -> int:
    """Where the window of a text of `n` tokens starts (the policy above): 0 while n <= context;
    then restarts at n = context + 1, and every (context - keep + 1) tokens after, each keeping
    the last `keep` tokens (the window then grows from keep to context tokens)."""
    if n <= context:
        return 0
    keep = restart_keep(context)
    return n - keep - (n - context - 1) % (context - keep + 1)


@dataclass
class Step:
    """What a forward pass gets for one step of a batch of rows (one row per prompt, padded)."""

    windows: np.ndarray  # [rows, context] int32: each row's window, right-padded with 0s
    lengths: np.ndarray  # [rows] int: tokens in each window (the logits wanted: at length - 1)
    restart: np.ndarray  # [rows] bool: the window starts anew here (a cache refills from it)
    active: np.ndarray  # [rows] bool: the row still generates (others: padding, or stopped)

    @property
    def last(self) -> np.ndarray:
        """[rows, context] bool, one-hot at each row's last token."""
        return np.arange(self.windows.shape[1])[None, :] == (self.lengths - 1)[:, None]


# A forward pass: a step -> the logits [rows, vocab] at each row's last window position.
Forward = Callable[[Step], np.ndarray]


def run(
    prompts: list[np.ndarray],
    forward: Forward,
    context: int,
    tokens: int,
    rows: int,
    pick_row: Callable[[int, np.ndarray], int],
    stop_ids: Collection[int] = (),
    ends: Callable[[int, int], bool] | None = None,
) -> Iterator[list[tuple[int, int]]]:
    """Up to `tokens` new tokens after each prompt, a step at a time: each step yields the
    (prompt index, token) of every prompt still generating. The prompts fill the first rows of
    `rows` (the rest are padding, never active); `pick_row(index, logits)` picks a token. A
    prompt stops after any of `stop_ids` (its end-of-document or end-of-sequence ids; the token
    is yielded), or where `ends(index, token)` says its text is complete (lm-eval's stop
    strings); the others go on."""
    texts = [[int(t) for t in p] for p in prompts] + [[0]] * (rows - len(prompts))
    active = np.arange(rows) < len(prompts)
    starts = np.full(rows, -1)  # the window start each row's last step used (-1: none yet)
    for _ in range(tokens):
        step = _step(texts, context, starts, active)
        logits = forward(step)
        picked = []
        for i in np.flatnonzero(active):
            token = pick_row(int(i), logits[i])
            texts[i].append(token)
            picked.append((int(i), token))
            if token in stop_ids or (ends is not None and ends(int(i), token)):
                active[i] = False
        yield picked
        if not active.any():
            return


def _step(texts: list[list[int]], context: int, starts: np.ndarray, active: np.ndarray) -> Step:
    rows = len(texts)
    windows = np.zeros((rows, context), np.int32)
    lengths = np.zeros(rows, np.int64)
    restart = np.zeros(rows, bool)
    for i, text in enumerate(texts):
        start = window_start(len(text), context)
        window = text[start:]
        windows[i, : len(window)] = window
        lengths[i] = len(window)
        restart[i] = start != starts[i]
        if active[i]:
            starts[i] = start
    return Step(windows, lengths, restart, active.copy())


def pick(
    logits: np.ndarray,
    temperature: float,
    top_k: int | None,
    rng: np.random.Generator,
    vocab: int | None = None,
    top_p: float | None = None,
) -> int:
    """The next token: the most likely (temperature 0), or a draw from the softmax of logits /
    temperature over the top_k most likely, then over the fewest most likely whose
    probabilities add up to top_p (nucleus sampling); only ids below `vocab` (the tokenizer's:
    the model's vocabulary is rounded up past it, and those ids are never a token)."""
    logits = np.asarray(logits, np.float64)
    if vocab is not None and vocab < len(logits):
        logits = np.concatenate([logits[:vocab], np.full(len(logits) - vocab, -np.inf)])
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = logits / temperature
    if top_k is not None and top_k < len(scaled):
        cut = np.sort(scaled)[-top_k]
        scaled = np.where(scaled < cut, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p is not None and top_p < 1:
        probs = _nucleus(probs, top_p)
    return int(rng.choice(len(probs), p=probs))


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """`probs` over the fewest most likely tokens whose probabilities add up to `top_p` (the
    most likely always kept; ties in id order, as argmax breaks them), renormalized."""
    order = np.argsort(-probs, kind="stable")
    kept = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
    out = np.zeros_like(probs)
    out[order[:kept]] = probs[order[:kept]]
    return out / out.sum()


def stop_ids(eot: int | None, end_of_sequence: Collection[int] | None) -> frozenset[int]:
    """The ids that end a generation (generate's and lm-eval's generate_until): an imported
    run's end-of-sequence ids where it has them (hf.tokenizer_files.end_of_sequence_ids: several
    for Llama 3, as transformers' generate stops), else the tokenizer's end of text `eot` (where
    it has one)."""
    if end_of_sequence is not None:
        return frozenset(end_of_sequence)
    return frozenset(() if eot is None else (eot,))


class NewText:
    """A row's new tokens as text, as they come: their bytes (`pieces`, by id; an id past them,
    such as an imported vocabulary's that the tokenizer lacks, is no text) decoded as UTF-8,
    invalid sequences replaced; the `hidden` ids' bytes left out (an end of turn)."""

    def __init__(self, pieces: list[bytes], hidden: Collection[int] = frozenset()):
        self.pieces = pieces
        self.hidden = hidden
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # so far

    def add(self, token: int) -> str:
        """`token`'s text (empty while its bytes end no UTF-8 character)."""
        hidden = token in self.hidden or token >= len(self.pieces)
        piece = self.decoder.decode(b"" if hidden else self.pieces[token])
        self.text += piece
        return piece

    def end(self) -> str:
        """The text of a last incomplete UTF-8 sequence (replaced), once the tokens end."""
        piece = self.decoder.decode(b"", final=True)
        self.text += piece
        return piece

    def whole(self) -> str:
        self.end()
        return self.text
