"""What every kind of model gives its callers (`Built`), and the one-line error texts of models/."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dtcli.errors import one_line
from dtcli.layout import WeightInfo


@dataclass
class Built:
    """A model on the mesh, seen the same way whatever its API."""

    module: Any  # the tf_keras.Model or tf.Module, tracked by checkpoints
    forward: Any  # (x, training) -> logits
    regularization: Any  # () -> scalar tensor, or None when the model has none
    trainable_variables: list
    weights: list[WeightInfo]
    variables: dict[str, Any]  # every weight by its path (the keys the layout rules match)
    # "keras" or "core" (model.api): the optimizer that fits the model (optimizers.make).
    api: str
    # A user's own model (`model.build`) may branch on tensors in Python, which only AutoGraph
    # turns into graph ops; dtcli's own layers never do.
    needs_autograph: bool = False
    # What a checkpoint holds of the model (tf.train.Checkpoint's keyword arguments), where not
    # the whole module: a LoRA model's adapters alone (models.lora.tracker), never its base.
    saved: dict[str, Any] | None = None

    def checkpointed(self) -> dict[str, Any]:
        """The model's part of a checkpoint: {"model": module}, or {"lora": its adapters}."""
        return self.saved or {"model": self.module}

    @property
    def adapters(self) -> dict[str, Any]:
        """LoRA's adapters by path (none without LoRA)."""
        return dict(self.saved["lora"].adapters) if self.saved else {}


_KERAS_CALL = re.compile(r"Exception encountered when calling layer ['\"]([^'\"]*)['\"]")


def _keras_cause(exc: BaseException) -> str:
    """An exception's message, without the wrapping Keras adds to errors raised in a layer's
    call ("Exception encountered when calling layer 'x' ...", the cause on a later line): the
    cause, with the layer's name."""
    text = str(exc)
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        text = exc.args[0]  # str(KeyError) is the repr of its message
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    wrapped = _KERAS_CALL.match(lines[0]) if lines else None
    if wrapped and len(lines) > 1:
        return f"{lines[1]} (in layer '{wrapped.group(1)}')"
    return text


def message_line(exc: BaseException) -> str:
    """The first line of an exception's message (errors.one_line) as Keras raised it."""
    return one_line(exc, text=_keras_cause(exc))


def first_line(exc: BaseException) -> str:
    """`TypeName: first line of the message`, for one-line errors (errors.one_line)."""
    return one_line(exc, named=True, text=_keras_cause(exc))


def with_article(noun: str) -> str:
    """'a dict', 'an int'."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
