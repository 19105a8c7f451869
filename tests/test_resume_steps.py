"""A train.steps run resumed with other cadence keys (train.steps, eval_every, checkpoint_every,
log_every, steps_per_call) trains exactly to train.steps: every step number written once and in
order, evaluations, checkpoints and logged steps where a run trained with the new keys from its
start has them, its data read at the same positions, the learning rate where it was.

First the real training loop (train.loop.EpochLoop, session.run_epoch, the resume's start) on a
fake session, no TensorFlow, over many random cadences; then one real resume (the quick
start's MLP)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import re
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import ROOT

from dtcli import recipe as R
from dtcli import session as session_lib
from dtcli import stretches
from dtcli.session import epoch as session_epoch
from dtcli.train import loop as loop_lib

PASS = 40  # steps in a pass over the fake training data (every eval_every below fits in it)


def plan_stretches(
    train: R.TrainConfig, pass_steps: int, step: int = 0, epoch: int = 0, batch: int = 0
) -> list[tuple[int, int]]:
    """(first step, last step) of each epoch (stretch) the loop should train from a checkpoint at
    global step `step` saved at (`epoch`, `batch`), each ending at an evaluation: the step
    arithmetic alone, to hold the loop's evaluations against."""
    if stretches.finished(train, step, epoch):
        return []
    epoch, batch = stretches.resume_position(train, step, epoch, batch)
    out = []
    while epoch < train.epochs:
        n = stretches.stretch_steps(train, pass_steps, epoch) - batch
        out.append((step + 1, step + n))
        step, epoch, batch = step + n, epoch + 1, 0
    return out


class Counter:
    def __init__(self, value: int):
        self.value = value

    def numpy(self) -> int:
        return self.value


class Feed:
    """Batches named by their data position: (permutation, index in it)."""

    steps = PASS

    def epoch(self, epoch: int, start: int = 0, stop: int | None = None):
        return iter([(epoch, i) for i in range(start, PASS if stop is None else stop)])


class Trace:
    """What the loop did: the data position of each optimizer step, the steps logged, the
    evaluations and checkpoints; also its console, writer, checkpointer, profiler and stop."""

    def __init__(self):
        self.positions: dict[int, tuple[int, int]] = {}
        self.logged: list[int] = []
        self.evaluated: list[int] = []
        self.saved: list[int] = []
        self.first = 0
        self.folder = None
        self.last_step = None
        self.signal_name = ""

    # the session's train call (session.train_block): one optimizer step per batch
    def train_block(self, session, call, block, notice=None):
        for j, batch in enumerate(block):
            assert self.first + j not in self.positions, f"step {self.first + j} trained twice"
            self.positions[self.first + j] = batch
        session.optimizer.iterations.value += len(block)
        n = len(block)
        return {"loss": np.ones(n), "correct": np.ones(n), "count": np.ones(n), "applied": n}

    def before_call(self, first: int, n: int) -> None:  # the profiler hears each call's step
        assert first == self.session.optimizer.iterations.value + 1, "step numbers the optimizer's"
        self.first = first

    def after_call(self, last: int) -> None:
        pass

    def step_loss(self, step: int, loss: float, **more: float) -> None:
        self.logged.append(step)

    def epoch(self, record: dict) -> None:
        self.evaluated.append(record["step"])

    def committed(self, step: int) -> None:  # a checkpoint's records go to remote trackers
        pass

    def close(self, *_) -> None:
        pass

    def save(self, step: int, meta: dict) -> None:
        self.saved.append(step)
        self.last_step = step

    def latest(self):
        return None

    def print(self, *args, **kwargs) -> None:
        pass

    is_terminal = False

    def __call__(self) -> bool:  # stop?
        return False


class Loop(loop_lib.EpochLoop):
    def _record(self, epoch, step, state):
        return {"epoch": epoch + 1, "step": step}


def train(recipe: R.Recipe, step: int = 0, saved: dict | None = None) -> Trace:
    """The loop from a checkpoint at `step` with epoch_state `saved` (None: a new run), as
    train.run's _train and _restore start it."""
    trace = Trace()
    if saved is not None and stretches.finished(recipe.train, step, saved["epoch"]):
        return trace  # train.run: "nothing to train"
    session = SimpleNamespace(
        recipe=recipe,
        train_feed=Feed(),
        compiled=False,
        probe_seconds=0.0,  # no train.compile auto measuring (session/choice.py)
        optimizer=SimpleNamespace(iterations=Counter(step)),
        cluster=None,
    )
    trace.session, session.trace = session, trace
    start = session_lib.EpochState(0)
    if saved is not None:
        start = session_lib.resume_state(recipe.train, step, saved)
    loop = Loop(session, None, None, trace, trace, trace, False, trace, None, trace)
    loop.run([], start)
    return trace


@pytest.fixture
def fake_engine(monkeypatch):
    monkeypatch.setattr(session_epoch, "train_block", lambda s, *a: s.trace.train_block(s, *a))
    monkeypatch.setattr(loop_lib, "checkpoint_meta", lambda session, step, state: {})
    monkeypatch.setattr(loop_lib, "epoch_line", lambda record, cfg: "")


@functools.cache
def steps_recipe(steps, every, checkpoint_every=1, log_every=1, per_call=16, epochs=None):
    train = {
        "checkpoint_every": checkpoint_every,
        "log_every": log_every,
        "steps_per_call": per_call,
    }
    if steps is not None:
        train.update(steps=steps, eval_every=every)
    else:
        train.update(epochs=epochs, steps_per_epoch=every)
    return R.from_mapping({"model": {"api": "core"}, "train": train})


def saved_state(recipe: R.Recipe, done: int) -> dict:
    """The epoch_state of the checkpoint a run of `recipe` saves after `done` steps (at the end,
    at an evaluation, or stopped by Ctrl-C between two calls), with sums of its stretch."""
    t = recipe.train
    if done == t.steps:
        return dataclasses.asdict(session_lib.EpochState(t.epochs))
    epoch, batch = divmod(done, t.steps_per_epoch)
    return dataclasses.asdict(session_lib.EpochState(epoch, batch, batch, batch, batch, 1.0))


def test_a_resumed_steps_run_trains_to_its_end_whatever_its_cadence(fake_engine):
    rng = random.Random(24)
    cases = 0
    while cases < 600:
        total0 = rng.randint(1, 30)
        first = steps_recipe(total0, rng.randint(1, total0))
        done = rng.randint(1, total0)
        total = rng.randint(1, 40)
        keys = dict(
            checkpoint_every=rng.randint(0, 3),
            log_every=rng.randint(1, 4),
            per_call=rng.choice([1, 2, 3, 16]),
        )
        after = steps_recipe(total, rng.randint(1, total), **keys)
        whole = train(after)
        resumed = train(after, done, saved_state(first, done))
        case = (total0, first.train.eval_every, done, total, after.train, keys)
        new = range(done + 1, total + 1)
        assert list(resumed.positions) == list(new), case  # each step once, in order, to the end
        assert resumed.positions == {s: whole.positions[s] for s in new}, case  # same data
        assert resumed.logged == [s for s in whole.logged if s > done], case
        assert resumed.evaluated == [s for s in whole.evaluated if s > done], case
        assert resumed.saved == [s for s in whole.saved if s > done], case
        plan = plan_stretches(after.train, PASS, done, *_at(first, done))
        assert [b for _, b in plan] == resumed.evaluated, case
        assert [a for a, _ in plan] == [done + 1, *(b + 1 for _, b in plan)][: len(plan)], case
        cases += 1


def test_an_epochs_run_resumes_where_its_checkpoint_says(fake_engine):
    """An epochs run (no train.steps): its checkpoint's epoch and batch, unchanged; steps.jsonl
    numbers the optimizer's steps even where the resume changed train.steps_per_epoch."""
    first = steps_recipe(None, 3, epochs=4)
    saved = dataclasses.asdict(session_lib.EpochState(2, 1, 1.0, 1.0, 1.0, 1.0))
    assert session_lib.resume_state(first.train, 7, saved) == session_lib.EpochState(**saved)
    assert stretches.finished(first.train, 12, 4) and not stretches.finished(first.train, 9, 3)
    after = steps_recipe(None, 5, epochs=4)  # longer epochs from the checkpoint at step 7
    resumed = train(after, 7, saved)
    assert list(resumed.positions) == list(range(8, 8 + 4 + 5))
    assert resumed.positions[8] == (2, 1) and resumed.evaluated == [11, 16]


def _at(recipe: R.Recipe, done: int) -> tuple[int, int]:
    state = saved_state(recipe, done)
    return state["epoch"], state["batch"]


# --------------------------------------------------------------------------- a real resume

# The quick start's MLP as a train.steps run with a cosine schedule: the loop's step arithmetic
# is the same for any model (a GPT's resume: test_language_model.py, test_tokens.py), and the
# MLP's steps compile in a fraction of a GPT's on a mesh.
SETS = [
    "train.steps_per_call=4",
    "train.log_every=1",
    "train.checkpoint_every=1",
    "train.keep=10",
    # tiny_gpt.yaml's schedule (its floor is most of the last steps' rates: the cosine's tail,
    # 1 + cos(x) near 0, is float32 noise of 1e-6 relative where it is the whole rate)
    "optimizer.schedule=cosine",
    "optimizer.learning_rate=1e-3",
    "optimizer.min_learning_rate=1e-4",
    "optimizer.warmup_steps=3",
]


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_steps_run_resumed_with_a_new_eval_every_stops_at_train_steps(cpu8, tmp_path):
    from conftest import run_cli

    from dtcli.optimizers import learning_rate_at
    from dtcli.recipe import Overrides

    sets = [x for s in SETS for x in ("--set", s)]
    recipe = ROOT / "recipes" / "quickstart.yaml"
    run = tmp_path / "run"
    args = ("train", recipe, *sets, "--no-progress")
    first = run_cli(*args, "--set", "train.steps=8", "--set", "train.eval_every=4", "--out", run)
    assert first.code == 0, first.err
    again = ["--set", "train.steps=13", "--set", "train.eval_every=3"]
    resumed = run_cli("train", "--resume", run, *again, "--no-progress")
    assert resumed.code == 0, resumed.err
    # A classifier's line counts stretches of eval_every steps (a language model's, steps: the
    # resumed GPT's lines are test_language_model's): three more evaluations, at 9, 12 and 13.
    stretches = re.findall(r"^epoch (\d+)/(\d+) ", resumed.err, re.M)
    assert stretches == [("3", "5"), ("4", "5"), ("5", "5")], resumed.err

    steps = _lines(run / "steps.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 14))
    metrics = _lines(run / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [4, 8, 9, 12, 13]
    names = sorted(p.name for p in (run / "checkpoints").glob("ckpt-*"))
    assert names[-1] == "ckpt-00000013" and "ckpt-00000016" not in names
    meta = json.loads((run / "checkpoints" / names[-1] / "meta.json").read_text())
    assert meta["step"] == 13
    # The schedule is where an uninterrupted 13-step run has it, at every resumed step (the
    # rate of optimizer step s, 0-based s - 1, with the 13-step run's total).
    whole = R.load(recipe, Overrides((*SETS, *again[1::2])))
    for r in steps[8:]:
        rate = float(learning_rate_at(whole.optimizer, r["step"] - 1, whole.train.steps))
        assert math.isclose(r["learning_rate"], rate, rel_tol=1e-6), r
    # Asked again, it has nothing left to train.
    done = run_cli("train", "--resume", run, *again, "--no-progress")
    assert done.code == 0 and "nothing to train" in done.err, done.err
