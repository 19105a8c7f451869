"""The recipe tree: types, unknown keys, overrides. Pure Python, no TensorFlow."""

from __future__ import annotations

import pytest
from conftest import RECIPES

from dtcli import recipe as R
from dtcli.errors import UsageError


def raw_quickstart() -> dict:
    return R.read_raw(RECIPES / "quickstart.yaml")


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads_and_starts_with_a_comment(path):
    recipe = R.load(path)
    assert recipe.name == path.stem
    first = path.read_text().splitlines()[0]
    assert first.startswith("# "), "each recipe starts with what it trains"
    assert "dtcli train" in path.read_text().split("\nname:")[0], "the header gives the command"


def test_quickstart_values_are_typed():
    r = R.load(RECIPES / "quickstart.yaml")
    assert r.mesh == {"batch": 4, "model": 2}
    assert r.optimizer.learning_rate == pytest.approx(3e-3)
    assert r.layouts.rules[r"dense_0\.kernel"] == ["unsharded", "model"]
    with pytest.raises(AttributeError):
        r.seed = 3  # frozen


def test_unknown_key_names_path_and_suggests():
    raw = raw_quickstart()
    raw["optimizer"]["learning_rte"] = 0.1
    with pytest.raises(
        UsageError, match=r"'optimizer.learning_rte' \(did you mean 'learning_rate'"
    ):
        R.from_mapping(raw)


def test_unknown_top_level_key():
    with pytest.raises(UsageError, match=r"unknown recipe key 'epochs'"):
        R.from_mapping({"epochs": 3})


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("data.batch_size", "big", r"'data.batch_size': expected an integer, got 'big'"),
        ("data.batch_size", 1.5, r"'data.batch_size': expected an integer"),
        ("train.epochs", True, r"'train.epochs': expected an integer"),
        ("optimizer.name", "lamb", r"'optimizer.name': expected one of 'sgd', 'adam', 'adamw'"),
        ("data.shuffle", "yes", r"'data.shuffle': expected true or false"),
        ("mesh", [4, 2], r"'mesh': expected a mapping"),
        ("optimizer.learning_rate", "fast", r"'optimizer.learning_rate': expected a number"),
    ],
)
def test_wrong_types_name_the_key(key, value, message):
    raw = raw_quickstart()
    R.apply_set(raw, f"{key}=placeholder")
    section, _, leaf = key.rpartition(".")
    (raw[section] if section else raw)[leaf] = value
    with pytest.raises(UsageError, match=message):
        R.from_mapping(raw)


def test_yaml_exponent_without_dot_is_a_float():
    # YAML 1.1 reads 3e-4 as a string; a learning rate written so must still work.
    r = R.load(RECIPES / "quickstart.yaml", ["optimizer.learning_rate=3e-4"])
    assert r.optimizer.learning_rate == pytest.approx(3e-4)


def test_set_overrides_and_type_checks():
    r = R.load(RECIPES / "quickstart.yaml", ["data.batch_size=32", "train.epochs=2", "seed=7"])
    assert (r.data.batch_size, r.train.epochs, r.seed) == (32, 2, 7)
    with pytest.raises(UsageError, match=r"'data.batch_size': expected an integer"):
        R.load(RECIPES / "quickstart.yaml", ["data.batch_size=abc"])
    with pytest.raises(UsageError, match=r"unknown recipe key 'data.bach_size'"):
        R.load(RECIPES / "quickstart.yaml", ["data.bach_size=3"])


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1", "data.batch_size=[1, 2"])
def test_unparsable_set(bad):
    with pytest.raises(UsageError, match=r"--set"):
        R.load(RECIPES / "quickstart.yaml", [bad])


def test_mesh_argument():
    assert R.parse_mesh_arg("batch=4,model=2") == {"batch": 4, "model": 2}
    with pytest.raises(UsageError, match="--mesh"):
        R.parse_mesh_arg("batch:4")
    with pytest.raises(UsageError, match="--mesh"):
        R.parse_mesh_arg("batch=four")


def test_mesh_override_keeps_rule_axes_with_size_one_and_devices_follow():
    r = R.load(RECIPES / "quickstart.yaml", mesh="batch=8")
    assert r.mesh == {"batch": 8, "model": 1}
    assert r.devices == "cpu"  # was cpu:8; the count now follows the mesh
    r = R.load(RECIPES / "quickstart.yaml", mesh="model=8")
    assert r.mesh == {"model": 8, "batch": 1}


def test_layout_axis_missing_from_recipe_mesh_is_an_error():
    raw = raw_quickstart()
    raw["layouts"]["rules"][r"dense_0\.kernel"] = ["unsharded", "modle"]
    with pytest.raises(UsageError, match=r"axis 'modle' is not in the mesh batch=4,model=2"):
        R.from_mapping(raw)


def test_data_axis_must_be_a_mesh_axis():
    raw = raw_quickstart()
    raw["layouts"]["data_axis"] = "data"
    with pytest.raises(UsageError, match=r"'layouts.data_axis': axis 'data' is not in the mesh"):
        R.from_mapping(raw)


def test_bad_regex_and_two_fill_axes():
    raw = raw_quickstart()
    raw["layouts"]["rules"]["dense_(0"] = ["unsharded", "model"]
    with pytest.raises(UsageError, match=r"not a valid regex"):
        R.from_mapping(raw)
    with pytest.raises(UsageError, match=r"at most one axis may be -1"):
        R.from_mapping({"mesh": {"batch": -1, "model": -1}})


def test_missing_and_unreadable_recipe_files(tmp_path):
    with pytest.raises(UsageError, match=r"no such file"):
        R.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("mesh: {batch: 4\n")
    with pytest.raises(UsageError, match=r"not valid YAML"):
        R.load(bad)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match=r"cannot read it"):
        R.load(binary)
    with pytest.raises(UsageError, match=r"no such file"):
        R.load(tmp_path)  # a folder is not a recipe


def test_dump_round_trips():
    r = R.load(RECIPES / "fashion_mnist_cnn.yaml")
    import yaml

    again = R.from_mapping(yaml.safe_load(R.dump(r)))
    assert again == r
