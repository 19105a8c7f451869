"""bench/top_ops.py counts op executions: a trace's TensorFlow ops ("name:Type" events), never
the runtime's own events, which come about as often and vary from run to run."""

from __future__ import annotations

from conftest import _bench_script

top_ops = _bench_script("top_ops")


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
