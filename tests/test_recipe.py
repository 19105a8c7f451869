"""The recipe tree: types, unknown keys, overrides. Pure Python, no TensorFlow."""

from __future__ import annotations

import pytest
from conftest import RECIPES

from dtcli import recipe as R
from dtcli.errors import UsageError
from dtcli.recipe import data_checks


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
    r = R.load(RECIPES / "quickstart.yaml", R.Overrides(sets=["optimizer.learning_rate=3e-4"]))
    assert r.optimizer.learning_rate == pytest.approx(3e-4)


def test_set_overrides_and_type_checks():
    r = R.load(
        RECIPES / "quickstart.yaml",
        R.Overrides(sets=["data.batch_size=32", "train.epochs=2", "seed=7"]),
    )
    assert (r.data.batch_size, r.train.epochs, r.seed) == (32, 2, 7)
    with pytest.raises(UsageError, match=r"'data.batch_size': expected an integer"):
        R.load(RECIPES / "quickstart.yaml", R.Overrides(sets=["data.batch_size=abc"]))
    with pytest.raises(UsageError, match=r"unknown recipe key 'data.bach_size'"):
        R.load(RECIPES / "quickstart.yaml", R.Overrides(sets=["data.bach_size=3"]))


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1", "data.batch_size=[1, 2"])
def test_unparsable_set(bad):
    with pytest.raises(UsageError, match=r"--set"):
        R.load(RECIPES / "quickstart.yaml", R.Overrides(sets=[bad]))


def test_mesh_argument():
    assert R.parse_mesh_arg("batch=4,model=2") == {"batch": 4, "model": 2}
    with pytest.raises(UsageError, match="--mesh"):
        R.parse_mesh_arg("batch:4")
    with pytest.raises(UsageError, match="--mesh"):
        R.parse_mesh_arg("batch=four")


def test_mesh_override_keeps_rule_axes_with_size_one_and_devices_follow():
    r = R.load(RECIPES / "quickstart.yaml", R.Overrides(mesh="batch=8"))
    assert r.mesh == {"batch": 8, "model": 1}
    assert r.devices == "cpu"  # was cpu:8; the count now follows the mesh
    r = R.load(RECIPES / "quickstart.yaml", R.Overrides(mesh="model=8"))
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
    with pytest.raises(UsageError, match=r"is a folder, expected a recipe file"):
        R.load(tmp_path)  # a folder is not a recipe


def test_dump_round_trips():
    r = R.load(RECIPES / "fashion_mnist_cnn.yaml")
    import yaml

    again = R.from_mapping(yaml.safe_load(R.dump(r)))
    assert again == r


# --------------------------------------------------------------------------- base, ${VAR}, config


def write(folder, name: str, text: str):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_base_merges_mappings_key_by_key_and_replaces_the_rest(tmp_path):
    write(tmp_path, "common/base.yaml", (RECIPES / "quickstart.yaml").read_text())
    child = write(
        tmp_path,
        "exp/child.yaml",
        "base: ../common/base.yaml\nname: child\nmesh: {batch: 8}\n"
        "optimizer: {learning_rate: 0.01}\nlayouts: {rules: {}}\n",
    )
    r = R.load(child)
    base = R.load(RECIPES / "quickstart.yaml")
    assert r.name == "child"
    # Ordered mappings are replaced whole: the axes (their order matters) and the rules (the
    # first match wins); the base's model axis and rules are gone.
    assert r.mesh == {"batch": 8} and r.layouts.rules == {}
    assert r.layouts.data_axis == base.layouts.data_axis
    assert r.optimizer.learning_rate == pytest.approx(0.01)
    assert r.optimizer.name == base.optimizer.name  # the base's sibling key kept
    assert r.model == base.model and r.data == base.data and r.train == base.train


def test_base_chain_loop_missing_file_and_bad_value_are_one_line_errors(tmp_path):
    a = write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: a.yaml\n")
    with pytest.raises(
        UsageError, match=r"key 'base': the base chain loops \(a.yaml -> b.yaml -> a.yaml\)"
    ):
        R.load(a)
    c = write(tmp_path, "c.yaml", "base: nowhere.yaml\n")
    with pytest.raises(UsageError, match=r"c.yaml'?: key 'base': no such file '.*nowhere.yaml'"):
        R.load(c)
    (tmp_path / "folder.yaml").mkdir()
    f = write(tmp_path, "f.yaml", "base: folder.yaml\n")
    with pytest.raises(
        UsageError, match=r"key 'base': is a folder, not a recipe file: '.*folder.yaml'"
    ):
        R.load(f)
    with pytest.raises(UsageError, match=r"folder.yaml'?: is a folder, expected a recipe file"):
        R.load(tmp_path / "folder.yaml")
    d = write(tmp_path, "d.yaml", "base: [a.yaml]\n")
    with pytest.raises(UsageError, match=r"key 'base': expected the path of another recipe file"):
        R.load(d)
    e = write(tmp_path, "e.yaml", "base: e.yaml\n")
    with pytest.raises(UsageError, match="loops"):
        R.load(e)


def test_base_model_build_module_resolves_next_to_the_file_naming_it(tmp_path):
    base = write(tmp_path, "lib/base.yaml", "model: {build: mymodels:make}\n")
    child = write(tmp_path, "child.yaml", "base: lib/base.yaml\nname: x\n")
    assert R.read_raw(child)["model"]["build_path"] == str(base.parent.resolve())


def test_env_references_fill_from_the_environment_typed_when_whole(tmp_path):
    path = write(
        tmp_path,
        "r.yaml",
        "name: run-${USER_TAG}\ndata:\n  batch_size: ${BATCH}\n  path: ${DATA_ROOT:-/data}/x\n"
        "optimizer: {learning_rate: '${LR:-3e-3}'}\nmodel: {build: 'costs$${1}'}\n",
    )
    raw = R.read_raw(path, environ={"USER_TAG": "ab", "BATCH": "64"})
    assert raw["name"] == "run-ab"
    assert raw["data"]["batch_size"] == 64  # one whole reference: read as YAML, an integer
    assert raw["data"]["path"] == "/data/x"  # the default
    assert raw["optimizer"]["learning_rate"] == "3e-3"
    assert raw["model"]["build"] == "costs${1}"  # $${ is a literal ${


def test_env_reference_unset_or_malformed_names_the_key_and_variable(tmp_path):
    path = write(tmp_path, "r.yaml", "data: {path: '${DATA_ROOT}/train'}\n")
    with pytest.raises(
        UsageError, match=r"key 'data.path': environment variable DATA_ROOT is not set"
    ):
        R.read_raw(path, environ={})
    nested = write(tmp_path, "nested.yaml", "name: ${A:-${B:-c}}\n")
    with pytest.raises(UsageError, match=r"key 'name': a default holding another reference"):
        R.read_raw(nested, environ={})
    bad = write(tmp_path, "bad.yaml", "layouts: {rules: {x: ['${1model}']}}\n")
    with pytest.raises(UsageError, match=r"key 'layouts.rules.x\[0\]': '\$\{1model\}' is not a"):
        R.read_raw(bad, environ={})


def test_dump_writes_a_literal_dollar_brace_so_the_resolved_recipe_loads_back(tmp_path):
    raw = raw_quickstart()
    raw["data"].update(source="idx", path="a${b}")  # embedded data reads no data.path
    recipe = R.from_mapping(raw)
    path = write(tmp_path, "resolved.yaml", R.dump(recipe))
    assert R.load(path) == recipe


def test_config_prints_the_resolved_recipe_and_the_schema(tmp_path):
    from conftest import run_cli

    write(tmp_path, "base.yaml", (RECIPES / "quickstart.yaml").read_text())
    child = write(tmp_path, "child.yaml", "base: base.yaml\nname: ${RUN_NAME:-c}\n")
    res = run_cli("config", child, "--set", "train.epochs=3")
    assert res.code == 0, res.err
    printed = R.from_mapping(R.load_yaml(res.out))
    assert printed.name == "c" and printed.train.epochs == 3
    assert printed.model == R.load(RECIPES / "quickstart.yaml").model

    res = run_cli("config", RECIPES / "quickstart.yaml", "--schema")
    assert res.code == 0, res.err
    import json

    schema = json.loads(res.out)
    assert schema["additionalProperties"] is False
    rate = schema["properties"]["optimizer"]["properties"]["learning_rate"]
    assert rate["default"] == R.OptimizerConfig().learning_rate
    assert {"type": "number"} in rate["anyOf"]
    assert schema["properties"]["task"]["enum"] == ["classify", "language_model"]

    res = run_cli("config", tmp_path / "missing.yaml")
    assert res.code == 2 and res.err.startswith("error: recipe") and "no such file" in res.err


def _keys_in_schema(raw: dict, node: dict, path: str) -> list[str]:
    """Keys of a raw recipe the schema does not describe (a schema out of step with the tree)."""
    missing = []
    for key, value in raw.items():
        props = node.get("properties")
        if props is None:  # a free mapping (mesh axes, layout rules, model args)
            continue
        if key not in props:
            missing.append(f"{path}{key}")
            continue
        child = props[key]
        options = child.get("anyOf", [child])
        objects = [o for o in options if o.get("type") == "object"]
        if isinstance(value, dict) and objects:
            missing += _keys_in_schema(value, objects[0], f"{path}{key}.")
    return missing


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_schema_describes_every_key_of_every_shipped_recipe(path):
    schema = R.schema()
    resolved = R.to_mapping(R.load(path))
    assert _keys_in_schema(resolved, schema, "") == []
    # and refuses what the loader refuses: an unknown key at any level
    assert schema["properties"]["train"]["additionalProperties"] is False


def test_version_and_python_m(tmp_path):
    import subprocess
    import sys

    from dtcli import __version__

    proc = subprocess.run(
        [sys.executable, "-m", "dtcli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"dtcli {__version__} (tensorflow 2.21")
    proc = subprocess.run(
        [sys.executable, "-m", "dtcli", "config", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "--schema" in proc.stdout


def test_tfds_sources_without_the_tfds_extra_name_the_extra(monkeypatch):
    monkeypatch.setattr(data_checks, "tfds_installed", lambda: False)
    raw = raw_quickstart()
    raw["data"] = {"source": "tfds", "name": "mnist", "shape": [28, 28, 1]}
    with pytest.raises(
        UsageError,
        match=r"recipe key 'data.source': TFDS data sets need the tfds extra.*pip install 'dtensor-cli\[tfds\]'",
    ):
        R.from_mapping(raw)
    lm = R.read_raw(RECIPES / "tiny_gpt.yaml")
    lm["data"]["name"] = "tiny_shakespeare"
    with pytest.raises(UsageError, match=r"recipe key 'data.name': TFDS data sets need the tfds"):
        R.from_mapping(lm)
    del lm["data"]["name"]
    R.from_mapping(lm)  # a text file or the embedded default: no TFDS needed


@pytest.mark.parametrize(
    "sets", [[], ["optimizer.learning_rate=3e-4", "data.batch_size=32"], ["train.epochs=5"]]
)
def test_load_takes_set_assignments_alone_or_as_overrides(sets):
    path = RECIPES / "quickstart.yaml"
    overrides = R.Overrides(sets=sets)
    assert R.load(path, sets) == R.load(path, overrides)
    assert R.from_mapping(overrides.apply(R.read_raw(path))) == R.load(path, overrides)


def test_overrides_apply_in_the_order_the_options_were_always_applied():
    raw = raw_quickstart()
    before = R.read_raw(RECIPES / "quickstart.yaml")
    out = R.Overrides(sets=["mesh.batch=2", "devices=cpu:2"], mesh="model=4", epochs=3).apply(raw)
    assert raw == before  # the raw mapping given is not changed
    assert out["mesh"] == {"model": 4, "batch": 1}  # --mesh after --set replaces the mesh
    assert out["devices"] == "cpu"  # a new mesh: the count follows it
    assert out["train"]["epochs"] == 3
    with pytest.raises(UsageError, match=r"^--epochs: this recipe counts train.steps"):
        R.Overrides(sets=["train.steps=10"], epochs=2).apply(raw)
    with pytest.raises(UsageError, match=r"--devices"):
        R.Overrides(devices="cpu:x").apply(raw)


@pytest.mark.parametrize(
    "overrides",
    [
        R.Overrides(),
        R.Overrides(sets=("a.b=1", "c=[1, 2]", "d=x=y")),
        R.Overrides(mesh="batch=-1,model=2", epochs=3),
        R.Overrides(sets=["train.keep=2"], mesh="batch=4", devices="cpu:8", epochs=1),
    ],
)
def test_overrides_to_argv_round_trips_through_dtcli_train(overrides):
    import typer

    from dtcli.cli.app import app

    train = typer.main.get_command(app).commands["train"]
    params = train.make_context("train", ["r.yaml", *overrides.to_argv()]).params
    parsed = R.Overrides(params["sets"] or (), params["mesh"], params["devices"], params["epochs"])
    assert parsed == overrides


def test_overrides_to_argv_lists_the_options_as_launch_passes_them():
    overrides = R.Overrides(sets=["a=1", "b=2"], mesh="batch=2", devices="cpu:2", epochs=4)
    assert overrides.to_argv() == [
        "--set", "a=1", "--set", "b=2", "--mesh", "batch=2", "--epochs", "4", "--devices", "cpu:2",
    ]  # fmt: skip


# ---- messages a new user reads (issue 24, item 7)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "name: x\n\tseed: 1\n",
            r"not valid YAML at line 2, column 1: a tab character; indent with spaces$",
        ),
        (
            "data: {path: ${HOME}}\n",
            r"not valid YAML at line 1, column 15: expected ',' or '\}', but got '\{' "
            r"\(quote a \$\{NAME\} inside \{\.\.\.\} or \[\.\.\.\]: '\$\{NAME\}'\)$",
        ),
        ("mesh: {batch: 4\n", r"not valid YAML at line 2, column 1: expected ',' or '\}'"),
        ("a: b: c\n", r"not valid YAML at line 1, column 5: mapping values are not allowed here$"),
    ],
)
def test_yaml_errors_give_line_column_and_reason(tmp_path, text, expected):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=expected):
        R.load(path)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_an_empty_recipe_file_says_so(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=r"^recipe '.*r\.yaml': is empty \(expected a mapping"):
        R.load(path)


def test_set_into_a_list_shows_the_whole_list_form():
    quick = RECIPES / "quickstart.yaml"
    with pytest.raises(UsageError) as info:
        R.load(quick, R.Overrides(sets=("model.layers.0.Dense.units=64",)))
    message = str(info.value)
    assert "'model.layers' is a list: set an item by replacing the whole list" in message
    form = message.split("--set '", 2)[2].rstrip("'")
    # The form it shows works, and sets exactly that item.
    changed = R.load(quick, R.Overrides(sets=(form,)))
    assert changed.model.layers[0] == {"Dense": {"units": 64, "activation": "relu"}}
    assert changed.model.layers[1:] == R.load(quick).model.layers[1:]
    with pytest.raises(UsageError, match=r"--set 'model\.layers=\[\.\.\.\]'$"):
        R.load(quick, R.Overrides(sets=("model.layers.9.Dense.units=64",)))


@pytest.mark.parametrize(
    "assignment, shown",
    [
        ("train.epochs=true", "got true"),
        ("seed=null", "got null"),
        ("data.batch_size=[1, 2]", "got [1, 2]"),
        ("data.batch_size={a: 1}", "got {a: 1}"),
        ("name=false", "got false"),
        ("optimizer.learning_rate=.inf", "got .inf"),
        # YAML's {run: null}: the text given, for the key's own check (data.tokenizer=bpe:)
        ("name=run:", "got 'run:'"),
    ],
)
def test_messages_show_values_as_yaml_not_python(assignment, shown):
    with pytest.raises(UsageError) as info:
        R.load(RECIPES / "quickstart.yaml", R.Overrides(sets=(assignment,)))
    message = str(info.value)
    assert message.endswith(shown), message
    assert not any(word in message for word in ("True", "False", "None", "inf)"))


def test_a_mistake_in_a_key_an_option_set_names_the_option():
    """`--epochs 0` said `recipe key 'train.epochs'`, a key the user never typed (as --devices
    already named itself): each option that sets a recipe key is named, with its value."""
    given = R.Overrides(
        sets=("seed=1",), mesh="batch=-1", devices="gpu:2", epochs=0, eval_batch_size=30
    )
    named = {
        "recipe key 'train.epochs': expected an integer >= 1, got 0": "--epochs 0: expected",
        "recipe key 'mesh': at most one axis may be -1": "--mesh 'batch=-1': at most",
        "recipe key 'mesh.model': not a usable axis name": "--mesh 'batch=-1': not a usable",
        "recipe key 'devices' = 'gpu:2': TensorFlow sees no GPU": "--devices 'gpu:2': TensorFlow",
        "recipe key 'data.eval_batch_size': eval batches of 30": "--batch-size 30: eval batches",
    }
    for message, start in named.items():
        assert str(given.named(UsageError(message))).startswith(start), message
    for message in ("recipe key 'seed': expected", "recipe key 'train.steps': x", "mesh a: b"):
        assert str(given.named(UsageError(message))) == message  # not an option's key
    assert str(R.Overrides().named(UsageError("recipe key 'mesh': x"))) == "recipe key 'mesh': x"
    with pytest.raises(UsageError, match=r"^--epochs 0: expected an integer >= 1, got 0$"):
        R.load(RECIPES / "quickstart.yaml", R.Overrides(epochs=0))
    with pytest.raises(UsageError, match=r"^recipe key 'train.epochs': expected an integer >= 1"):
        R.load(RECIPES / "quickstart.yaml", R.Overrides(sets=("train.epochs=0",)))
