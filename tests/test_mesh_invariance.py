"""One recipe, the same numbers on any mesh: 20 steps on 1 device, batch=8 and batch=4 x model=2
end with the same weights (the fused-step all-reduce trap and mesh-dependent init would fail it)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_python

MESHES = ["batch=1", "batch=8", "batch=4,model=2"]
COMBOS = [(api, opt) for api in ("keras", "core") for opt in ("sgd", "adam")]


def train_20_steps(mesh: str, out: str) -> dict:
    return run_python(
        f"""
        import json
        import numpy as np
        from dtcli import models, recipe as R, train as T

        losses = {{}}
        arrays = {{}}
        for api, opt in {COMBOS!r}:
            sets = ["optimizer.name=" + opt, "optimizer.learning_rate=0.01",
                    "optimizer.momentum=" + ("0.9" if opt == "sgd" else "0.0")]
            if api == "core":
                sets += ["model.api=core", "model.layers=null", "model.hidden=[128]"]
            s = T.prepare(R.load("recipes/quickstart.yaml", sets, mesh="{mesh}"))
            losses[api + "-" + opt] = T.run_steps(s, 20)
            for path, value in models.host_weights(s.model, s.mesh).items():
                arrays[api + "-" + opt + "-" + path] = value
            sharded = [p.weight.path for p in s.plans if set(p.spec) != {{"unsharded"}}]
        np.savez("{out}", **arrays)
        print(json.dumps({{"losses": losses, "axes": s.axes, "sharded": sharded}}))
        """
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("invariance")
    out = {}
    for mesh in MESHES:
        path = folder / f"{mesh}.npz"
        meta = train_20_steps(mesh, str(path))
        out[mesh] = (meta, dict(np.load(path)))
    return out


def test_meshes_are_what_they_say(runs):
    assert runs["batch=1"][0]["axes"] == {"batch": 1, "model": 1}
    assert runs["batch=8"][0]["axes"] == {"batch": 8, "model": 1}
    assert runs["batch=4,model=2"][0]["axes"] == {"batch": 4, "model": 2}
    assert "dense_0.kernel" in runs["batch=4,model=2"][0]["sharded"]


@pytest.mark.parametrize("mesh", MESHES[1:])
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(c))
def test_same_weights_and_losses_as_one_device(runs, mesh, combo):
    key = "-".join(combo)
    base_meta, base = runs["batch=1"]
    meta, other = runs[mesh]
    names = [k for k in base if k.startswith(key + "-")]
    assert len(names) == 4
    worst = max(
        float(np.max(np.abs(other[k] - base[k])) / max(np.max(np.abs(base[k])), 1e-12))
        for k in names
    )
    print(f"{key} on {mesh}: max relative weight difference {worst:.2e}")
    assert worst <= 1e-5
    # and training really moved the weights (a frozen step would also be "mesh invariant")
    losses = base_meta["losses"][key]
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(meta["losses"][key], losses, rtol=1e-5)
