"""Export a checkpoint as a SavedModel that serves plain tensors on one device.

DTensor layouts are not part of a SavedModel's contract (TensorFlow drops the annotations), so
the export is explicit about it: the model is rebuilt with plain variables on one device, the
checkpoint (written on any mesh) restored into it, and a serving signature taking a float32 batch
of examples and returning logits and class probabilities is saved.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import rundir
from dtcli.errors import UsageError
from dtcli.export import plain
from dtcli.recipe import Recipe

FORMATS = ("savedmodel", "hf", "peft")


def export_path(
    path: Path,
    out: Path,
    format: str = "savedmodel",
    dtype: str | None = None,
    max_shard_size: str | None = None,
    merge: bool = False,
) -> Path:
    """`dtcli export`: a checkpoint folder, or a run directory's newest intact checkpoint, with
    the recipe stored with it, as a SavedModel, a Hugging Face model folder (`format` hf:
    export/hf.py; `dtype` and `max_shard_size` are its options; `merge`: a LoRA run's adapters
    folded into its base) or a LoRA run's adapters as a peft folder (`format` peft:
    export/peft.py)."""
    from dtcli.export import hf, peft

    if format not in FORMATS:
        raise UsageError(f"--format {format!r}: expected one of {', '.join(FORMATS)}")
    if format != "hf" and (dtype or max_shard_size):
        raise UsageError("--dtype and --max-shard-size: only with --format hf")
    if merge and format != "hf":
        raise UsageError("--merge: only with --format hf (the adapters folded into the base)")
    shard = hf.parse_size(max_shard_size) if max_shard_size else hf.DEFAULT_SHARD_BYTES

    def write(found: Path, held: Path) -> Path:
        recipe = rundir.checkpoint_recipe(held, "export")
        _check_adapters(recipe, format, merge)
        if format == "hf":
            return hf.export_hf(found, held, recipe, out, dtype, shard, merge)
        if format == "peft":
            return peft.export_peft(found, held, recipe, out)
        return export(found, recipe, out, held)

    return rundir.read_checkpoint(path, write)


def _check_adapters(recipe: Recipe, format: str, merge: bool) -> None:
    """A LoRA run exports its adapters (peft) or its base with them folded in (hf --merge); a
    run without LoRA has neither."""
    if recipe.lora is None:
        if format == "peft":
            raise UsageError(
                "--format peft: the run has no LoRA adapters (its recipe's lora is null); "
                "--format hf exports its whole model"
            )
        if merge:
            raise UsageError(
                "--merge: the run has no LoRA adapters to fold in (its recipe's lora is null); "
                "drop --merge"
            )
    elif format == "hf" and not merge:
        raise UsageError(
            "--format hf: the run holds LoRA adapters beside a frozen base; add --merge (the "
            "adapters folded into the base's weights) or use --format peft (the adapters alone)"
        )


def export(checkpoint: Path, recipe: Recipe, out: Path, held: Path | None = None) -> Path:
    """`checkpoint` as a SavedModel at `out`; its files read through `held` where given (the
    folder checkpoint.held gives: a run in training may remove the checkpoint meanwhile)."""
    from dtcli import tfruntime

    held = checkpoint if held is None else held
    out = rundir.check_new_local_folder(out, "export")
    meta = ckpt_lib.read_meta(held)
    input_shape, num_classes = _shapes(checkpoint, meta)
    # Plain variables on the host's first CPU: no mesh, so no device configuration either.
    tf = tfruntime.import_tensorflow()
    with tf.device("/CPU:0"):
        model = plain.restored_model(tf, recipe, checkpoint, held, input_shape, num_classes)

        language = recipe.task == "language_model"
        # A language model takes token ids; a classifier preprocessed float32 examples.
        module = _serving(tf, model, input_shape, tf.int32 if language else tf.float32)
        tmp = out.with_name(f".{out.name}.tmp")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})
            if language:
                _with_tokenizer(tmp, checkpoint)
            _finish(tmp, out, checkpoint, meta, input_shape, num_classes, recipe)
        except (OSError, tf.errors.OpError) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            reason = rundir.os_reason(exc) if isinstance(exc, OSError) else exc.message
            raise UsageError(
                f"--out {str(out)!r}: cannot write the SavedModel ({reason})"
            ) from None
    return out


def _shapes(checkpoint: Path, meta: dict[str, Any]) -> tuple[tuple[int, ...], int]:
    """The model's input shape and class count, as the checkpoint's meta.json holds them."""
    try:
        input_shape = tuple(int(d) for d in meta["input_shape"])
        num_classes = int(meta["num_classes"])
    except (KeyError, TypeError, ValueError):
        raise ckpt_lib.DamagedCheckpoint(
            checkpoint, "meta.json lacks a valid input_shape/num_classes"
        ) from None
    return input_shape, num_classes


def _serving(tf: Any, model: Any, input_shape: tuple[int, ...], dtype: Any) -> Any:
    """The module a SavedModel saves: `serve` takes a batch of `dtype` examples, returns logits
    and probabilities."""

    class Serving(tf.Module):
        def __init__(self, net: Any):
            super().__init__(name="dtcli_export")
            self.net = net

        @tf.function(input_signature=[tf.TensorSpec([None, *input_shape], dtype, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            logits = self.net(x, training=False)
            return {"logits": logits, "probabilities": tf.nn.softmax(logits)}

    return Serving(model)


def _finish(
    tmp: Path,
    out: Path,
    checkpoint: Path,
    meta: dict[str, Any],
    input_shape: tuple[int, ...],
    num_classes: int,
    recipe: Recipe,
) -> None:
    (tmp / "dtcli_export.json").write_text(
        json.dumps(
            {
                "checkpoint": str(checkpoint),
                "step": meta["step"],
                "input_shape": list(input_shape),
                "num_classes": num_classes,
                "trained_on_mesh": meta["mesh"],
                "note": "plain tensors on one device; the DTensor layouts of training are not kept",
                "inputs": (
                    f"int32 token ids of shape [batch, context] ({rundir.TOKENIZER} beside this "
                    f"file encodes and decodes them); logits and probabilities [batch, context, "
                    f"{num_classes}] predict the next token at each position (ids from the "
                    "tokenizer's size on are padding, never a token)"
                    if recipe.task == "language_model"
                    else "float32 of shape [batch, *input_shape], preprocessed as in training: "
                    "pixel values scaled to [0, 1]"
                    + (", images flattened" if recipe.data.flatten else "")
                ),
            },
            indent=1,
        )
    )
    if out.exists():
        out.rmdir()
    tmp.rename(out)


def _with_tokenizer(folder: Path, checkpoint: Path) -> None:
    """A language model's export carries its run's tokenizer (a run from before tokenizers
    saved none: its tokens are bytes)."""
    from dtcli.data import tokenizer as tokenizer_lib

    tok = tokenizer_lib.read_saved(rundir.tokenizer_file(checkpoint))
    (folder / rundir.TOKENIZER).write_text((tok or tokenizer_lib.ByteTokenizer()).to_json())
