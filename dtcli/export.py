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
from dtcli.errors import UsageError
from dtcli.recipe import Recipe


def export(checkpoint: Path, recipe: Recipe, out: Path) -> Path:
    from dtcli import devices as devices_lib
    from dtcli import models

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {str(out)!r}: the folder exists and is not empty")
    tf = devices_lib.import_tensorflow()
    devices_lib.configure("cpu", None)
    meta = ckpt_lib.read_meta(checkpoint)
    input_shape = tuple(meta["input_shape"])
    num_classes = int(meta["num_classes"])
    with tf.device("/CPU:0"):
        model = models.build_plain(recipe.model, input_shape, num_classes)
        tf.train.Checkpoint(model=model).read(str(checkpoint / "ckpt")).expect_partial()

        class Serving(tf.Module):
            def __init__(self, net: Any):
                super().__init__(name="dtcli_export")
                self.net = net

            @tf.function(
                input_signature=[tf.TensorSpec([None, *input_shape], tf.float32, name="x")]
            )
            def serve(self, x: Any) -> dict[str, Any]:
                logits = self.net(x, training=False)
                return {"logits": logits, "probabilities": tf.nn.softmax(logits)}

        module = Serving(model)
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})
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
                    "float32 of shape [batch, *input_shape], preprocessed as in training: "
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
    return out
