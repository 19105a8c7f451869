"""A checkpoint restored onto plain variables (no mesh, so no device configuration): what both
export formats write from (a SavedModel, a Hugging Face folder). A LoRA run's checkpoint holds
its adapters alone: its base is loaded first (session.finetune: checked to be the checkpoint's),
then the adapters; `lora_adapters` gives the adapters alone, as arrays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtcli.errors import UsageError, one_line
from dtcli.recipe import LoraConfig, Recipe, TransformerConfig


def restored_model(
    tf: Any,
    recipe: Recipe,
    checkpoint: Path,
    held: Path,
    input_shape: tuple[int, ...],
    num_classes: int,
) -> Any:
    """The recipe's model built with plain variables (under the caller's tf.device) and the
    checkpoint's weights read into it through `held` (a LoRA checkpoint: its base, then its
    adapters); one line where they do not fit."""
    from dtcli import models

    model = models.build_plain(recipe, input_shape, num_classes)
    objects = {"model": model}
    if recipe.lora is not None:
        objects = _with_base(recipe, model, held, (input_shape, num_classes))
    try:
        tf.train.Checkpoint(**objects).read(str(held / "ckpt")).expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as exc:
        raise UsageError(
            f"checkpoint {checkpoint}: does not fit its recipe's model ({one_line(exc)})"
        ) from None
    return model


def _with_base(
    recipe: Recipe, model: Any, held: Path, data_shape: tuple[tuple[int, ...], int]
) -> dict[str, Any]:
    """A LoRA model of plain variables with the recipe's base loaded into it, once checked to
    be the checkpoint's; what the checkpoint holds of it (its adapters). `data_shape`: the
    model's input shape and classes."""
    from dtcli import checkpoint as ckpt_lib
    from dtcli import models
    from dtcli.layout import WeightInfo
    from dtcli.models.keras import keras_variables
    from dtcli.session import finetune

    variables = {path: var for path, var, _ in keras_variables(model)}
    weights = [
        WeightInfo(path, tuple(var.shape), "", var.trainable, var.dtype.name)
        for path, var in variables.items()
    ]
    built = models.Built(model, None, None, [], weights, variables, "keras")
    finetune.load_checked(recipe, built, None, data_shape, ckpt_lib.read_meta(held), held)
    return {"lora": models.lora.tracker(variables)}


@dataclass(frozen=True)
class LoraAdapters:
    """A LoRA checkpoint's adapters, what a PEFT export writes."""

    arrays: dict[str, np.ndarray]  # by dtcli path: {"block_0.attention.query.lora_a": ...}
    lora: LoraConfig
    transformer: TransformerConfig  # the base's


def lora_adapters(recipe: Recipe, held: Path) -> LoraAdapters:
    """The adapters of the LoRA checkpoint `held` (its recipe `recipe`) as float32 arrays by
    path (shapes: models.lora), after its base is checked to be the recipe's; the base's
    weights are not loaded."""
    from dtcli import checkpoint as ckpt_lib
    from dtcli import tfruntime
    from dtcli.models import lora
    from dtcli.session import finetune

    if recipe.lora is None:
        raise UsageError(f"checkpoint {ckpt_lib.shown(held)}: holds no LoRA adapters (no lora)")
    meta = ckpt_lib.read_meta(held)
    finetune.check_base(finetune.base_record(recipe), meta, held)
    tf = tfruntime.import_tensorflow()
    shapes = {p: s for p, s in meta["weights"].items() if lora.is_adapter(p)}
    with tf.device("/CPU:0"):
        variables = {p: tf.Variable(tf.zeros(s, tf.float32)) for p, s in shapes.items()}
        try:
            status = tf.train.Checkpoint(lora=lora.tracker(variables)).read(str(held / "ckpt"))
            status.expect_partial().assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            raise UsageError(
                f"checkpoint {ckpt_lib.shown(held)}: does not hold its adapters ({one_line(exc)})"
            ) from None
    arrays = {p: v.numpy() for p, v in variables.items()}
    return LoraAdapters(arrays, recipe.lora, recipe.model.transformer)
