"""A checkpoint restored onto plain variables (no mesh, so no device configuration): what both
export formats write from (a SavedModel, a Hugging Face folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli.errors import UsageError, one_line
from dtcli.recipe import Recipe


def restored_model(
    tf: Any,
    recipe: Recipe,
    checkpoint: Path,
    held: Path,
    input_shape: tuple[int, ...],
    num_classes: int,
) -> Any:
    """The recipe's model built with plain variables (under the caller's tf.device) and the
    checkpoint's weights read into it through `held`; one line where they do not fit."""
    from dtcli import models

    model = models.build_plain(recipe.model, input_shape, num_classes)
    try:
        tf.train.Checkpoint(model=model).read(str(held / "ckpt")).expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as exc:
        raise UsageError(
            f"checkpoint {checkpoint}: does not fit its recipe's model ({one_line(exc)})"
        ) from None
    return model
