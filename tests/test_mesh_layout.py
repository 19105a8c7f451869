"""Mesh arithmetic and layout planning: pure functions, checked without devices."""

from __future__ import annotations

import pytest

from dtcli.errors import UsageError
from dtcli.layout import WeightInfo, match_rule, plan_weights, unused_rules
from dtcli.mesh import check_batch, data_shards, device_count_for, resolve_axes


def test_resolve_fills_one_axis():
    assert resolve_axes({"batch": -1, "model": 2}, 8) == {"batch": 4, "model": 2}
    assert resolve_axes({"batch": -1}, 1) == {"batch": 1}
    assert device_count_for({"batch": 4, "model": 2}) == 8
    assert device_count_for({"batch": -1}) is None


def test_sizes_must_multiply_to_the_device_count():
    with pytest.raises(
        UsageError, match=r"mesh batch=4,model=4: axis sizes multiply to 16, but there are 8"
    ):
        resolve_axes({"batch": 4, "model": 4}, 8)
    with pytest.raises(UsageError, match=r"do not divide the 8 devices"):
        resolve_axes({"batch": -1, "model": 3}, 8)


def test_batch_must_divide_by_the_data_axis():
    check_batch({"batch": 4, "model": 2}, "batch", 64, "data.batch_size")
    with pytest.raises(
        UsageError,
        match=r"'data.batch_size': 100 does not divide by the data axis 'batch' of size 8",
    ):
        check_batch({"batch": 8}, "batch", 100, "data.batch_size")
    assert data_shards({"model": 8}, "unsharded") == 1
    check_batch({"model": 8}, "unsharded", 7, "data.batch_size")


W = [
    WeightInfo("dense_0.kernel", (64, 128), "Dense"),
    WeightInfo("dense_0.bias", (128,), "Dense"),
    WeightInfo("dense_1.kernel", (128, 10), "Dense"),
    WeightInfo("dense_1.bias", (10,), "Dense"),
]
AXES = {"batch": 4, "model": 2}


def test_rules_give_specs_and_unmatched_weights_are_replicated():
    rules = {r"dense_0\.kernel": ["unsharded", "model"], r"dense_1\.kernel": ["model", "unsharded"]}
    plans = {p.weight.path: p for p in plan_weights(rules, W, AXES)}
    assert plans["dense_0.kernel"].spec == ("unsharded", "model")
    assert plans["dense_0.kernel"].shard_shape(AXES) == (64, 64)
    assert plans["dense_1.kernel"].shard_shape(AXES) == (64, 10)
    assert plans["dense_0.bias"].rule is None and plans["dense_0.bias"].spec == ("unsharded",)
    assert plans["dense_0.kernel"].bytes_per_device(AXES) == 64 * 64 * 4


def test_first_matching_rule_wins_like_layoutmap():
    rules = {r".*kernel": ["model", "unsharded"], r"dense_0\.kernel": ["unsharded", "model"]}
    assert match_rule(rules, "dense_0.kernel") == r".*kernel"
    rules = {"dense_0.kernel": ["unsharded", "model"], r".*kernel": ["model", "unsharded"]}
    assert match_rule(rules, "dense_0.kernel") == "dense_0.kernel"  # exact key first
    # re.match anchors at the start only
    assert match_rule({r"dense_0\.kernel": ["model"]}, "xdense_0.kernel") is None
    assert match_rule({r"dense_0": ["model"]}, "dense_0.kernel") == "dense_0"


def test_rank_mismatch_names_rule_and_weight():
    with pytest.raises(
        UsageError,
        match=r"'layouts.rules.dense_0\\.bias': gives 2 dims but weight 'dense_0.bias' has rank 1",
    ):
        plan_weights({r"dense_0\.bias": ["model", "unsharded"]}, W, AXES)


def test_non_divisible_dim():
    with pytest.raises(
        UsageError,
        match=r"dim 1 of weight 'dense_1.kernel' has size 10, which does not divide by mesh axis 'model' of size 4",
    ):
        plan_weights({r"dense_1\.kernel": ["unsharded", "model"]}, W, {"batch": 2, "model": 4})


def test_axis_missing_from_mesh():
    with pytest.raises(UsageError, match=r"axis 'tensor' is not in the mesh batch=4,model=2"):
        plan_weights({r"dense_0\.kernel": ["unsharded", "tensor"]}, W, AXES)


def test_convolution_kernels_cannot_be_sharded():
    conv = [WeightInfo("conv2d_0.kernel", (3, 3, 1, 32), "Conv2D")]
    with pytest.raises(UsageError, match=r"convolution kernel 'conv2d_0.kernel'.*fully replicated"):
        plan_weights(
            {r"conv.*kernel": ["unsharded", "unsharded", "unsharded", "model"]}, conv, AXES
        )


def test_unused_rules_are_reported():
    rules = {r"dense_0\.kernel": ["unsharded", "model"], r"dense_9\.kernel": ["unsharded", "model"]}
    assert unused_rules(rules, plan_weights(rules, W, AXES)) == [r"dense_9\.kernel"]
