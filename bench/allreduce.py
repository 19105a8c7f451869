"""What one all-reduce costs on a DTensor mesh of virtual CPUs: the floor under tensor parallel.

A tensor-parallel GPT block all-reduces its activations twice in the forward pass and twice in
the backward pass (Megatron), one after the other: each waits for every device of the `model`
axis. This times a chain of such all-reduces: a [batch, floats, model] tensor sharded on its last
dim is summed over it (an all-reduce over `model` of batch / batch-axis x floats floats on each
device), and the next link multiplies by that sum, so they run in turn, as in the step. The same
chain on a [batch, floats, 1] tensor with that dim unsharded does the same arithmetic on each
device with no all-reduce; the difference, over `--chain` links, is what one all-reduce costs.

    python bench/allreduce.py                                  # batch=2,model=4, as the TP recipe
    python bench/allreduce.py --mesh batch=1,model=8 --floats 16 8192 98304

`--floats` per sequence (default 8192: with the recipe's 6 sequences a device, the 49,152 of a
[6, 64, 128] activation). Devices and threads are set as `dtcli train` sets them (each virtual
CPU its share of the cores). Last line: one JSON object.

Measured on this project's 2-core AMD EPYC (`--floats 16 8192 98304`): 0.47 ms an all-reduce of
96 floats a device, 0.91 ms of 49,152 (a link without it: 0.11 ms), 7.9 ms of 589,824. The TP
recipe's 16 activation all-reduces a step then cost ~15 ms by themselves, in a 165 ms step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="batch=2,model=4", help="axes; the last is reduced")
    parser.add_argument("--floats", type=int, nargs="+", default=[8192])
    parser.add_argument("--batch", type=int, default=12, help="sequences, split on the first axis")
    parser.add_argument("--chain", type=int, default=64, help="all-reduces a call")
    parser.add_argument("--repeats", type=int, default=10, help="calls timed (median)")
    args = parser.parse_args()
    axes = {k: int(v) for k, v in (part.split("=") for part in args.mesh.split(","))}
    count = 1
    for size in axes.values():
        count *= size

    from dtcli import devices
    from dtcli.mesh import build_mesh

    devices.configure(f"cpu:{count}", count)
    mesh = build_mesh(axes, "CPU")
    rows = [measure(mesh, list(axes), args, floats) for floats in args.floats]
    for row in rows:
        print(
            f"{args.mesh}: {row['floats_per_device']:,} floats a device: "
            f"{row['ms_per_all_reduce']:.3f} ms an all-reduce (a link without one: "
            f"{row['ms_per_link_without']:.3f} ms)"
        )
    print(json.dumps({"mesh": args.mesh, "rows": rows}))


def measure(mesh, names: list[str], args: argparse.Namespace, floats: int) -> dict:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    reduced = mesh.dim_size(names[-1])
    times = {}
    # [batch, floats, model] sharded on its last dim: each link all-reduces. [batch, floats, 1]
    # unsharded there: the same local shapes and arithmetic, no collective.
    for kind, last, spec in (("all_reduce", reduced, names[-1]), ("local", 1, "unsharded")):
        layout = dtensor.Layout([names[0], "unsharded", spec], mesh)
        x = dtensor.call_with_layout(tf.ones, layout, [args.batch, floats, last])
        call = tf.function(lambda x: _chain(x, args.chain))
        dtensor.unpack(call(x))[0].numpy()  # traced, lowered and run once: not timed
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            dtensor.unpack(call(x))[0].numpy()
            seconds.append(time.perf_counter() - start)
        times[kind] = statistics.median(seconds)
    return {
        "floats_per_device": args.batch // mesh.dim_size(names[0]) * floats,
        "ms_per_link_without": times["local"] / args.chain * 1e3,
        "ms_per_all_reduce": (times["all_reduce"] - times["local"]) / args.chain * 1e3,
    }


def _chain(x, links: int):
    import tensorflow as tf

    y = x[..., 0]
    for _ in range(links):
        # The product makes the next link wait for this one's sum.
        y = tf.reduce_sum(x * y[..., None], -1) * 1e-3
    return y


if __name__ == "__main__":
    main()
