"""One recipe, the same numbers on any mesh: 20 steps on 1 device, batch=8, batch=4 x model=2 and
model=8 end with the same weights and losses, for Keras Sequential, Functional and subclassed
models, a CNN, and the Core-API MLP, and for the streamed sources (TFRecord files, an image
folder).

Mesh-dependent initialization would fail it, and so would DTensor's all-reduce combining pass
reordering an update: with a gradient gathered inside the update (before steps/step.py laid each
gradient out as its weight), the functional and subclassed MLPs, whose biases stay replicated
while their kernels split, ended 1.09 (relative) away on batch=4,model=2 and model=8."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT

MESHES = ["batch=1", "batch=8", "batch=4,model=2", "model=8"]
TP_RULES = {
    r"dense_0\.kernel": ["unsharded", "model"],
    r"dense_0\.bias": ["model"],
    r"dense_1\.kernel": ["model", "unsharded"],
}
BUILT_RULES = {r"up\.kernel": ["unsharded", "model"], r"down\.kernel": ["model", "unsharded"]}
SMALL_CNN = (
    "model.layers=[{Conv2D: {filters: 8, kernel_size: 3, activation: relu}}, MaxPooling2D,"
    " Flatten, {Dense: {units: 32, activation: relu}}, {Dense: {units: 10}}]"
)


def optimizer_sets(opt: str) -> list[str]:
    return [
        "optimizer.name=" + opt,
        "optimizer.learning_rate=0.01",
        "optimizer.momentum=" + ("0.9" if opt == "sgd" else "0.0"),
    ]


CASES = {
    # Keras Adam is the CNN's, the Functional and the subclassed model's optimizer below.
    "keras-sgd": optimizer_sets("sgd"),
    "keras-adamw": optimizer_sets("adamw"),
    "core-sgd": optimizer_sets("sgd")
    + ["model.api=core", "model.layers=null", "model.hidden=[128]"],
    "core-adam": optimizer_sets("adam")
    + ["model.api=core", "model.layers=null", "model.hidden=[128]"],
    "cnn-adam": optimizer_sets("adam") + ["data.flatten=false", SMALL_CNN],
    "functional-adam": optimizer_sets("adam")
    + [
        "model.layers=null",
        "model.build=custom_models:functional_mlp",
        "layouts.rules=" + json.dumps(BUILT_RULES),
    ],
    "subclassed-adam": optimizer_sets("adam")
    + [
        "model.layers=null",
        "model.build=custom_models:subclassed_mlp",
        "layouts.rules=" + json.dumps(BUILT_RULES),
    ],
    # Streamed through tf.data (files permuted, a seeded shuffle buffer) instead of numpy.
    "tfrecord-adam": optimizer_sets("adam") + ["@tfrecord"],
    "images-adam": optimizer_sets("adam") + ["@images"],
}


# Every case on the 2-D mesh (batch and model axes at once). The pure meshes take the cases
# whose paths they exercise: data parallel every source (numpy, TFRecord files, an image folder)
# and both APIs; tensor parallel every kind of Keras model (Sequential, a CNN, Functional,
# subclassed) and the Core API. (Each run costs a model build and a compile: ~10 s here.)
PURE = {
    "batch=8": {"keras-adamw", "core-sgd", "tfrecord-adam", "images-adam"},
    "model=8": {"keras-sgd", "core-adam", "cnn-adam", "functional-adam", "subclassed-adam"},
}


def meshes_of(case: str) -> list[str]:
    return [m for m in MESHES if m not in PURE or case in PURE[m]]


def train_20_steps(
    mesh: str, files: dict[str, list[str]], use_devices: int | None = None
) -> tuple[dict, dict]:
    """Every case for 20 steps on `mesh` in this process -> (losses, axes, sharded), weights.
    `use_devices=1`: a mesh of this process's first device alone (as `dtcli doctor` compares).
    `files`: the recipe settings of the streamed sources (an "@name" in a case)."""
    from dtcli import models
    from dtcli import recipe as R
    from dtcli import session as T

    losses, arrays, sharded = {}, {}, {}
    for case, sets in CASES.items():
        if mesh not in meshes_of(case):
            continue
        sets = [x for s in sets for x in (files[s[1:]] if s.startswith("@") else [s])]
        recipe = R.load(ROOT / "recipes" / "quickstart.yaml", R.Overrides(sets, mesh, "cpu:8"))
        s = T.prepare(recipe, use_devices=use_devices)
        losses[case] = T.run_steps(s, 20)
        for path, value in models.host_weights(s.model, s.mesh).items():
            arrays[case + "/" + path] = value
        sharded[case] = [p.weight.path for p in s.plans if set(p.spec) != {"unsharded"}]
    return {
        "losses": losses,
        "axes": s.axes,
        "sharded": sharded,
        "devices": s.local_device_count,
    }, arrays


@pytest.fixture(scope="module")
def runs(cpu8, digit_files):
    """Every mesh in this process: batch=1 on its first device, the others on all 8."""
    out = {"batch=1": train_20_steps("batch=1", digit_files, use_devices=1)}
    for mesh in MESHES[1:]:
        out[mesh] = train_20_steps(mesh, digit_files)
    return out


def test_meshes_are_what_they_say(runs):
    assert runs["batch=1"][0]["axes"] == {"batch": 1, "model": 1}
    assert runs["batch=1"][0]["devices"] == 1
    assert {runs[mesh][0]["devices"] for mesh in MESHES[1:]} == {8}
    assert runs["batch=8"][0]["axes"] == {"batch": 8, "model": 1}
    assert runs["batch=4,model=2"][0]["axes"] == {"batch": 4, "model": 2}
    assert runs["model=8"][0]["axes"] == {"model": 8, "batch": 1}
    sharded = runs["model=8"][0]["sharded"]
    assert "dense_0.kernel" in sharded["keras-sgd"] and "dense_0.kernel" in sharded["cnn-adam"]
    assert "dense_0.kernel" in runs["batch=4,model=2"][0]["sharded"]["keras-adamw"]
    assert "conv2d_0.kernel" not in sharded["cnn-adam"]
    assert sharded["functional-adam"] == ["up.kernel", "down.kernel"]
    assert sorted(sharded["subclassed-adam"]) == ["down.kernel", "up.kernel"]


@pytest.mark.parametrize(
    "case, mesh", [(c, m) for c in CASES for m in MESHES[1:] if m in meshes_of(c)]
)
def test_same_weights_and_losses_as_one_device(runs, mesh, case):
    base_meta, base = runs["batch=1"]
    meta, other = runs[mesh]
    names = [k for k in base if k.startswith(case + "/")]
    assert len(names) >= 4
    worst = max(
        float(np.max(np.abs(other[k] - base[k])) / max(np.max(np.abs(base[k])), 1e-12))
        for k in names
    )
    print(f"{case} on {mesh}: max relative weight difference {worst:.2e}")
    assert worst <= 1e-5
    # and training really moved the weights (a frozen step would also be "mesh invariant")
    losses = base_meta["losses"][case]
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(meta["losses"][case], losses, rtol=1e-5)
