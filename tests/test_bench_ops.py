"""The benches that count and time a mesh's ops: bench/top_ops.py counts op executions (a
trace's TensorFlow ops, "name:Type" events, never the runtime's own events, which come about as
often and vary from run to run); bench/variants.py's --tree runs a variant on another checkout
of dtcli, so two commits alternate on one machine."""

from __future__ import annotations

import pytest
from conftest import _bench_script

top_ops = _bench_script("top_ops")
variants = _bench_script("variants")


def test_only_tensorflow_ops_are_counted_by_type(tmp_path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    names = [
        "while/gpt/fc/MatMul:_MklMatMul",
        "while/Sum/DTensorAllReduceOp_1:CollectiveReduceV2",
        "ThreadpoolListener::Record",
        "ThreadpoolListener::StartRegion",
        "MemoryAllocation",
    ]
    for i, name in enumerate(names, start=1):
        plane.event_metadata[i].id = i
        plane.event_metadata[i].name = name
    line = plane.lines.add()
    for i in (1, 1, 2, 3, 3, 3, 4, 5):
        line.events.add(metadata_id=i, duration_ps=1000)
    trace = tmp_path / "run.xplane.pb"
    trace.write_bytes(space.SerializeToString())

    spans, counts = top_ops.op_totals(trace)

    assert dict(counts) == {"_MklMatMul": 2, "CollectiveReduceV2": 1}
    assert spans["_MklMatMul"] == 2000


def test_a_variants_tree_runs_that_checkouts_dtcli(tmp_path):
    tree = tmp_path / "other"
    (tree / "dtcli").mkdir(parents=True)
    (tree / "dtcli" / "__init__.py").write_text("")
    # A stand-in `dtcli train`: the figures variants reads, the loss saying which tree ran.
    record = {"seconds": 5.0, "compile_seconds": 1.0, "eval_loss": 7.0, "train_tokens": 80}
    (tree / "dtcli" / "__main__.py").write_text(
        "import json, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1]); out.mkdir()\n"
        f"(out / 'metrics.jsonl').write_text(json.dumps({record!r}) + '\\n')\n"
    )
    trees = variants.parse_trees([f"old:{tree}"], ["old", "new"])
    assert trees == {"old": tree.resolve()}

    run = variants.run_once("r.yaml", [], 5, tmp_path / "out", {}, trees["old"])

    assert run == {
        "s_per_step": 1.0,
        "tokens_per_sec": 16.0,
        "compile_seconds": 1.0,
        "eval_loss": 7.0,
    }
    for bad, why in [(f"nobody:{tree}", "of a --variant's NAME"), ("old", "NAME:DIR")]:
        with pytest.raises(ValueError, match=why):
            variants.parse_trees([bad], ["old"])
    with pytest.raises(ValueError, match="holds no dtcli/__init__.py"):
        variants.parse_trees([f"old:{tmp_path}"], ["old"])
