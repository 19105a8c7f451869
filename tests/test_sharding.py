"""Sharded weights really are sharded, and batches land on the right devices (8 virtual CPUs)."""

from __future__ import annotations

from conftest import run_python


def test_weight_shards_and_packed_batches_on_a_2d_mesh():
    out = run_python(
        """
        import json
        import numpy as np
        from tensorflow.experimental import dtensor
        from dtcli import recipe as R, train as T
        from dtcli.data import Batch

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
    assert out["labels_layout"] == ["batch"]
