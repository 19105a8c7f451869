"""`dtcli plan --auto`: the search's enumeration, the checks it shares with `train`, the cost
model's arithmetic, the recipe --write writes and the calibration cache. All without devices
or TensorFlow (dtcli's GPT is planned by arithmetic); the command's bad inputs are rows of
tests/test_bad_inputs.py, its measured figures in docs/meshes-and-layouts.md."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from conftest import RECIPES, StampedStream

from dtcli import autoplan
from dtcli import layout as layout_lib
from dtcli import memory as memory_lib
from dtcli import recipe as recipe_lib
from dtcli.autoplan import calibrate, candidates, cost, measure, report, search
from dtcli.autoplan import workload as workload_lib
from dtcli.autoplan.workload import workload
from dtcli.errors import UsageError
from dtcli.models import transformer

GPT = RECIPES / "tiny_gpt.yaml"
FSDP_TP = RECIPES / "gpt_fsdp_tp.yaml"


def _search(path: Path, sets: tuple[str, ...] = (), budget=memory_lib.NO_BUDGET, count=8):
    overrides = recipe_lib.Overrides(sets, devices=f"cpu:{count}")
    raw = recipe_lib.read_with_overrides(path, overrides)  # as autoplan.run reads the recipe
    base = recipe_lib.from_mapping(raw)
    model = search.describe_model(base)
    found = search.enumerate_for(base, model, count)
    return raw, model, search.merge_equal([search.check(raw, c, model, budget) for c in found])


def _by_label(checked):
    return {search.label(c.candidate): c for c in checked}


def test_factorizations_are_ordered_and_complete():
    assert candidates.factorizations(8, 2) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert candidates.factorizations(1, 2) == [(1, 1)]
    assert len(candidates.factorizations(12, 3)) == 18  # 3 axes: ordered triples
    assert all(a * b * c == 12 for a, b, c in candidates.factorizations(12, 3))


def test_dense_tensor_parallel_pairs_layers_like_mnist_mlp_2d():
    weights = [
        layout_lib.WeightInfo("dense_0.kernel", (784, 128), "Dense"),
        layout_lib.WeightInfo("dense_0.bias", (128,), "Dense"),
        layout_lib.WeightInfo("dense_1.kernel", (128, 10), "Dense"),
        layout_lib.WeightInfo("dense_1.bias", (10,), "Dense"),
    ]
    shipped = recipe_lib.load(RECIPES / "mnist_mlp_2d.yaml").layouts.rules
    rules = candidates.dense_tensor_parallel(weights, "model")
    assert list(rules.values()) == list(shipped.values())
    assert [layout_lib.match_rule(rules, w.path) for w in weights][:3] == list(rules)
    # an unpaired third layer stays replicated; convolutions are never split
    three = weights + [layout_lib.WeightInfo("dense_2.kernel", (10, 10), "Dense")]
    assert candidates.dense_tensor_parallel(three, "model") == rules
    conv = [layout_lib.WeightInfo("conv.kernel", (3, 3, 1, 8), "Conv2D")]
    assert candidates.dense_tensor_parallel(conv, "model") == {}


def test_gpt_candidates_and_why_each_refused_one_is_refused():
    """Meshes of 8, 4, 2 and 1 devices: fewer devices can be faster, one compiles with XLA
    (the search once weighed only meshes of all 8, and picked tp on batch=4,model=2 at ~3x
    the one-device run's time)."""
    _, _, checked = _search(GPT)
    by = _by_label(checked)
    assert sorted(by) == sorted(
        [
            "data parallel = recipe on batch=8,model=1",
            "fsdp on batch=8,model=1",
            "tp on batch=4,model=2",
            "tp on batch=2,model=4",
            "tp on batch=1,model=8",
            "fsdp x tp on batch=4,model=2",
            "fsdp x tp on batch=2,model=4",
            "data parallel = recipe on batch=4,model=1",
            "fsdp on batch=4,model=1",
            "tp on batch=2,model=2",
            "fsdp x tp on batch=2,model=2",
            "tp on batch=1,model=4",
            "data parallel = recipe on batch=2,model=1",
            "fsdp on batch=2,model=1",
            "tp on batch=1,model=2",
            "one device on batch=1,model=1",
        ]
    )
    # the recipe's own layout (no rules) is data parallel: listed once
    assert [c.candidate.layout.name for c in checked].count("data parallel") == 0
    dp8 = by["data parallel = recipe on batch=8,model=1"].rejected
    assert "12 does not divide by the data axis 'batch' of size 8" in dp8
    assert "4 heads cannot be split over 8 devices" in by["tp on batch=1,model=8"].rejected
    assert "does not divide by the data axis" in by["fsdp on batch=8,model=1"].rejected
    fitting = [c for c in checked if c.fits]
    assert len(fitting) == 13 and all(c.workload is not None for c in fitting)
    # each candidate's recipe asks for its own devices, the count its mesh has
    assert {c.raw["devices"] for c in checked} == {"cpu:8", "cpu:4", "cpu:2", "cpu:1"}
    assert all(c.recipe.devices == f"cpu:{c.candidate.devices}" for c in fitting)
    assert [c.xla for c in fitting].count(True) == 1 and by["one device on batch=1,model=1"].xla


def test_candidates_range_over_every_divisor_of_the_device_count():
    assert candidates.divisors(8) == [8, 4, 2, 1] and candidates.divisors(6) == [6, 3, 2, 1]
    presets = candidates.layouts({"d.kernel": ["unsharded", "model"]}, {}, False)
    found = candidates.enumerate_candidates(6, ("batch", "model"), "batch", presets)
    meshes = {tuple(c.axes.values()) for c in found}
    assert meshes == {(6, 1), (3, 2), (2, 3), (1, 6), (3, 1), (1, 3), (2, 1), (1, 2), (1, 1)}
    one = [c for c in found if c.devices == 1]
    assert [c.layout.name for c in one] == [candidates.ONE_DEVICE]
    assert one[0].layout.rules == {} and not one[0].layout.fsdp


def test_the_one_device_candidate_is_priced_as_xla_on_plain_variables():
    """No collectives, kernels instead of DTensor's op executions, XLA's own rates; with
    train.compile: dtensor the same mesh is a DTensor mesh of one device, priced as such."""
    _, _, checked = _search(GPT)
    by = _by_label(checked)
    one = by["one device on batch=1,model=1"].workload
    dtensor_one = _by_label(_search(GPT, ("train.compile=dtensor",))[2])
    dt = dtensor_one["one device on batch=1,model=1"]
    assert one.xla and not dt.xla and not dt.workload.xla
    assert one.collectives == [] and one.devices == 1
    assert one.flops_per_device == pytest.approx(dt.workload.flops_per_device)
    assert one.ops_per_device < dt.workload.ops_per_device / 2
    slow = cost.Rates(1e9, {2: 1e-3}, {2: 1e8}, 1e-4, 1e9)
    fast = cost.Rates(1e11, {}, {}, 1e-6, 1e10)
    rates = cost.Calibration({1: slow, 2: slow, 4: slow, 8: slow}, xla=fast)
    assert rates.rates_for(one) is fast and rates.rates_for(dt.workload) is slow
    xla_ms = cost.predict(one, rates.rates_for(one)).seconds
    passes = cost.ACTIVATION_PASSES * one.activation_bytes + cost.STATE_PASSES * one.state_bytes
    assert xla_ms == pytest.approx(
        one.flops_per_device / 1e11 + passes / 1e10 + one.ops_per_device * 1e-6
    )
    dp2 = by["data parallel = recipe on batch=2,model=1"].workload
    assert rates.rates_for(dp2) is slow and dp2.devices == 2
    assert cost.Calibration.from_json(json.loads(json.dumps(rates.to_json()))) == rates


def test_the_recipes_own_layout_merges_with_the_preset_it_equals():
    _, _, checked = _search(FSDP_TP)
    names = {search.label(c.candidate) for c in checked}
    assert "fsdp x tp = recipe on batch=4,model=2" in names
    assert all(c.fits for c in checked)  # batch 8, 8 heads: every candidate runs


def test_a_budget_refuses_candidates_and_under_all_names_the_smallest():
    _, _, free = _search(GPT)
    smallest = min((c for c in free if c.fits), key=lambda c: c.memory.total)
    budget = memory_lib.Budget(smallest.memory.total, "x")
    _, _, checked = _search(GPT, budget=budget)
    assert [search.label(c.candidate) for c in checked if c.fits] == [
        search.label(smallest.candidate)
    ]
    assert any("over the budget (--memory x)" in (c.rejected or "") for c in checked)
    tight = memory_lib.Budget(smallest.memory.total - 1, "tight")
    _, _, none = _search(GPT, budget=tight)
    with pytest.raises(UsageError, match=f"needs {smallest.memory.total:,} B"):
        search.refuse_if_none_fits(none, tight)


def test_gpt_collectives_by_layout():
    cfg = recipe_lib.load(GPT).model.transformer
    weights = transformer.weights(cfg, 256)
    tp_rules = candidates.gpt_tensor_parallel("model")
    axes = {"batch": 4, "model": 2}
    tp = layout_lib.plan_weights(tp_rules, weights, axes)
    recipe = recipe_lib.load(GPT, recipe_lib.Overrides((), "batch=4,model=2", "cpu:8"))
    work = workload(recipe, tp, axes, (64,), 256)
    activation = [c for c in work.collectives if c.group == 2 and c.bytes > 4]
    # per block 2 forward + 4 backward all-reduces and DTensor's own 2 (traced: 63 a step on
    # this mesh, with the clip norm's); the embeddings' gather, the tied head's logits and its
    # input gradient
    assert len(activation) == 8 * cfg.layers + 3
    tp_ops = work.ops_per_device
    dp = layout_lib.plan_weights({}, weights, {"batch": 8, "model": 1})
    dp_work = workload(recipe, dp, {"batch": 8, "model": 1}, (64,), 256)
    assert not [c for c in dp_work.collectives if c.kind != "all-reduce"]
    # the gradients' all-reduces are combined into one (DTensor's combining pass), with the
    # loss's: 2 a step, as traced
    assert len([c for c in dp_work.collectives if c.group > 1]) == 2
    # DTensor's relayouts of tensor parallelism: ops per split block (traced: +172 a step)
    assert tp_ops - dp_work.ops_per_device == workload_lib.RELAYOUT_OPS_PER_BLOCK * cfg.layers
    fsdp = layout_lib.apply_fsdp(dp, "batch", {"batch": 8, "model": 1})
    kinds = {
        c.kind for c in workload(recipe, fsdp, {"batch": 8, "model": 1}, (64,), 256).collectives
    }
    assert kinds == {"all-reduce", "all-gather", "reduce-scatter"}
    assert dp_work.flops_per_device == pytest.approx(work.flops_per_device)


def test_predict_adds_compute_collectives_and_ops():
    rates = cost.Rates(1e9, {2: 1e-4, 8: 1e-3}, {2: 1e8, 8: 1e8}, 1e-6)
    work = cost.Workload(
        2e6, [cost.Collective("all-reduce", 2, 1000), cost.Collective("all-gather", 8, 8000)], 100
    )
    p = cost.predict(work, rates)
    assert p.compute == pytest.approx(2e-3)
    assert p.communication == pytest.approx(1e-4 + 1000 / 1e8 + 1e-3 + 7000 / 1e8)
    assert p.ops == pytest.approx(1e-4)
    assert rates.alpha_for(4) == 1e-4 and rates.alpha_for(6) == 1e-3  # the nearest group size
    assert cost.Rates.from_json(json.loads(json.dumps(rates.to_json()))) == rates


def test_spearman():
    assert report.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert report.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert report.spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert report.spearman([1, 2], [1, 2]) is None


def test_written_recipe_is_the_hand_written_one(tmp_path):
    """--write's recipe loads to the very recipe of the same mesh and rules written by hand
    (same fingerprint: the same run), over a base with rules of its own that must not leak."""
    sets = ("model.transformer.layers=2",)
    _, _, checked = _search(FSDP_TP, sets)
    row = _by_label(checked)["tp on batch=2,model=4"]
    out = tmp_path / "sub"
    out.mkdir()
    sets_map = {"model": {"transformer": {"layers": 2}}}
    text = report.recipe_text(row, FSDP_TP, out, sets_map, row.raw["devices"])
    (out / "auto.yaml").write_text(text)
    written = recipe_lib.load(out / "auto.yaml")
    rules = "{" + ", ".join(f"'{k}': {v}" for k, v in row.candidate.layout.rules.items()) + "}"
    by_hand = recipe_lib.load(
        FSDP_TP,
        recipe_lib.Overrides(
            (
                *sets,
                f"layouts.rules={rules}".replace("'unsharded'", "unsharded"),
                "layouts.fsdp=false",
            ),
            "batch=2,model=4",
            "cpu:8",  # --mesh alone would drop the recipe's device count
        ),
    )
    assert written.layouts.fsdp is False and dict(written.mesh) == {"batch": 2, "model": 4}
    assert recipe_lib.fingerprint(written) == recipe_lib.fingerprint(by_hand)


def test_calibration_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv(calibrate.CACHE_ENV, str(tmp_path))
    mesh = cost.Rates(1e9, {2: 1e-4}, {2: 1e8}, 1e-6)
    rates = cost.Calibration({1: mesh, 2: mesh}, cost.Rates(1e10, {}, {}, 1e-7))
    assert calibrate.load_cached("cpu:8 x") is None
    path = calibrate.store("cpu:8 x", rates)
    assert path.parent == tmp_path
    assert calibrate.load_cached("cpu:8 x") == rates
    assert calibrate.load_cached("cpu:4 x") is None
    path.write_text("{not json")
    assert calibrate.load_cached("cpu:8 x") is None  # damaged: measured again


def test_measure_reads_the_step_time_without_the_first_call(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"seconds": 12.0, "compile_seconds": 10.0}) + "\n")
    assert measure.step_ms(metrics, 20) == pytest.approx(100.0)
    args = measure.train_args(tmp_path / "r.yaml", tmp_path / "run", 20)
    assert "train.steps=21" in args and "train.eval_every=21" in args
    assert "optimizer.warmup_steps=10" in measure.train_args(Path("r"), Path("o"), 20, 100)


def test_measure_repeats_round_by_round_and_says_what_it_does(tmp_path):
    """R runs of each candidate, a round over all at a time (load falls on each alike), the
    median and every run kept; a failed candidate is not run again; on a non-terminal, a
    plain line as each run starts, every heartbeat while it runs, and as it ends."""
    from rich.console import Console

    calls = []

    def fake(text, steps, timeout, warmup, tick):
        calls.append(text)
        tick(10.0)
        if text == "bad":
            return None, "dtcli train exited 1"
        return {"a": [30.0, 10.0, 20.0], "b": [5.0, 7.0, 6.0]}[text][calls.count(text) - 1], None

    out = tmp_path / "out"
    with open(out, "w") as f:
        jobs = [("tp on x", "a", 0), ("dp on y", "b", 0), ("fsdp on z", "bad", 0)]
        got = measure.measure_all(jobs, 5, 3, Console(file=f), 1.0, fake)
    assert calls == ["a", "b", "bad", "b", "a", "a", "b"]  # every other round backwards
    assert [t.runs_ms for t in got] == [[30.0, 10.0, 20.0], [5.0, 7.0, 6.0], []]  # by job
    assert [t.median_ms for t in got] == [20.0, 6.0, None]
    assert got[2].error == "dtcli train exited 1"
    lines = out.read_text().splitlines()
    assert lines[:3] == [
        "measuring 1/9: tp on x (run 1 of 3)",
        "measuring 1/9: tp on x (run 1 of 3): 10 s",
        "measured 1/9: tp on x (run 1 of 3): 30.0 ms a step",
    ]
    assert "measured 3/9: fsdp on z (run 1 of 3): failed" in lines
    assert "measured 5/9: dp on y (run 2 of 3): 7.0 ms a step" in lines  # 4/9: bad, skipped
    assert lines[-1] == "measured 8/9: dp on y (run 3 of 3): 6.0 ms a step"
    quiet = io.StringIO()  # --no-progress: the same runs, nothing said
    calls.clear()
    got = measure.measure_all(jobs[:1], 5, 1, Console(file=quiet), 1.0, fake, progress=False)
    assert calls == ["a"] and got[0].runs_ms == [30.0] and quiet.getvalue() == ""


@pytest.mark.parametrize(
    "option, path", [("--write", "/proc/auto.yaml"), ("--plot", "/sys/auto.png")]
)
def test_an_unwritable_write_or_plot_is_refused_before_the_search(option, path):
    """Checked with the options, before minutes of search (--write used to fail after it with
    a PermissionError, --plot after it too)."""
    write, plot = (path, None) if option == "--write" else (None, path)
    with pytest.raises(UsageError, match=f"{option} '{path}': cannot write in"):
        autoplan.options(True, None, None, None, write, plot, False, False)


def test_write_of_a_one_device_pick_asks_for_one_device_with_paths_valid_anywhere(
    tmp_path, monkeypatch
):
    """--write writes the pick's own devices (`cpu:1`, not the cpu:8 searched) and mesh, and
    a relative data.path (opened relative to the folder a command runs in, recipe.files) as an
    absolute one: the recipe trains the same data from any folder. The output says that the
    pick leaves devices idle."""
    work = tmp_path / "work"
    (work / "corpus").mkdir(parents=True)
    (work / "corpus" / "input.txt").write_text("to be or not to be\n" * 50)
    monkeypatch.chdir(work)
    sets = ("data.path=corpus/input.txt",)
    _, _, checked = _search(GPT, sets)
    rows = report.ranked(checked)
    one = next(i for i, c in enumerate(rows) if c.candidate.devices == 1)
    out = tmp_path / "elsewhere"
    out.mkdir()
    text = report.recipe_text(
        rows[one], GPT, out, {"data": {"path": "corpus/input.txt"}}, rows[one].raw["devices"]
    )
    (out / "auto.yaml").write_text(text)
    monkeypatch.chdir(out)
    written = recipe_lib.load(out / "auto.yaml")
    assert written.devices == "cpu:1" and dict(written.mesh) == {"batch": 1, "model": 1}
    assert written.data.path == str(work / "corpus" / "input.txt")
    by_hand = recipe_lib.load(
        GPT,
        recipe_lib.Overrides(
            (f"data.path={work / 'corpus' / 'input.txt'}", "layouts.rules={}"),
            "batch=1,model=1",
            "cpu:1",
        ),
    )
    assert recipe_lib.fingerprint(written) == recipe_lib.fingerprint(by_hand)
    note = report.idle_note(rows, one, 8)
    assert note.startswith("note: the chosen candidate trains on 1 of the 8 devices (cpu:1); 7")
    assert report.to_json(rows, one, {}, memory_lib.NO_BUDGET, 8)["idle_devices"] == 7
    all_eight = next(i for i, c in enumerate(rows) if c.fits and c.candidate.devices == 8)
    assert report.idle_note(rows, all_eight, 8) is None


def test_absolute_paths_leaves_urls_names_and_absolute_paths_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = {
        "path": "../x/*.txt",
        "eval_path": "/abs/eval.txt",
        "data_dir": "gs://bucket/tfds",
        "tokenizer": "bytes",
        "name": "digits",
    }
    assert report.absolute_paths(data) == {"path": str(tmp_path.parent / "x" / "*.txt")}
    assert report.absolute_paths({"tokenizer": "tok/tokenizer.json"}) == {
        "tokenizer": str(tmp_path / "tok" / "tokenizer.json")
    }
    assert report.absolute_paths({"tokenizer": {"train": "bpe"}}) == {}


def _fake_rates() -> cost.Calibration:
    rates = cost.Rates(1e10, {2: 1e-5, 8: 1e-5}, {2: 1e9, 8: 1e9}, 1e-6, 1e10)
    return cost.Calibration({1: rates, 2: rates, 4: rates, 8: rates}, xla=rates)


def test_a_set_model_build_is_found_beside_the_recipe_by_the_search_and_the_written_recipe(
    cli, tmp_path, monkeypatch
):
    """`--set model.build=custom_models:...` names a module beside the recipe, as it does for
    train and plain plan; --auto's candidates lost that folder ("No module named
    'custom_models'" from any other folder), and --write's recipe, read elsewhere, would look
    beside itself. --plot says what it wrote, as --write does; --no-progress says nothing as it
    goes (the fake probe's line included)."""
    monkeypatch.setenv(calibrate.CACHE_ENV, str(tmp_path / "cache"))
    said = []

    def probe(device_type, count, say):
        said.append(say("calibrating: a mesh of 8 devices"))
        return _fake_rates()

    monkeypatch.setattr(calibrate, "probe", probe)
    # the module importable only from the recipe's folder, as in a fresh process
    monkeypatch.delitem(sys.modules, "custom_models", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".") != RECIPES])
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    sets = ["--set", "model.layers=null", "--set", "model.build=custom_models:functional_mlp"]
    args = ["--write", out / "auto.yaml", "--plot", out / "rank.png", "--no-progress"]
    r = cli("plan", RECIPES / "quickstart.yaml", "--auto", "--devices", "cpu:8", "--recalibrate",
            *sets, *args, cwd=work)  # fmt: skip
    assert r.code == 0, r.err
    assert said == [None] and r.err == ""  # probed, silently
    lines = r.out.splitlines()
    assert f"wrote {out / 'rank.png'}" in lines and (out / "rank.png").stat().st_size > 0
    assert lines[-1] == f"wrote {out / 'auto.yaml'}: dtcli train {out / 'auto.yaml'}"
    written = recipe_lib.load(out / "auto.yaml")
    assert written.model.build == "custom_models:functional_mlp"
    assert written.model.build_path == str(RECIPES)


def test_a_calibration_says_each_probe_and_beats_while_one_lasts(tmp_path, monkeypatch):
    """Into a pipe, a probe of 13-19 s (a mesh of 8 virtual CPUs) was silent after its
    line: now a heartbeat (here every 0.05 s) names it until the next one starts."""
    from rich.console import Console

    from dtcli import progress

    monkeypatch.setenv(calibrate.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(calibrate, "device_kind", lambda device_type, count: "fake:8")
    monkeypatch.setattr(progress, "BEAT_EVERY", 0.05)
    err = StampedStream()
    heard = []

    def probe(device_type, count, say):
        for what in ("calibrating: a mesh of 8 devices", "calibrating: one device by XLA"):
            say(what)
            heard.append(err.wait_for(1, f"{what}... "))  # the probe blocks: a beat comes
        return _fake_rates()

    monkeypatch.setattr(calibrate, "probe", probe)
    rates, fresh = calibrate.rates_for("CPU", 8, Console(file=err, soft_wrap=True), True)
    assert fresh and rates == _fake_rates() and heard == [True, True]
    said = [line for line in err.getvalue().splitlines() if "... " not in line]  # no beats
    assert said[0].startswith("calibrating the cost model on cpu:8 (once; cached in ")
    assert said[1:] == ["calibrating: a mesh of 8 devices", "calibrating: one device by XLA"]
    assert calibrate.load_cached("fake:8") == rates


def test_gqa_tp_rules_keep_key_value_replicated_where_the_model_axis_does_not_divide_them():
    """tiny_gpt with 2 key/value heads of 4 (grouped-query attention) and swiglu: on model=2 the
    tensor-parallel preset splits query, key and value; on model=4 it keeps key and value
    replicated (the queries split) instead of being refused, and fits; the gate splits as fc."""
    sets = ("model.transformer.kv_heads=2", "model.transformer.activation=swiglu")
    _, model, checked = _search(GPT, sets)
    by = _by_label(checked)
    assert "tp on batch=4,model=2" in by and "tp on batch=2,model=4" not in by
    split, kept = by["tp on batch=4,model=2"], by["tp (k/v replicated) on batch=2,model=4"]
    assert split.fits and kept.fits, (split.rejected, kept.rejected)
    assert by["fsdp x tp (k/v replicated) on batch=2,model=4"].fits
    rules = kept.raw["layouts"]["rules"]
    assert rules == candidates.key_value_replicated(split.raw["layouts"]["rules"])
    plans = layout_lib.plan_weights(rules, model.weights, {"batch": 2, "model": 4})
    spec = {p.weight.path: p.spec for p in plans}
    assert spec["block_0.attention.query.kernel"] == ("unsharded", "model", "unsharded")
    assert spec["block_0.attention.key.kernel"] == ("unsharded",) * 3
    assert spec["block_0.mlp.gate.kernel"] == ("unsharded", "model")
