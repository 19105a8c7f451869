"""Every bad recipe value is refused in one line naming its key, before any training.

Recipe, --mesh and devices checks are pure Python; the model-fit checks build a tiny model on the
host (TensorFlow in this process, on the session's 8 virtual CPUs).
"""

from __future__ import annotations

import dataclasses
import gzip
import math
import re
import typing

import numpy as np
import pytest
from conftest import RECIPES

from dtcli import data as D
from dtcli import devices
from dtcli import recipe as R
from dtcli.errors import UsageError
from dtcli.recipe import DataConfig, ModelConfig, data_checks


def refused(fn, *args, match: str, **kwargs) -> str:
    """Call fn; it must raise a one-line UsageError matching `match` (a regex)."""
    with pytest.raises(UsageError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    assert re.search(match, message), message
    return message


def with_key(key: str, value, recipe=RECIPES / "quickstart.yaml") -> dict:
    """A recipe (the quickstart's) with one key (dotted path) set to a Python value."""
    raw = R.read_raw(recipe)
    node = raw
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return raw


# --------------------------------------------------------------------------- recipe values


@pytest.mark.parametrize("seed", [-1, 2**32, 10**30])
def test_seed_out_of_range(seed):
    refused(
        R.from_mapping,
        with_key("seed", seed),
        match=rf"^recipe key 'seed': expected an integer in \[0, 2\*\*32 - 1\], got {seed}$",
    )


def test_seed_at_the_edges_is_fine():
    assert R.from_mapping(with_key("seed", 0)).seed == 0
    assert R.from_mapping(with_key("seed", 2**32 - 1)).seed == 2**32 - 1


@pytest.mark.parametrize(
    "key", ["optimizer.learning_rate", "optimizer.epsilon", "optimizer.weight_decay"]
)
@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, "nan", "inf", "-Infinity", 10**400]
)
def test_float_keys_must_be_finite(key, value):
    refused(
        R.from_mapping,
        with_key(key, value),
        match=rf"^recipe key '{re.escape(key)}': expected a finite number, got ",
    )


@pytest.mark.parametrize("text", [".nan", ".inf", "-.inf", ".NaN", "1e400"])
def test_yaml_nan_and_inf_in_a_file_and_in_set(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(f"optimizer:\n  learning_rate: {text}\n")
    refused(R.load, path, match=r"^recipe key 'optimizer.learning_rate': expected a finite number")
    refused(
        R.load,
        RECIPES / "quickstart.yaml",
        [f"optimizer.beta_1={text}"],
        match=r"^recipe key 'optimizer.beta_1': expected a finite number",
    )


def test_ordinary_float_spellings_still_load():
    r = R.load(RECIPES / "quickstart.yaml", ["optimizer.learning_rate=1e-3", "optimizer.beta_1=0"])
    assert r.optimizer.learning_rate == pytest.approx(1e-3) and r.optimizer.beta_1 == 0.0


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("learning_rate", 0, "a positive number"),
        ("learning_rate", -0.1, "a positive number"),
        ("beta_1", 1.5, r"a number in \[0, 1\)"),
        ("beta_1", 1, r"a number in \[0, 1\)"),
        ("beta_2", -0.1, r"a number in \[0, 1\)"),
        ("epsilon", 0, "a positive number"),
        ("momentum", 1.01, r"a number in \[0, 1\]"),
        ("momentum", -0.5, r"a number in \[0, 1\]"),
        ("weight_decay", -1e-4, "a number >= 0"),
    ],
)
def test_optimizer_ranges(key, value, expected):
    got = re.escape(repr(float(value)))
    refused(
        R.from_mapping,
        with_key(f"optimizer.{key}", value),
        match=rf"^recipe key 'optimizer.{key}': expected {expected}, got {got}$",
    )


def test_optimizer_edges_are_fine():
    raw = with_key("optimizer.momentum", 1)
    raw["optimizer"].update(beta_1=0, beta_2=0.0, weight_decay=0)
    R.from_mapping(raw)


@pytest.mark.parametrize(
    "key, value, low",
    [
        ("checkpoint_every", -1, 0),
        ("keep", 0, 1),
        ("log_every", 0, 1),
        ("epochs", 0, 1),
    ],
)
def test_each_train_key_has_its_own_message(key, value, low):
    refused(
        R.from_mapping,
        with_key(f"train.{key}", value),
        match=rf"^recipe key 'train.{key}': expected an integer >= {low}, got {value}$",
    )


# Integer keys whose 0 means something: a checkpoint only at the end, no warmup.
ZERO_MEANS_SOMETHING = {"train.checkpoint_every", "optimizer.warmup_steps"}
# The keys of a language model alone, tried on tiny_gpt only (on the quickstart the model or the
# source refuses them first).
LM_SECTIONS = ("model.transformer", "data.tokenizer")
LM_KEYS = {"data.context"}


def _integer_keys() -> list[str]:
    """Every integer key of the recipe (dotted), found from the dataclasses' type hints: a key
    added later is in the table below without a new row."""
    sections = {
        "train": R.TrainConfig,
        "data": DataConfig,
        "optimizer": R.OptimizerConfig,
        "model.transformer": R.TransformerConfig,
        "data.tokenizer": R.TrainTokenizerConfig,
    }
    keys = []
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        keys += [
            f"{section}.{f.name}"
            for f in dataclasses.fields(cls)
            if hints[f.name] in (int, int | None)
        ]
    return keys


def _recipes_for(key: str) -> tuple[str, ...]:
    lm_only = key in LM_KEYS or key.startswith(LM_SECTIONS)
    return ("tiny_gpt.yaml",) if lm_only else ("tiny_gpt.yaml", "quickstart.yaml")


COUNT_CASES = [
    (recipe, key, value)
    for key in _integer_keys()
    for value in ((-1,) if key in ZERO_MEANS_SOMETHING else (0, -1))
    for recipe in _recipes_for(key)
]


@pytest.mark.parametrize("recipe, key, value", COUNT_CASES)
def test_every_integer_key_refuses_zero_and_negative_counts_by_name(recipe, key, value):
    """0 or a negative count is refused in one line naming the key, on a classifier's epochs
    recipe (a 2-D mesh: the micro-batch's division) and a language model's train.steps recipe
    (train.steps replaces epochs and steps_per_epoch): train.accumulate 0 was a
    ZeroDivisionError, train.eval_every 0 with train.steps passed as null."""
    raw = with_key(key, value, RECIPES / recipe)
    refused(R.from_mapping, raw, match=rf"^recipe key '{re.escape(key)}': .*got {value}\b")


def test_accumulate_zero_says_what_it_expects():
    refused(
        R.from_mapping,
        with_key("train.accumulate", 0),
        match=r"^recipe key 'train.accumulate': expected an integer from 1 to 1024 "
        r"\(micro-batches per optimizer step, a divisor of data.batch_size\), got 0$",
    )


@pytest.mark.parametrize(
    "model, key, this",
    [
        ({"transformer": {"remat": True}}, "model.transformer.remat", "a tf-keras layer list (model.layers)"),
        ({"transformer": {"dropout": 0.1}}, "model.transformer.dropout", "a tf-keras layer list (model.layers)"),
        ({"transformer": {}}, "model.transformer", "a tf-keras layer list (model.layers)"),
        ({"layers": None, "build": "custom_models:functional_mlp", "transformer": {"remat": True}},
         "model.transformer.remat", "a tf-keras model from model.build"),
        ({"api": "core", "layers": None, "transformer": {"remat": True}},
         "model.transformer.remat", "a Core-API MLP (model.api core)"),
    ],
)  # fmt: skip
def test_transformer_keys_on_a_classifier_say_they_are_for_dtclis_gpt(model, key, this):
    """Issue 43: model.transformer.remat on a layer list said "api keras needs exactly one of
    'layers', 'build' or 'transformer'" (and the Core MLP's "api core takes 'hidden'")."""
    raw = R.read_raw(RECIPES / "quickstart.yaml")
    raw["model"].update(model)
    refused(
        R.from_mapping,
        raw,
        match=rf"^recipe key '{re.escape(key)}': model.transformer configures dtcli's GPT \(task "
        rf"language_model\) only, and this classifier is {re.escape(this)}; remove "
        r"model.transformer$",
    )


def test_empty_layer_list_is_refused_but_a_linear_core_mlp_is_fine():
    refused(
        R.from_mapping,
        with_key("model.layers", []),
        match=r"^recipe key 'model.layers': expected at least one layer, got \[\]$",
    )
    r = R.from_mapping({"model": {"api": "core", "hidden": []}})
    assert r.model.hidden == []


@pytest.mark.parametrize("shape", [[], [28, 0], [-1, 4]])
def test_data_shape_dims(shape):
    refused(
        R.from_mapping,
        with_key("data.shape", shape),
        match=r"^recipe key 'data.shape': expected at least one dim, each a positive integer",
    )


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("classes", 1, "an integer >= 2"),
        ("count", 0, "a positive integer"),
        ("eval_count", -3, "a positive integer"),
        ("batch_size", 0, "a positive integer"),
        ("eval_batch_size", 0, "a positive integer or null"),
    ],
)
def test_data_counts(key, value, expected):
    refused(
        R.from_mapping,
        with_key(f"data.{key}", value),
        match=rf"^recipe key 'data.{key}': expected {expected}, got {value}$",
    )


def test_synthetic_data_larger_than_memory(monkeypatch):
    monkeypatch.setattr(data_checks, "_physical_memory", lambda: 16 * 2**30)
    raw = with_key("data.source", "synthetic")
    raw["data"].update(shape=[28, 28, 1], count=10_000_000, eval_count=1024)
    message = refused(
        R.from_mapping,
        raw,
        match=r"^recipe key 'data.count': synthetic data of 10000000 train \+ 1024 eval examples",
    )
    assert "29.2 GiB" in message and "16.0 GiB" in message and "data.shape" in message
    raw["data"].update(count=1024, eval_count=10_000_000)
    refused(R.from_mapping, raw, match=r"^recipe key 'data.eval_count': ")
    raw["data"].update(count=4096, eval_count=1024, shape=[100_000, 100_000])
    refused(R.from_mapping, raw, match=r"^recipe key 'data.count': .*shape \[100000, 100000\]")
    raw["data"].update(shape=[1000], classes=10**8)
    refused(R.from_mapping, raw, match=r"^recipe key 'data.classes': 100000000 classes")
    # The same sizes fit a machine with enough memory; other sources make no synthetic data.
    monkeypatch.setattr(data_checks, "_physical_memory", lambda: 2**50)
    R.from_mapping(raw)
    monkeypatch.setattr(data_checks, "_physical_memory", lambda: 16 * 2**30)
    raw["data"].update(source="embedded", count=10**9)
    R.from_mapping(raw)


@pytest.mark.parametrize("key", ["batch_size", "eval_batch_size"])
def test_absurd_batch_is_refused(monkeypatch, key):
    monkeypatch.setattr(data_checks, "_physical_memory", lambda: 16 * 2**30)
    raw = with_key(f"data.{key}", 10**12)
    raw["data"].update(source="tfds", name="mnist")  # a training count unknown to the recipe
    refused(
        R.from_mapping,
        raw,
        match=rf"^recipe key 'data.{key}': a batch of {10**12} examples of 784 values needs "
        r"2920627.6 GiB of host memory, more than half of this machine's 16.0 GiB$",
    )
    raw["data"][key] = 4096  # big but fine
    R.from_mapping(raw)


def test_unknown_memory_skips_the_memory_checks(monkeypatch):
    monkeypatch.setattr(data_checks, "_physical_memory", lambda: None)
    raw = with_key("data.batch_size", 10**12)
    raw["data"].update(source="tfds", name="mnist")
    R.from_mapping(raw)


# --------------------------------------------------------------------------- duplicate keys


def test_duplicate_keys_in_the_file_name_path_and_lines(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: dup\n"
        "optimizer:\n"
        "  name: adam\n"
        "  learning_rate: 0.1\n"
        "  beta_1: 0.9\n"
        "  learning_rate: 0.2\n"
    )
    refused(
        R.load,
        path,
        match=rf"^recipe {re.escape(repr(str(path)))}: key 'optimizer.learning_rate' appears "
        r"twice \(lines 4 and 6\)$",
    )


def test_duplicate_top_level_and_nested_in_lists(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("seed: 1\nname: a\nseed: 2\n")
    refused(R.load, path, match=r"key 'seed' appears twice \(lines 1 and 3\)$")
    path.write_text("model:\n  layers:\n    - Dense: {units: 10, units: 12}\n")
    refused(
        R.load, path, match=r"key 'model.layers\[0\].Dense.units' appears twice \(lines 3 and 3\)"
    )
    path.write_text("mesh: {batch: 4, batch: 2}\n")
    refused(R.load, path, match=r"key 'mesh.batch' appears twice")


def test_same_key_in_different_mappings_and_merge_keys_are_fine(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: ok\n"
        "data: {batch_size: 32, name: digits}\n"
        "x-base: &base {learning_rate: 0.01, name: sgd}\n"
    )
    with pytest.raises(UsageError, match="unknown recipe key 'x-base'"):
        R.load(path)
    path.write_text(
        "name: ok\noptimizer:\n  <<: {name: sgd, learning_rate: 0.5}\n  learning_rate: 0.01\n"
    )
    raw = R.read_raw(path)
    assert raw["optimizer"] == {"name": "sgd", "learning_rate": 0.01}


def test_duplicate_keys_in_a_set_value():
    refused(
        R.load,
        RECIPES / "quickstart.yaml",
        ["model.args={depth: 2, depth: 3}"],
        match=r"^--set 'model.args=\{depth: 2, depth: 3\}': key 'model.args.depth' appears twice$",
    )


def test_yaml_values_python_cannot_build(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: 2024-13-45\n")
    refused(R.load, path, match=r"^recipe .*: not valid YAML \(")


# --------------------------------------------------------------------------- --mesh


@pytest.mark.parametrize(
    "text, message",
    [
        ("batch=4,batch=2", r"^--mesh 'batch=4,batch=2': axis 'batch' appears twice$"),
        ("batch=4, batch =2", r"axis 'batch' appears twice$"),
        ("batch=", r"^--mesh 'batch=': axis 'batch' has no size"),
        ("batch=4,model= ", r"axis 'model' has no size"),
        (
            "batch=-3",
            r"^--mesh 'batch=-3': size of axis 'batch' must be a positive integer or -1, got -3$",
        ),
        ("batch=0", r"size of axis 'batch' must be a positive integer or -1, got 0$"),
        ("batch=four", r"size of axis 'batch' must be an integer$"),
    ],
)
def test_mesh_argument_errors(text, message):
    refused(R.parse_mesh_arg, text, match=message)


def test_mesh_argument_fill_axis_is_fine():
    assert R.parse_mesh_arg("batch=-1,model=2") == {"batch": -1, "model": 2}


# --------------------------------------------------------------------------- devices


@pytest.mark.parametrize("spec", ["cpu:08", "gpu:01", "cpu:00"])
def test_device_count_with_a_leading_zero(spec):
    refused(
        devices.parse,
        spec,
        match=rf"^recipe key 'devices': the device count in '{spec}' has a leading zero",
    )


def test_virtual_cpu_cap():
    assert devices.MAX_VIRTUAL_CPUS == 64
    assert devices.parse("cpu:64").count == 64
    refused(
        devices.parse,
        "cpu:500",
        match=r"^recipe key 'devices': cpu:500 asks for 500 virtual CPUs; at most 64 "
        r"\(MAX_VIRTUAL_CPUS",
    )
    refused(devices.parse, "cpu:65", "--devices", match=r"^--devices: cpu:65 asks for 65")
    assert devices.parse("gpu:500").count == 500  # GPUs are checked against the real ones
    refused(devices.parse, "gpu:" + "9" * 5000, match=r"more devices than any machine has")


def test_virtual_cpu_cap_in_a_recipe_and_through_the_mesh():
    refused(R.from_mapping, with_key("devices", "cpu:128"), match=r"^recipe key 'devices': ")
    raw = with_key("devices", "cpu")
    raw["mesh"] = {"batch": 32, "model": 4}
    refused(
        R.from_mapping,
        raw,
        match=r"^recipe key 'mesh': batch=32,model=4 asks for 128 devices, and devices 'cpu' "
        r"makes them virtual CPUs; at most 64 \(MAX_VIRTUAL_CPUS",
    )
    raw["devices"] = "auto"
    refused(R.from_mapping, raw, match=r"^recipe key 'mesh': .*on a machine without GPUs")
    raw["devices"] = "gpu"
    R.from_mapping(raw)  # GPU counts are checked when the devices are configured
    refused(
        R.load,
        RECIPES / "quickstart.yaml",
        R.Overrides(mesh="batch=128"),
        match=r"^--mesh 'batch=128': batch=128,model=1 asks for 128 devices",
    )
    assert R.load(RECIPES / "quickstart.yaml", R.Overrides(mesh="batch=64")).mesh == {
        "batch": 64,
        "model": 1,
    }


# --------------------------------------------------------------------------- data


@pytest.mark.parametrize(
    "data, known",
    [
        ({"source": "synthetic", "count": 50}, 50),
        ({"source": "embedded"}, 1437),
        ({"source": "embedded", "eval_range": [1000, 1797]}, 898),
        ({"source": "idx", "path": "/x", "train_range": [100, 200]}, 100),
    ],
)
def test_batch_larger_than_the_training_split_in_the_recipe(data, known):
    raw = with_key("data.batch_size", known + 4)  # divides by the data axis (4)
    raw["data"].update(data)
    refused(
        R.from_mapping,
        raw,
        match=rf"^recipe key 'data.batch_size': {known + 4} is more than the {known} training "
        rf"examples of data.source {data['source']}; use a batch of at most {known}$",
    )
    raw["data"]["batch_size"] = known
    raw["mesh"] = {"batch": 1, "model": 8}  # (a batch of 4 would have to divide `known`)
    R.from_mapping(raw)


def test_batch_larger_than_the_loaded_training_split(tmp_path):
    cfg = idx_folder(tmp_path)  # 100 examples, 50 train
    ds = D.load(cfg)
    D.check_batch_fits(cfg, ds)
    big = DataConfig(**{**cfg.__dict__, "batch_size": 64})
    refused(
        D.check_batch_fits,
        big,
        ds,
        match=r"^recipe key 'data.batch_size': 64 is more than the 50 training examples of IDX "
        r"files in .*; use a batch of at most 50$",
    )


def write_idx(path, array: np.ndarray, compress: bool = True, cut: int = 0) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    if compress:
        raw = gzip.compress(raw)
    path.write_bytes(raw[: len(raw) - cut])


def idx_folder(tmp_path, images_cut=0, labels=None, compress=True):
    rng = np.random.default_rng(0)
    write_idx(
        tmp_path / "t10k-images-idx3-ubyte.gz",
        rng.integers(0, 256, (100, 28, 28)),
        compress=compress,
        cut=images_cut,
    )
    write_idx(
        tmp_path / "t10k-labels-idx1-ubyte.gz",
        np.arange(100) % 10 if labels is None else labels,
        compress=False,
    )
    return DataConfig(source="idx", path=str(tmp_path), batch_size=10)


@pytest.mark.parametrize("compress", [True, False])
def test_truncated_idx_file_names_data_path_and_the_file(tmp_path, compress):
    cfg = idx_folder(tmp_path, images_cut=500, compress=compress)
    refused(
        D.load,
        cfg,
        match=r"^recipe key 'data.path': .*t10k-images-idx3-ubyte\.gz (is truncated|\(the "
        r"compressed file is truncated\))",
    )


def test_corrupt_gzip_and_extra_bytes(tmp_path):
    idx_folder(tmp_path)
    images = tmp_path / "t10k-images-idx3-ubyte.gz"
    raw = bytearray(images.read_bytes())
    raw[40:60] = b"\x00" * 20
    images.write_bytes(bytes(raw))
    refused(
        D.load,
        DataConfig(source="idx", path=str(tmp_path)),
        match=r"^recipe key 'data.path': cannot read .*t10k-images",
    )
    images.write_bytes(bytes(raw[:15]))  # describe reads only the header: cut into it
    refused(
        D.describe,
        DataConfig(source="idx", path=str(tmp_path)),
        match=r"^recipe key 'data.path': cannot read .*t10k-images.* \(the compressed file is "
        r"truncated\)$",
    )
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes() + b"\x01\x02")
    write_idx(images, np.zeros((100, 28, 28)))
    refused(
        D.load,
        DataConfig(source="idx", path=str(tmp_path)),
        match=r"^recipe key 'data.path': .*t10k-labels-idx1-ubyte\.gz is not a valid IDX file",
    )


def test_labels_that_are_not_one_per_example(tmp_path):
    cfg = idx_folder(tmp_path, labels=np.zeros((100, 2)))
    refused(D.load, cfg, match=r"^recipe key 'data.path': .*labels.* holds 2-D data")
    refused(D.describe, cfg, match=r"holds 2-D data")


# --------------------------------------------------------------------------- the model fits


def describe(layers=None, input_shape=(64,), classes=10, **kw):
    from dtcli import models

    cfg = ModelConfig(layers=layers, **kw)
    return models.describe_keras(cfg, input_shape, classes, 0)


def test_dense_on_unflattened_images_is_refused(cpu8):
    refused(
        describe,
        [{"Dense": {"units": 10}}],
        (28, 28, 1),
        match=r"^recipe key 'model': the model's output has shape \(1, 28, 28, 10\) for a batch "
        r"of 1 but the data has 10 classes: expected \(batch, 10\) logits \(an MLP fed "
        r"unflattened images\? set data.flatten: true or add a Flatten layer\)$",
    )


def test_last_layer_width_must_match_the_classes(cpu8):
    refused(
        describe,
        [{"Dense": {"units": 32}}, {"Dense": {"units": 7}}],
        match=r"^recipe key 'model': the model's last layer gives 7 outputs but the data has 10 "
        r"classes",
    )
    infos, _ = describe([{"Dense": {"units": 32}}, {"Dense": {"units": 10}}])
    assert {w.path for w in infos} >= {"dense_1.kernel", "dense_1.bias"}


def write_module(tmp_path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(body)
    return str(tmp_path)


def test_build_function_raising_anything_names_model_build(cpu8, tmp_path):
    folder = write_module(
        tmp_path,
        "vmod_raises",
        "def fn(input_shape, num_classes, depth=1):\n"
        "    raise ValueError('depth 1 is too shallow\\nsecond line')\n",
    )
    refused(
        describe,
        build="vmod_raises:fn",
        build_path=folder,
        match=r"^recipe key 'model.build': vmod_raises:fn raised ValueError: depth 1 is too "
        r"shallow$",
    )
    # Arguments the function does not take still name model.args.
    refused(
        describe,
        build="vmod_raises:fn",
        build_path=folder,
        args={"width": 3},
        match=r"^recipe key 'model.args': vmod_raises:fn rejected them",
    )


def test_build_function_with_a_type_error_inside(cpu8, tmp_path):
    folder = write_module(
        tmp_path,
        "vmod_typeerror",
        "def fn(input_shape, num_classes):\n    return len(3)\n",
    )
    refused(
        describe,
        build="vmod_typeerror:fn",
        build_path=folder,
        match=r"^recipe key 'model.build': vmod_typeerror:fn raised TypeError: ",
    )


@pytest.mark.parametrize(
    "name, body, expected",
    [
        ("vmod_syntax", "def fn(:\n", r"SyntaxError"),
        (
            "vmod_runtime",
            "raise RuntimeError('no GPU here\\ntrace')\n",
            r"RuntimeError: no GPU here\)$",
        ),
        ("vmod_notfn", "fn = 3\n", r"vmod_notfn:fn is an int, expected a function$"),
    ],
)
def test_build_module_that_cannot_load(cpu8, tmp_path, name, body, expected):
    folder = write_module(tmp_path, name, body)
    refused(
        describe,
        build=f"{name}:fn",
        build_path=folder,
        match=rf"^recipe key 'model.build': .*{expected}",
    )


def test_model_whose_call_fails(cpu8, tmp_path):
    folder = write_module(
        tmp_path,
        "vmod_callfails",
        "import tf_keras\n"
        "class M(tf_keras.Model):\n"
        "    def call(self, x, training=False):\n"
        "        raise KeyError('boom')\n"
        "def fn(input_shape, num_classes):\n"
        "    return M()\n",
    )
    refused(
        describe,
        build="vmod_callfails:fn",
        build_path=folder,
        match=r"^recipe key 'model': calling the model on a batch of shape \(1, 64\) failed "
        r"\(KeyError: boom \(in layer 'm'\)\)$",
    )


def test_model_returning_several_outputs(cpu8, tmp_path):
    folder = write_module(
        tmp_path,
        "vmod_two",
        "import tf_keras\n"
        "def fn(input_shape, num_classes):\n"
        "    x = tf_keras.Input(input_shape)\n"
        "    return tf_keras.Model(x, [tf_keras.layers.Dense(num_classes)(x)] * 2)\n",
    )
    refused(
        describe,
        build="vmod_two:fn",
        build_path=folder,
        match=r"^recipe key 'model': the model returns a list, expected one \(batch, 10\) tensor",
    )


def test_layer_constructor_raising_anything_names_the_layer(cpu8, monkeypatch):
    import tf_keras

    class Exploding(tf_keras.layers.Layer):
        def __init__(self, **kwargs):
            raise RuntimeError("cannot build this\nmore")

    monkeypatch.setattr(tf_keras.layers, "Exploding", Exploding, raising=False)
    refused(
        describe,
        [{"Dense": {"units": 10}}, "Exploding"],
        match=r"^recipe key 'model.layers\[1\].Exploding': RuntimeError: cannot build this$",
    )
    refused(
        describe,
        [{"Dense": {"units": 10, "activation": "nope"}}],
        match=r"^recipe key 'model.layers\[0\].Dense': ",
    )


def test_core_mlp_on_images_names_data_flatten():
    from dtcli import models

    refused(
        models.describe_core,
        ModelConfig(api="core"),
        (28, 28, 1),
        10,
        match=r"^recipe key 'model.api': the core MLP takes flat inputs.*set data.flatten: true",
    )
    assert len(models.describe_core(ModelConfig(api="core", hidden=[]), (64,), 10)) == 2


def test_a_build_function_that_writes_tf_keras_gets_tf_keras(cpu8, tmp_path):
    """dtcli sets TF_USE_LEGACY_KERAS=1 before TensorFlow starts: `tf.keras` is tf-keras (which
    DTensor's layouts work with), not Keras 3, whose model dtcli would refuse."""
    folder = write_module(
        tmp_path,
        "vmod_tf_keras",
        "import tensorflow as tf\n"
        "def fn(input_shape, num_classes):\n"
        "    return tf.keras.Sequential([tf.keras.Input(shape=input_shape),\n"
        "        tf.keras.layers.Dense(8, name='up'), tf.keras.layers.Dense(num_classes)])\n",
    )
    infos, values = describe(build="vmod_tf_keras:fn", build_path=folder)
    assert {"up.kernel", "up.bias"} <= {w.path for w in infos}
    assert values["up.kernel"].shape == (64, 8)


@pytest.mark.parametrize(
    "mesh, devices, sets, expected",
    [
        (
            "batch=3",
            None,
            [],
            r"'data.batch_size': 64 does not divide by the data axis 'batch' of "
            r"size 3 \(mesh batch=3,model=1\)$",
        ),
        ("batch=-1", "cpu:6", [], r"'data.batch_size': 64 .* of size 6 \(mesh batch=6,model=1\)$"),
        (None, None, ["data.eval_batch_size=30"], r"'data.eval_batch_size': 30 .* of size 4 "),
    ],
)
def test_a_batch_the_data_axis_does_not_divide_is_refused_at_load(mesh, devices, sets, expected):
    """Pure arithmetic, before any device: so `dtcli config` and every command refuse it at
    once (the session checks it again once the devices are known)."""
    refused(
        R.load,
        RECIPES / "quickstart.yaml",
        R.Overrides(sets, mesh, devices),
        match=r"^recipe key " + expected,
    )


def test_a_batch_on_a_mesh_whose_data_axis_size_needs_the_devices_loads():
    # -1 with no device count: the devices decide, later; 8 devices and model=2: batch=4.
    R.load(RECIPES / "quickstart.yaml", R.Overrides(mesh="batch=-1,model=2", devices="cpu"))
    R.load(RECIPES / "quickstart.yaml", R.Overrides(mesh="batch=-1,model=2", devices="cpu:8"))


def test_a_build_function_returning_a_keras_3_model_gets_a_hint(cpu8, tmp_path):
    folder = write_module(
        tmp_path,
        "vmod_keras3",
        "import keras\n"
        "def fn(input_shape, num_classes):\n"
        "    return keras.Sequential([keras.layers.Dense(num_classes)])\n",
    )
    refused(
        describe,
        build="vmod_keras3:fn",
        build_path=folder,
        match=r"^recipe key 'model.build': vmod_keras3:fn returned Sequential, expected a "
        r"tf_keras.Model \(a Keras 3 model: build it with tf_keras, or tf.keras\)$",
    )
