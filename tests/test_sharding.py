"""Sharded weights really are sharded, and batches land on the right devices (8 virtual CPUs)."""

from __future__ import annotations

import numpy as np
from conftest import run_here


def test_weight_shards_and_packed_batches_on_a_2d_mesh():
    out = run_here(
        """
        import json
        import numpy as np
        from tensorflow.experimental import dtensor
        from dtcli import recipe as R, session as T
        from dtcli.pipeline import Batch

        result = {}
        for api in ("keras", "core"):
            raw = R.read_raw("recipes/quickstart.yaml")
            if api == "core":
                # The Core MLP names its weights as Keras does (dense_N.kernel): same rules.
                raw["model"] = {"api": "core", "hidden": [128]}
            s = T.prepare(R.from_mapping(raw))
            shards = {}
            for path, var in s.model.variables.items():
                shards[path] = {
                    "layout": list(var.layout.sharding_specs),
                    "shapes": sorted({tuple(c.shape) for c in dtensor.unpack(var.read_value())}),
                    "devices": len(dtensor.unpack(var.read_value())),
                }
            result[api] = shards

        # Packing on batch=4 x model=2: device i holds the rows of its batch coordinate.
        x = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
        b = Batch(x, np.arange(64, dtype=np.int32), np.ones(64, np.float32))
        px, py, pm = s.packer.pack_batch(b)
        ok = []
        for loc, comp in zip(s.mesh.local_device_locations(), dtensor.unpack(px)):
            want = x[loc["batch"] * 16:(loc["batch"] + 1) * 16]
            ok.append(bool(np.array_equal(comp.numpy(), want)))
        result["pack_ok"] = ok
        # The seed's trap (split by device count, not by batch coordinate) is caught, not trained on.
        try:
            s.packer.verify(x, dtensor.pack(np.split(x, 8), s.packer.layout(2)))
            result["trap_caught"] = False
        except RuntimeError as exc:
            result["trap_caught"] = "packing bug" in str(exc)
        result["labels_layout"] = list(py.layout.sharding_specs) if hasattr(py, "layout") else \\
            list(dtensor.fetch_layout(py).sharding_specs)
        print(json.dumps(result))
        """
    )
    for api in ("keras", "core"):
        w = out[api]
        assert w["dense_0.kernel"]["layout"] == ["unsharded", "model"]
        assert w["dense_0.kernel"]["shapes"] == [[64, 64]], api  # 128 outputs split over model=2
        assert w["dense_0.bias"]["shapes"] == [[64]]
        assert w["dense_1.kernel"]["shapes"] == [[64, 10]]  # 128 inputs split over model=2
        assert w["dense_1.bias"]["shapes"] == [[10]]  # no rule: replicated
        assert w["dense_1.bias"]["layout"] == ["unsharded"]
        assert all(v["devices"] == 8 for v in w.values())
    assert out["pack_ok"] == [True] * 8
    assert out["trap_caught"]
    assert out["labels_layout"] == ["batch"]


def test_any_axis_names_and_data_axis_give_the_same_training():
    """Axes called data x tensor (data_axis: data) shard as batch x model do, to the same numbers."""
    out = run_here(
        """
        import json
        import numpy as np
        from tensorflow.experimental import dtensor
        from dtcli import models, recipe as R, session as T

        weights, layouts = {}, {}
        for data_axis, model_axis in (("batch", "model"), ("data", "tensor")):
            raw = R.read_raw("recipes/quickstart.yaml")
            raw["mesh"] = {data_axis: 4, model_axis: 2}
            raw["layouts"] = {"data_axis": data_axis, "rules": {
                k: [model_axis if d == "model" else d for d in v]
                for k, v in raw["layouts"]["rules"].items()}}
            s = T.prepare(R.from_mapping(raw))
            T.run_steps(s, 5)
            weights[data_axis] = {k: v.tolist() for k, v in models.host_weights(s.model, s.mesh).items()}
            var = s.model.variables["dense_0.kernel"]
            layouts[data_axis] = [list(var.layout.sharding_specs),
                                  sorted({tuple(c.shape) for c in dtensor.unpack(var.read_value())})]
            x = s.packer.pack(np.zeros((64, 64), np.float32))
            layouts[data_axis].append(list(dtensor.fetch_layout(x).sharding_specs))
        print(json.dumps({"weights": weights, "layouts": layouts}))
        """
    )
    assert out["layouts"]["data"] == [["unsharded", "tensor"], [[64, 64]], ["data", "unsharded"]]
    assert out["layouts"]["batch"] == [["unsharded", "model"], [[64, 64]], ["batch", "unsharded"]]
    for path, value in out["weights"]["batch"].items():
        np.testing.assert_allclose(out["weights"]["data"][path], value, rtol=1e-6, atol=1e-7)
