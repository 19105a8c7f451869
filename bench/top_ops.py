"""Where a step's time goes: the op types of a `dtcli train --profile` trace, by time and count.

    dtcli train recipes/tiny_gpt_tensor_parallel.yaml --out /tmp/tp --profile 40:60 \\
        --set train.steps=120 --set train.eval_every=120 \\
        --set data.path=../shared/data/tinyshakespeare/input.txt
    python bench/top_ops.py /tmp/tp --steps 32     # the steps the run said it traced

Reads the run's TensorBoard profile (`tensorboard/plugins/profile/*/*.xplane.pb`, the newest)
with TensorFlow's own XPlane protobuf, so it needs no profiler plugin. Each host-thread event
named "name:Type" is one op execution (or an executor phase: Run, Process, ...); the runtime's
own events (ThreadpoolListener::..., MemoryAllocation, ...) are left out: they vary from run to
run (counted before 2026-11-27, they made about half of the total). Times are wall-clock spans
summed over threads, so with more threads than cores they include time a thread waited for a core.
On a multi-device mesh each virtual device runs its own copy of each op: `--devices N` divides
the counts per device. Counts are exact; use them to compare two variants' op executions and
collectives, and bench/variants.py for their speed.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

# Executor phases and runtime wrappers, not ops: listed apart so the op table adds up.
PHASES = {
    "Run",
    "Process",
    "Loop",
    "Done",
    "Start",
    "RunClosure",
    "CompleteParams",
    "ExecuteAsync",
    "EagerKernelExecute",
    "EagerExecute",
    "TFE_Py_ExecuteCancelable",
}


def op_type(name: str) -> str | None:
    """An event's op type, from its "name:Type"; None for the runtime's own events: bare names
    (MemoryAllocation, FunctionRun, ...) and names with "::" (ThreadpoolListener::Record,
    ...), about as many as the ops and varying from run to run, so no op executions."""
    if "::" in name or ":" not in name:
        return None
    return name.rsplit(":", 1)[-1]


def trace_of(run: Path) -> Path:
    traces = sorted(run.glob("tensorboard/plugins/profile/*/*.xplane.pb"))
    if not traces:
        raise SystemExit(f"{run}: no profiler trace (train it with --profile START:STOP)")
    return traces[-1]


def op_totals(trace: Path) -> tuple[collections.Counter, collections.Counter]:
    """(picoseconds, executions) by op type over the host plane's threads."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(trace.read_bytes())
    spans: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        names = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                kind = op_type(names[event.metadata_id].name)
                if kind is None:
                    continue
                spans[kind] += event.duration_ps
                counts[kind] += 1
    return spans, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory trained with --profile")
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps in the trace")
    parser.add_argument("--devices", type=int, default=1, help="devices of the mesh")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    spans, counts = op_totals(trace_of(args.run))
    ops = [kind for kind, _ in spans.most_common() if kind not in PHASES and kind in counts]
    per = args.steps * args.devices
    print(f"{'op':<32}{'ms/step':>10}{'runs/step/device':>18}")
    for kind in ops[: args.top]:
        print(f"{kind[:31]:<32}{spans[kind] / 1e9 / args.steps:10.2f}{counts[kind] / per:18.1f}")
    total, spent = sum(counts[k] for k in ops), sum(spans[k] for k in ops)
    print(f"{'all ops':<32}{spent / 1e9 / args.steps:10.2f}{total / per:18.1f}")
    summary = {
        "op_runs_per_step_per_device": total / per,
        "all_reduces_per_step_per_device": counts["CollectiveReduceV2"] / per,
        "top": {k: round(spans[k] / 1e9 / args.steps, 3) for k in ops[: args.top]},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
