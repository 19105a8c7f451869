"""dtcli's training loop against a hand-written seed-000-style DTensor loop: examples/s, one run.

Both loops train the same Core-API MLP (the recipe's), from the same initial weights, on the same
examples in the same order, on the same mesh, in the same process; epochs alternate between them
so that machine noise hits both alike. The hand-written loop is what seed 000 writes by hand:
DenseLayer modules over DVariables, its Adam (with the step counter a variable, not a Python
float frozen at trace time), a tf.data pipeline, `tf.split` + `dtensor.pack` per batch, and a
`tf.function` step that returns the batch loss and accuracy.

    python bench/throughput.py                                  # MNIST IDX from ../shared
    python bench/throughput.py --mesh batch=4,model=2 --repeats 5
    python bench/throughput.py --synthetic                      # no data files needed
    python bench/throughput.py --synthetic --limit --mesh batch=1 --devices cpu:1
                                       # against the limit: 200 steps in one call, data on device

It prints one table and, last, one JSON line with both rates and their ratio (dtcli / hand).
Only full batches are timed (the recipe's steps per epoch are cut to whole batches), so both
loops do exactly the same arithmetic; the final losses are printed side by side as the check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MNIST = ROOT.parent / "shared" / "data" / "mnist"


def hand_written_loop(mesh, data_axis: str, initial: dict, widths: list[int], lr: float):
    """Seed 000's model, optimizer, packing and step, written the way the tutorial writes them."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    class DenseLayer(tf.Module):
        def __init__(self, w, b, activation):
            super().__init__()
            self.activation = activation
            self.w = dtensor.DVariable(w)
            self.b = dtensor.DVariable(b)

        def __call__(self, x):
            return self.activation(tf.add(tf.matmul(x, self.w), self.b))

    class MLP(tf.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = layers

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    replicated = lambda rank: dtensor.Layout.replicated(mesh, rank)  # noqa: E731
    layers = []
    for i in range(len(widths) - 1):
        w = dtensor.copy_to_mesh(initial[f"dense_{i}.kernel"], replicated(2))
        b = dtensor.copy_to_mesh(initial[f"dense_{i}.bias"], replicated(1))
        act = tf.nn.relu if i < len(widths) - 2 else tf.identity
        layers.append(DenseLayer(w, b, act))
    model = MLP(layers)

    class Adam(tf.Module):
        def __init__(self, model_vars, learning_rate, beta_1=0.9, beta_2=0.999, ep=1e-7):
            self.model_vars = model_vars
            self.beta_1, self.beta_2 = beta_1, beta_2
            self.learning_rate, self.ep = learning_rate, ep
            # The seed keeps `t` as a Python float, frozen at trace time: a variable here.
            self.t = dtensor.DVariable(dtensor.call_with_layout(tf.ones, replicated(0), shape=()))
            self.v_dvar = [
                dtensor.DVariable(dtensor.call_with_layout(tf.zeros, v.layout, shape=v.shape))
                for v in model_vars
            ]
            self.s_dvar = [
                dtensor.DVariable(dtensor.call_with_layout(tf.zeros, v.layout, shape=v.shape))
                for v in model_vars
            ]

        def apply_gradients(self, grads):
            # The seed adds epsilon to the bias-corrected sqrt(s); dtcli's Adam (as Keras')
            # adds it to the uncorrected one. Written as dtcli writes it, operation for
            # operation, so that both loops do the same arithmetic and their losses agree over
            # a long run too (float rounding differences grow with the steps).
            for i, (d_var, var) in enumerate(zip(grads, self.model_vars)):
                self.v_dvar[i].assign_add((d_var - self.v_dvar[i]) * (1 - self.beta_1))
                self.s_dvar[i].assign_add((tf.square(d_var) - self.s_dvar[i]) * (1 - self.beta_2))
                alpha = (
                    self.learning_rate
                    * tf.sqrt(1 - self.beta_2**self.t)
                    / (1 - self.beta_1**self.t)
                )
                var.assign_sub(self.v_dvar[i] * alpha / (tf.sqrt(self.s_dvar[i]) + self.ep))
            self.t.assign_add(1.0)

    optimizer = Adam(model.trainable_variables, learning_rate=lr)

    def repack_local_tensor(x, layout):
        # Seed 000's repack for a batch-sharded layout on a single client.
        parts = tf.split(x, layout.mesh.dim_size(data_axis), axis=0)
        locations = layout.mesh.local_device_locations()
        return dtensor.pack([parts[loc[data_axis]] for loc in locations], layout)

    x_layout = dtensor.Layout([data_axis, dtensor.UNSHARDED], mesh)
    y_layout = dtensor.Layout([data_axis], mesh)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
        grads = tape.gradient(loss, model.trainable_variables)
        with tf.control_dependencies(grads):  # DTENSOR_NOTES trap 1, the same barrier as dtcli
            optimizer.apply_gradients(grads)
        acc = tf.reduce_mean(
            tf.cast(tf.equal(y, tf.argmax(logits, axis=1, output_type=tf.int32)), tf.float32)
        )
        return loss, acc

    def run_epoch(x, y, batch_size: int) -> tuple[int, float]:
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size, drop_remainder=True)
        losses = []
        for xb, yb in data:
            xb, yb = repack_local_tensor(xb, x_layout), repack_local_tensor(yb, y_layout)
            loss, _ = train_step(xb, yb)
            losses.append(loss)
        return len(losses) * batch_size, float(tf.reduce_mean(tf.stack(losses)))

    @tf.function
    def limit_call(xs, ys):
        # Every step of the epoch in one call, on data already on the devices: no host work
        # between steps at all. The upper bound a loop can reach on this model and mesh.
        total = tf.constant(0.0)
        for i in tf.range(tf.shape(xs)[0]):
            loss, _ = train_step.python_function(tf.gather(xs, i), tf.gather(ys, i))
            total += loss
        return total / tf.cast(tf.shape(xs)[0], tf.float32)

    def block_layout(rank):
        return dtensor.Layout(
            [dtensor.UNSHARDED, data_axis] + [dtensor.UNSHARDED] * (rank - 2), mesh
        )

    def pack_epoch(x, y, batch_size: int):
        """The epoch's whole batches as one [steps, batch, ...] block on the mesh (untimed)."""
        steps = len(y) // batch_size
        xs = x[: steps * batch_size].reshape(steps, batch_size, *x.shape[1:])
        ys = y[: steps * batch_size].reshape(steps, batch_size)

        def pack(a):
            parts = np.split(a, mesh.dim_size(data_axis), axis=1)
            return dtensor.pack(
                [parts[loc[data_axis]] for loc in mesh.local_device_locations()],
                block_layout(a.ndim),
            )

        return steps, pack(xs), pack(ys)

    def limit_epoch(packed, batch_size: int) -> tuple[int, float, float]:
        steps, xs, ys = packed
        start = time.perf_counter()
        loss = float(limit_call(xs, ys))  # reading the loss waits for the whole call
        return steps * batch_size, time.perf_counter() - start, loss

    run_epoch.limit = limit_epoch
    run_epoch.pack_epoch = pack_epoch
    return run_epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "mnist_core_mlp.yaml"))
    parser.add_argument("--mesh", default=None, help="mesh for both loops (default: the recipe's)")
    parser.add_argument("--devices", default=None, help="devices (default: the recipe's)")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs of each loop")
    parser.add_argument("--synthetic", action="store_true", help="synthetic data, no files")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    parser.add_argument(
        "--steps-per-call",
        default=None,
        help="comma list of train.steps_per_call values, each timed as its own dtcli loop "
        "(default: the recipe's)",
    )
    parser.add_argument(
        "--placement",
        default=None,
        help="comma list of data.placement values (auto, device, host), each timed as its own "
        "dtcli loop (default: the recipe's)",
    )
    parser.add_argument(
        "--limit",
        action="store_true",
        help="also time the limit loop: every step of an epoch in one tf.function on data "
        "already on the devices (with --synthetic: 200 steps an epoch)",
    )
    args = parser.parse_args()

    import dataclasses

    from dtcli import models
    from dtcli import pipeline as pipeline_lib
    from dtcli import recipe as recipe_lib
    from dtcli import session as session_lib
    from dtcli.mesh import mesh_text

    sets = []
    if args.synthetic or not MNIST.is_dir():
        count = 200 * 128 if args.limit else 5000
        sets += ["data.source=synthetic", "data.shape=[784]", f"data.count={count}"]
    else:
        sets += ["data.source=idx", f"data.path={MNIST}"]
    recipe = recipe_lib.load(args.recipe, recipe_lib.Overrides(sets, args.mesh, args.devices))
    if recipe.model.api != "core":
        raise SystemExit("bench/throughput.py compares Core-API MLP recipes (model.api: core)")
    session = session_lib.prepare(recipe)
    recipe = session.recipe
    batch = recipe.data.batch_size
    full = len(session.data.train) // batch
    # Whole batches only, so both loops do the same arithmetic on the same examples.
    session = dataclasses.replace(
        session, recipe=recipe_lib.replace(recipe, train=_steps(recipe.train, full))
    )
    initial = models.host_weights(session.model, session.mesh)
    widths = [session.data.input_shape[0], *recipe.model.hidden, session.data.num_classes]
    hand_epoch = hand_written_loop(
        session.mesh, recipe.layouts.data_axis, initial, widths, recipe.optimizer.learning_rate
    )
    ks = (
        [int(k) for k in args.steps_per_call.split(",")]
        if args.steps_per_call
        else [recipe.train.steps_per_call]
    )
    placements = args.placement.split(",") if args.placement else [recipe.data.placement]
    loops = {}
    for k in ks:
        for placement in placements:
            # Each loop its own session from the same seed: the same initial weights, examples.
            # The first reuses the session prepared above where its placement is the recipe's.
            r_k = recipe_lib.replace(
                recipe,
                train=dataclasses.replace(_steps(recipe.train, full), steps_per_call=k),
                data=dataclasses.replace(recipe.data, placement=placement),
            )
            reuse = (k, placement) == (ks[0], placements[0]) == (ks[0], recipe.data.placement)
            s_k = dataclasses.replace(session if reuse else session_lib.prepare(r_k), recipe=r_k)
            name = "dtcli" + (f" K={k}" if len(ks) > 1 else "")
            name += f" {placement}" if len(placements) > 1 else ""
            loops[name] = _dtcli_epoch(s_k, session_lib)

    def hand(epoch: int) -> tuple[float, float]:
        order = pipeline_lib.epoch_order(len(session.data.train), recipe.seed, epoch, True)
        x, y = session.data.train.x[order], session.data.train.y[order]
        start = time.perf_counter()
        examples, mean_loss = hand_epoch(x, y, batch)
        return examples / (time.perf_counter() - start), mean_loss

    loops["hand"] = hand
    if args.limit:
        # Its own weights and optimizer state (the same initial values): the loops do not
        # share state, so each trains the same examples from the same start.
        limit_loop = hand_written_loop(
            session.mesh, recipe.layouts.data_axis, initial, widths, recipe.optimizer.learning_rate
        )
        blocks = {}

        def limit(epoch: int) -> tuple[float, float]:
            if epoch not in blocks:
                order = pipeline_lib.epoch_order(len(session.data.train), recipe.seed, epoch, True)
                x, y = session.data.train.x[order], session.data.train.y[order]
                blocks.clear()
                blocks[epoch] = limit_loop.pack_epoch(x, y, batch)
            examples, seconds, mean_loss = limit_loop.limit(blocks.pop(epoch), batch)
            return examples / seconds, mean_loss

        loops["limit"] = limit
    rates: dict[str, list[float]] = {name: [] for name in loops}
    losses: dict[str, float] = {}
    for epoch in range(args.repeats + 1):  # epoch 0 traces every step: not timed
        for name, fn in loops.items():
            rate, loss = fn(epoch)
            if epoch:
                rates[name].append(rate)
            losses[name] = loss
    med = {k: statistics.median(v) for k, v in rates.items()}
    first = next(iter(loops))
    result = {
        "recipe": Path(args.recipe).name,
        "data": session.data.description,
        "mesh": mesh_text(session.axes),
        "devices": session.devices.text,
        "steps_per_epoch": full,
        "repeats": args.repeats,
        "dtcli_examples_per_sec": med[first],
        "hand_examples_per_sec": med["hand"],
        "ratio": med[first] / med["hand"],
        "examples_per_sec": {
            name: {"min": min(v), "median": med[name], "max": max(v), "all": v}
            for name, v in rates.items()
        },
        "ratios": {name: med[name] / med["hand"] for name in loops},
        "ratios_to_limit": (
            {name: med[name] / med["limit"] for name in loops} if "limit" in loops else None
        ),
        "epoch_loss": losses,
    }
    print(
        f"{result['recipe']} on {result['mesh']} ({result['devices']}), {full} steps of {batch}, "
        f"{args.repeats} epochs each, alternated (min / median / max):"
    )
    for name, v in rates.items():
        print(
            f"  {name:14} {min(v):10,.0f} {med[name]:10,.0f} {max(v):10,.0f} examples/s   "
            f"x{med[name] / med['hand']:.3f} of hand"
            + (f"  x{med[name] / med['limit']:.3f} of limit" if "limit" in med else "")
            + f"   last epoch's mean loss {losses[name]:.6f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


def _dtcli_epoch(session, session_lib):
    from dtcli import steps as steps_lib

    train_call, _ = steps_lib.make_steps(session)

    def epoch(index: int) -> tuple[float, float]:
        state = session_lib.run_epoch(session, train_call, session_lib.EpochState(index))
        return state.count / state.seconds, state.loss_sum / state.count

    return epoch


def _steps(train_cfg, steps: int):
    import dataclasses

    return dataclasses.replace(train_cfg, steps_per_epoch=steps)


def _list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:,.0f}" for v in values) + "]"


if __name__ == "__main__":
    main()
