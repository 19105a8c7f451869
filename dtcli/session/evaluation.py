"""Evaluating a session: loss and accuracy over every example of a split, each counted once (a
language model's perplexity and bits per byte too)."""

from __future__ import annotations

from typing import Any

from dtcli import pipeline as pipeline_lib
from dtcli.session.build import Session


def evaluate(
    session: Session, eval_step: Any, feed: pipeline_lib.Feed, packed: list | None = None
) -> dict[str, float]:
    """Loss and accuracy over every example of `feed`'s split, each counted exactly once."""
    ce = correct = count = 0.0
    batches = packed if packed is not None else map(session.packer.pack_batch, feed.epoch(0))
    for x, y, mask in batches:
        out = eval_step(x, y, mask)
        ce += float(out["ce_sum"])
        correct += float(out["correct"])
        count += float(out["count"])
    loss = ce / max(count, 1.0)
    if session.recipe.task == "language_model":  # counts are tokens
        import math

        result = {
            "loss": loss,
            "accuracy": correct / max(count, 1.0),
            "perplexity": math.exp(min(loss, 700.0)),
            "tokens": int(count),
        }
        text_bytes = getattr(feed.split, "target_bytes", None)
        if text_bytes:  # bits per UTF-8 byte of the text: compares across tokenizers
            result["bpb"] = ce / math.log(2) / text_bytes
        return result
    return {"loss": loss, "accuracy": correct / max(count, 1.0), "examples": int(count)}


def pack_all(session: Session, feed: pipeline_lib.Feed) -> list | None:
    """An in-memory split's batches packed once, to evaluate on again and again (a streamed
    split is read again each time: it need not fit in memory)."""
    if not feed.in_memory:
        return None
    return [session.packer.pack_batch(b) for b in feed.epoch(0)]
