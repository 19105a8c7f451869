"""dtcli's language-model training loop against a hand-written tf-keras loop: tokens/s, one run.

Both train the same model (recipes/tiny_gpt.yaml's GPT, built by dtcli.models.transformer, from the
same initial weights) with the same optimizer (AdamW, the recipe's betas, decay and clipping, a
constant learning rate), on the same windows of the same text in the same order, on one device,
in one process; stretches of steps alternate between them so machine noise hits both alike.
The hand-written loop is what a tf-keras user writes: a `tf.function` step of (x, y) -> loss
called once per batch, the batch copied from the host each step, the loss read back each step.

    python bench/lm_throughput.py                       # tiny Shakespeare from ../shared
    python bench/lm_throughput.py --steps 100 --repeats 5

It prints a table and, last, one JSON line with both rates and their ratio (dtcli / hand). The
losses of the last stretch are printed side by side as the same-math check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def hand_written_loop(cfg, opt_cfg, vocab: int, initial: dict):
    """The model, AdamW and step as a tf-keras user writes them (no mesh, no DTensor)."""
    import tensorflow as tf
    import tf_keras

    from dtcli import models
    from dtcli.models import transformer

    model = transformer.build(cfg, vocab)
    for path, var, _ in models.keras.keras_variables(model):
        var.assign(initial[path])
    optimizer = tf_keras.optimizers.AdamW(
        learning_rate=opt_cfg.learning_rate,
        weight_decay=opt_cfg.weight_decay,
        beta_1=opt_cfg.beta_1,
        beta_2=opt_cfg.beta_2,
        epsilon=opt_cfg.epsilon,
    )
    decay_free = [v for p, v, _ in models.keras.keras_variables(model) if p.endswith("gamma")]
    optimizer.exclude_from_weight_decay(var_list=decay_free)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
        grads = tape.gradient(loss, model.trainable_variables)
        grads = [tf.convert_to_tensor(g) for g in grads]
        grads, _ = tf.clip_by_global_norm(grads, opt_cfg.clip_norm)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", default=str(SHAKESPEARE), help="the training text")
    parser.add_argument("--steps", type=int, default=64, help="steps per timed stretch")
    parser.add_argument("--repeats", type=int, default=3, help="stretches of each loop")
    args = parser.parse_args()

    from dtcli import tfruntime

    tfruntime.set_runtime_env()
    import numpy as np

    from dtcli import models
    from dtcli import recipe as recipe_lib
    from dtcli import session as session_lib
    from dtcli import steps as steps_lib

    recipe = recipe_lib.load(
        ROOT / "recipes" / "tiny_gpt.yaml",
        [
            f"data.path={args.text}",
            "optimizer.schedule=constant",
            "optimizer.warmup_steps=0",
            f"train.steps={args.steps * (args.repeats + 1)}",
            "train.log_every=1000000",
        ],
    )
    session = session_lib.prepare(recipe)
    train_call, _ = steps_lib.make_steps(session)
    initial = models.host_weights(session.model, session.mesh)
    cfg = recipe.model.transformer
    step = hand_written_loop(cfg, recipe.optimizer, session.data.num_classes, initial)
    k = steps_lib.steps_per_call(session)
    feed = session.train_feed
    tokens_per_step = recipe.data.batch_size * session.data.input_shape[0]

    def dtcli_stretch(index: int) -> tuple[float, float]:
        import itertools

        batches = feed.epoch(index, 0, args.steps)
        started = time.perf_counter()
        loss = 0.0
        while block := list(itertools.islice(batches, k)):
            out = steps_lib.train_block(session, train_call, block)
            loss = float(out["loss"][-1])
        return args.steps * tokens_per_step / (time.perf_counter() - started), loss

    def hand_stretch(index: int) -> tuple[float, float]:
        started = time.perf_counter()
        loss = 0.0
        for batch in feed.epoch(index, 0, args.steps):
            x = np.asarray(batch.x, np.int32)
            y = np.asarray(batch.y, np.int32)
            loss = float(step(x, y))  # a user's loop reads the loss every step
        return args.steps * tokens_per_step / (time.perf_counter() - started), loss

    # Stretch 0 of each compiles; it is not timed.
    dtcli_stretch(0)
    hand_stretch(0)
    rates: dict[str, list[float]] = {"dtcli": [], "hand": []}
    losses: dict[str, float] = {}
    for r in range(1, args.repeats + 1):
        for name, fn in (("dtcli", dtcli_stretch), ("hand", hand_stretch)):
            rate, losses[name] = fn(r)
            rates[name].append(rate)
    print(f"tokens/s, {args.repeats} stretches of {args.steps} steps each (min / median / max):")
    for name, values in rates.items():
        print(
            f"  {name:6s} {min(values):8,.0f} / {statistics.median(values):8,.0f} / "
            f"{max(values):8,.0f}   last loss {losses[name]:.4f}"
        )
    ratio = statistics.median(rates["dtcli"]) / statistics.median(rates["hand"])
    ms = 1000 * tokens_per_step / statistics.median(rates["dtcli"])
    print(f"dtcli / hand: {ratio:.2f}x; dtcli {ms:.0f} ms per step")
    print(
        json.dumps(
            {
                "dtcli_tokens_per_sec": statistics.median(rates["dtcli"]),
                "hand_tokens_per_sec": statistics.median(rates["hand"]),
                "ratio": ratio,
                "dtcli_ms_per_step": ms,
            }
        )
    )


if __name__ == "__main__":
    main()
