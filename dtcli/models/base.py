"""What every kind of model gives its callers (`Built`), and the one-line error texts of models/."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

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


_KERAS_CALL = re.compile(r"Exception encountered when calling layer ['\"]([^'\"]*)['\"]")


def message_line(exc: BaseException) -> str:
    """The first line of an exception's message (the type's name when it has none).

    Keras wraps errors raised in a layer's call as "Exception encountered when calling layer 'x'
    ...", the cause on a later line: that line is kept, with the layer's name."""
    text = str(exc)
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        text = exc.args[0]  # str(KeyError) is the repr of its message
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    where = ""
    wrapped = _KERAS_CALL.match(lines[0]) if lines else None
    if wrapped and len(lines) > 1:
        where = f" (in layer '{wrapped.group(1)}')"
        lines = lines[1:]
    return f"{lines[0]}{where}" if lines else type(exc).__name__


def first_line(exc: BaseException) -> str:
    """`TypeName: first line of the message`, for one-line errors."""
    return f"{type(exc).__name__}: {message_line(exc)}"


def with_article(noun: str) -> str:
    """'a dict', 'an int'."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
