"""The table of bad inputs: every command, every kind of mistake a user makes.

Each case runs `dtcli ...` in this process (the session's 8 virtual CPUs) from its own folder, which
holds everything the case may touch: its recipe, a copy of a trained run, the default `runs/`. Each
must end in at most two stderr lines, the last one `error: ...` naming what was wrong, with the
expected exit code (2 for bad input), no traceback, and that folder byte for byte as before.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import hf_models
import pytest
import yaml
from conftest import RECIPES, snapshot

from dtcli import rundir

QUICK = str(RECIPES / "quickstart.yaml")
GPT = str(RECIPES / "tiny_gpt.yaml")
LLAMA3_8B = str(RECIPES.parent / "tests" / "data" / "hf" / "llama3_8b")


@dataclass(frozen=True)
class Case:
    # {q}: the quickstart recipe; {r}: the case's own recipe (r.yaml); {tmp}: the case's folder;
    # {run}: a copy of a trained run (3 checkpoints); {ckpt}: its newest checkpoint.
    args: tuple[str, ...]
    expect: str  # a piece of the error line
    setup: Callable[[Path], None] | None = None  # prepares the case's folder
    damage: Callable[[Path], None] | None = None  # changes the copied run
    code: int = 2
    missing: tuple[str, ...] = ()  # packages whose import fails, as where they are not installed


def c(*args: str, expect: str, setup=None, damage=None, code: int = 2, missing=()) -> Case:
    return Case(tuple(args), expect, setup, damage, code, tuple(missing))


# --------------------------------------------------------------------------- setups


def recipe_text(text: str):
    def setup(tmp: Path) -> None:
        (tmp / "r.yaml").write_text(text)

    return setup


def recipe_bytes(data: bytes):
    def setup(tmp: Path) -> None:
        (tmp / "r.yaml").write_bytes(data)

    return setup


def quick_edit(edit: Callable[[dict], None]):
    def setup(tmp: Path) -> None:
        raw = yaml.safe_load(Path(QUICK).read_text())
        edit(raw)
        (tmp / "r.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    return setup


def hf_folder(config=None, remove=None, cut=0, edit=None, tokenizer=100):
    """A tiny GPT-2 folder at {tmp}/hf (hf_models.numpy_gpt2), then broken as asked: a file
    removed, model.safetensors cut short by `cut` bytes, config.json's keys changed."""

    def setup(tmp: Path) -> None:
        folder = hf_models.numpy_gpt2(tmp / "hf", config, tokenizer)
        if remove:
            (folder / remove).unlink()
        if cut:
            data = (folder / "model.safetensors").read_bytes()
            (folder / "model.safetensors").write_bytes(data[:-cut])
        if edit:
            raw = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**raw, **edit}))

    return setup


def from_hf_recipe(model: str, data: str = ""):
    """A tiny GPT-2 folder at {tmp}/hf and a recipe r.yaml that starts from it (model.from_hf),
    with `model` and `data` added to its model.transformer and data mappings."""

    def setup(tmp: Path) -> None:
        hf_folder()(tmp)
        (tmp / "r.yaml").write_text(
            "task: language_model\n"
            f"model: {{from_hf: hf, transformer: {{{model}}}}}\n"
            f"data: {{source: text, batch_size: 8{data}}}\n"
        )

    return setup


def lora_recipe(lora: str, model: str = "context: 8"):
    """A tiny GPT-2 folder at {tmp}/hf and a LoRA recipe r.yaml on it (model.from_hf), `lora`
    its lora mapping's keys, `model` its model.transformer's."""

    def setup(tmp: Path) -> None:
        hf_folder()(tmp)
        (tmp / "r.yaml").write_text(
            "task: language_model\ndevices: 'cpu:8'\nmesh: {batch: 8}\n"
            f"model: {{from_hf: hf, transformer: {{{model}}}}}\n"
            f"lora: {{{lora}}}\n"
            "data: {source: text, batch_size: 8}\n"
        )

    return setup


def lora_from_peft(lora: str, ranks: dict[str, int], alpha: float = 16, folder: str = "peft"):
    """A LoRA recipe r.yaml on lora_recipe's folder, its lora.from_peft `folder`, a peft adapter
    folder written by hf.peft_files (no torch) where `ranks` names modules: for each its rank,
    A random, B zero. Its data a few lines (the standard library's sources cost seconds)."""
    import numpy as np

    from dtcli.hf import peft_files

    def setup(tmp: Path) -> None:
        lora_recipe(f"{lora}, from_peft: {folder}")(tmp)
        (tmp / "text.txt").write_text("\n".join(hf_models.LINES))
        recipe = (
            (tmp / "r.yaml").read_text().replace("source: text,", "source: text, path: text.txt,")
        )
        (tmp / "r.yaml").write_text(recipe)
        sizes = {"transformer.h.0.attn.c_attn": (16, 48), "transformer.h.0.mlp.c_fc": (16, 64)}
        tensors = {}
        for module, r in ranks.items():
            name_a, name_b = peft_files.tensor_names(module)
            tensors[name_a] = np.random.default_rng(0).normal(size=(r, sizes[module][0]))
            tensors[name_b] = np.zeros((sizes[module][1], r), np.float32)
        if ranks:
            config = {"peft_type": "LORA", "lora_alpha": alpha, "target_modules": list(ranks)}
            (tmp / folder).mkdir()
            peft_files.write(tmp / folder, tensors, config)

    return setup


def file_at(name: str, text: str | bytes = "x"):
    def setup(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)

    return setup


def folder_at(name: str):
    return lambda tmp: (tmp / name).mkdir(parents=True)


def newest(run: Path) -> Path:
    return rundir.complete_checkpoints(run)[-1]


def lm_tasks(**extra: str):
    """tests/data/lm_tasks copied to the case's tasks/, with `extra` task files (NAME.yaml)."""

    def setup(tmp: Path) -> None:
        shutil.copytree(RECIPES.parent / "tests" / "data" / "lm_tasks", tmp / "tasks")
        for name, text in extra.items():
            (tmp / "tasks" / f"{name}.yaml").write_text(text)

    return setup


# task YAMLs that parse but cannot be built: no prompt; a data file that is not there
NO_PROMPT = (
    "task: noprompt\ndataset_path: json\ndataset_kwargs: {data_files: {test: tiny_mc.jsonl}}\n"
    "output_type: multiple_choice\ntest_split: test\ndoc_to_choice: choices\n"
    "doc_to_target: answer\n"
)
NO_DATA = NO_PROMPT.replace("noprompt", "nodata").replace("tiny_mc.jsonl", "gone.jsonl")
NO_DATA = NO_DATA.replace("doc_to_choice", "doc_to_text: question\ndoc_to_choice")


def data_file(ckpt: Path) -> Path:
    return max(
        (p for p in ckpt.iterdir() if p.name.startswith("ckpt.data")),
        key=lambda p: p.stat().st_size,
    )


DAMAGES = {
    "truncated data": lambda run: data_file(newest(run)).write_bytes(
        data_file(newest(run)).read_bytes()[:64]
    ),
    "random index": lambda run: (newest(run) / "ckpt.index").write_bytes(b"\x17" * 300),
    "empty index": lambda run: (newest(run) / "ckpt.index").write_bytes(b""),
    "garbage meta": lambda run: (newest(run) / "meta.json").write_text("{'step': 9"),
    "meta a list": lambda run: (newest(run) / "meta.json").write_text("[1, 2]"),
    "meta without files": lambda run: (newest(run) / "meta.json").write_text(
        json.dumps(
            {
                k: v
                for k, v in json.loads((newest(run) / "meta.json").read_text()).items()
                if k != "files"
            }
        )
    ),
    "missing data file": lambda run: data_file(newest(run)).unlink(),
    "extra bytes": lambda run: data_file(newest(run)).open("ab").write(b"\0" * 10),
}


def damaged_all(kind: str):
    """Every checkpoint of the run damaged the same way (nothing to fall back to)."""

    def setup(run: Path) -> None:
        for ckpt in rundir.complete_checkpoints(run):
            name = ckpt.name
            keep = [p for p in rundir.complete_checkpoints(run) if p.name != name]
            for other in keep:  # hide the others so `newest` is this one
                other.rename(other.with_name("." + other.name))
            DAMAGES[kind](run)
            for other in keep:
                other.with_name("." + other.name).rename(other)

    return setup


def no_checkpoints(run: Path) -> None:
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()


def recipe_of_run(text: str):
    return lambda run: (run / rundir.RECIPE).write_text(text)


def resume_edit(edit: Callable[[dict], None]):
    def setup(run: Path) -> None:
        raw = yaml.safe_load((run / rundir.RECIPE).read_text())
        edit(raw)
        (run / rundir.RECIPE).write_text(yaml.safe_dump(raw, sort_keys=False))

    return setup


def plots_a_file(run: Path) -> None:
    if (run / rundir.PLOTS).is_dir():
        shutil.rmtree(run / rundir.PLOTS)
    (run / rundir.PLOTS).write_text("not a folder")


def resumes_a_folder(run: Path) -> None:
    (run / rundir.RESUMES).unlink(missing_ok=True)
    (run / rundir.RESUMES).mkdir()


# Set/reset in the test: a lock held by this process on another open file (flock is per open file).
HELD: list = []


def hold_lock(run: Path) -> None:
    f = (run / rundir.LOCK).open("w")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.write(json.dumps({"pid": 4242, "host": "node7", "since": "2026-11-23T10:00:00"}))
    f.flush()
    HELD.append(f)


LONG = "{tmp}/" + "x" * 300  # a name over the file system's limit: File name too long


def s(*pairs: str) -> list[str]:
    """--set arguments."""
    out: list[str] = []
    for pair in pairs:
        out += ["--set", pair]
    return out


def t(*pairs: str, expect: str, **kw) -> Case:
    """train the quickstart with --set overrides."""
    return c("train", "{q}", *s(*pairs), expect=expect, **kw)


def lm(*pairs: str, expect: str, **kw) -> Case:
    """train recipes/tiny_gpt.yaml with --set overrides (on this process's 8 CPUs: the data
    is read after the devices are configured)."""
    on8 = ("--devices", "cpu:8", "--mesh", "batch=4,model=2")
    return c("train", GPT, *on8, *s(*pairs), expect=expect, **kw)


PAIR = '{"prompt": "a", "response": "b"}\n'


def jsonl_case(text: str, *pairs: str, eval_text: str | None = None, setup=None, **kw) -> Case:
    """train tiny_gpt.yaml on instruction data: {tmp}/t.jsonl holding `text` (and
    {tmp}/e.jsonl `eval_text`), with --set `pairs`."""

    def write(tmp: Path) -> None:
        (tmp / "t.jsonl").write_text(text)
        if eval_text is not None:
            (tmp / "e.jsonl").write_text(eval_text)
        if setup is not None:
            setup(tmp)

    return lm("data.source=jsonl", "data.path={tmp}/t.jsonl", *pairs, setup=write, **kw)


# --------------------------------------------------------------------------- the table

CASES: dict[str, Case] = {
    # ---- recipe values through --set (train)
    "seed negative": t(
        "seed=-1", expect="recipe key 'seed': expected an integer in [0, 2**32 - 1]"
    ),
    "seed too big": t("seed=4294967296", expect="recipe key 'seed'"),
    "seed a word": t("seed=abc", expect="recipe key 'seed': expected an integer, got 'abc'"),
    "seed a float": t("seed=1.5", expect="recipe key 'seed': expected an integer, got 1.5"),
    "name a list": t("name=[a, b]", expect="recipe key 'name': expected a string"),
    "name empty": t("name=", expect="--set 'name=': empty value (write name=null to unset it)"),
    # an empty $STEPS in a script read as null: a full run started
    "set an empty value": t(
        "train.steps=", expect="--set 'train.steps=': empty value (write train.steps=null to unset"
    ),
    "set a blank value": t("train.steps= ", expect="--set 'train.steps= ': empty value"),
    "name with a slash": t("name=a/b", expect="recipe key 'name'"),
    "devices cpu:0": t("devices=cpu:0", expect="devices"),
    "devices cpu:08": t("devices=cpu:08", expect="devices"),
    "devices too many cpus": t("devices=cpu:100000", expect="devices"),
    "devices npu": t("devices=npu", expect="devices"),
    # more GPUs than there are: named as the user gave them (the recipe's own key otherwise)
    "devices option more gpus than there are": c(
        "train", "{q}", "--devices", "gpu:64", expect="error: --devices 'gpu:64': "
    ),
    "devices key more gpus than there are": t(
        "devices=gpu:64", expect="error: recipe key 'devices' = 'gpu:64': "
    ),
    "devices a number": t("devices=8", expect="recipe key 'devices'"),
    "mesh axis zero": t("mesh.batch=0", expect="mesh"),
    "mesh axis -2": t("mesh.batch=-2", expect="mesh"),
    "mesh axis a word": t("mesh.batch=four", expect="recipe key 'mesh.batch': expected an integer"),
    "mesh empty": t("mesh={}", expect="mesh"),
    "mesh a list": t("mesh=[4, 2]", expect="recipe key 'mesh': expected a mapping"),
    "mesh two -1": t("mesh={batch: -1, model: -1}", expect="mesh"),
    "mesh product wrong": t("mesh={batch: 3, model: 2}", expect="mesh"),
    "data axis not in mesh": t("layouts.data_axis=rows", expect="layouts.data_axis"),
    "rule axis not in mesh": t(
        "layouts.rules={'dense_0\\.kernel': [unsharded, tensor]}", expect="axis 'tensor'"
    ),
    "rule bad regex": t("layouts.rules={'dense_(': [unsharded, model]}", expect="layouts.rules"),
    "rule dims not a list": t(
        "layouts.rules={'dense_0\\.kernel': model}",
        expect="recipe key 'layouts.rules.dense_0\\.kernel'",
    ),
    "rule rank wrong": t(
        "layouts.rules={'dense_0\\.bias': [model, unsharded]}", expect="has rank 1"
    ),
    "rule shards one axis twice": t(
        "layouts.rules={'dense_0\\.kernel': [model, model]}", expect="model"
    ),
    "rule puts a tf-keras bias on the data axis": t(
        "layouts.rules={'dense_0\\.bias': [batch]}",
        expect="recipe key 'layouts.rules.dense_0\\.bias': puts weight 'dense_0.bias' on the data",
    ),
    "rules a list": t("layouts.rules=[a]", expect="recipe key 'layouts.rules': expected a mapping"),
    "layouts unknown key": t("layouts.axis=batch", expect="unknown recipe key 'layouts.axis'"),
    "model api jax": t("model.api=jax", expect="recipe key 'model.api'"),
    "model layers empty": t("model.layers=[]", expect="model.layers"),
    "model layer unknown": t("model.layers=[{Dense2: {units: 10}}]", expect="Dense2"),
    "model layer bad argument": t(
        "model.layers=[{Dense: {unitz: 10}}]", expect="recipe key 'model.layers[0].Dense'"
    ),
    "model layer units zero": t(
        "model.layers=[{Dense: {units: 0}}, {Dense: {units: 10}}]", expect="model.layers"
    ),
    "model layer a number": t("model.layers=[5]", expect="model.layers"),
    "model layer two names": t(
        "model.layers=[{Dense: {units: 8}, Flatten: {}}]", expect="model.layers"
    ),
    "model output too narrow": t(
        "model.layers=[{Dense: {units: 7}}]", "layouts.rules={}", expect="10 classes"
    ),
    "model output too wide": t(
        "model.layers=[{Dense: {units: 12}}]", "layouts.rules={}", expect="10 classes"
    ),
    "model layers and build": t("model.build=custom_models:functional_mlp", expect="model"),
    "model build no colon": t(
        "model.layers=null", "model.build=functional_mlp", expect="model.build"
    ),
    "model build no module": t(
        "model.layers=null", "model.build=no_such_module:fn", expect="model.build"
    ),
    "model build no function": t(
        "model.layers=null", "model.build=custom_models:nope", expect="model.build"
    ),
    "model hidden zero": t(
        "model.api=core", "model.layers=null", "model.hidden=[0]", expect="model.hidden"
    ),
    "model hidden a word": t(
        "model.api=core", "model.layers=null", "model.hidden=wide", expect="model.hidden"
    ),
    "model activation": t(
        "model.api=core", "model.layers=null", "model.activation=swish", expect="model.activation"
    ),
    "model args a list": t("model.args=[1]", expect="recipe key 'model.args': expected a mapping"),
    "model unknown key": t("model.units=10", expect="unknown recipe key 'model.units'"),
    "data source": t("data.source=csv", expect="recipe key 'data.source'"),
    "data embedded name": t("data.name=iris", expect="data.name"),
    "data batch zero": t("data.batch_size=0", expect="data.batch_size"),
    "data batch negative": t("data.batch_size=-64", expect="data.batch_size"),
    "data batch a float": t(
        "data.batch_size=64.5", expect="recipe key 'data.batch_size': expected an integer"
    ),
    "data batch larger than data": t("data.batch_size=4096", expect="data.batch_size"),
    "data batch not dividing": t("data.batch_size=30", expect="does not divide"),
    "data eval batch not dividing": t("data.eval_batch_size=30", expect="data.eval_batch_size"),
    "data eval batch zero": t("data.eval_batch_size=0", expect="data.eval_batch_size"),
    "data flatten a word": t(
        "data.flatten=maybe", expect="recipe key 'data.flatten': expected true or false"
    ),
    "data shuffle a number": t("data.shuffle=2", expect="recipe key 'data.shuffle'"),
    "data idx without path": t("data.source=idx", expect="data.path"),
    "data idx path missing": t("data.source=idx", "data.path=/no/such/dir", expect="data.path"),
    "data idx path a file": t("data.source=idx", "data.path={q}", expect="data.path"),
    "data idx empty folder": t(
        "data.source=idx", "data.path={tmp}/empty", expect="data.path", setup=folder_at("empty")
    ),
    "data idx corrupt files": t(
        "data.source=idx",
        "data.path={tmp}/idx",
        expect="data.path",
        setup=lambda tmp: [
            file_at(f"idx/{n}", "garbage")(tmp)
            for n in (
                "train-images-idx3-ubyte.gz",
                "train-labels-idx1-ubyte.gz",
                "t10k-images-idx3-ubyte.gz",
                "t10k-labels-idx1-ubyte.gz",
            )
        ],
    ),
    "data tfds misspelt": t("data.source=tfds", "data.name=mnistt", expect="mnist"),
    "tfrecord without path": t("data.source=tfrecord", expect="recipe key 'data.path'"),
    "tfrecord without eval path": t(
        "data.source=tfrecord",
        "data.path=x-*",
        expect="recipe key 'data.eval_path': source tfrecord requires it (a glob of the "
        "evaluation TFRecord files) and it is missing",
    ),
    "images without eval path": t(
        "data.source=images",
        "data.path={tmp}",
        "data.shape=[28,28,1]",
        expect="recipe key 'data.eval_path': source images requires it (the evaluation folder, "
        "one subfolder of images per class) and it is missing",
    ),
    "embedded with a path": t(
        "data.path=/tmp",
        expect="recipe key 'data.path': source embedded reads no files (its data is shipped "
        "inside dtcli); to read MNIST files set data.source=idx",
    ),
    "synthetic with an eval path": t(
        "data.source=synthetic",
        "data.shape=[64]",
        "data.eval_path=/tmp",
        expect="recipe key 'data.eval_path': source synthetic reads no files",
    ),
    "tfrecord glob matches nothing": t(
        "data.source=tfrecord",
        "data.path=nope-*",
        "data.eval_path=nope-*",
        expect="recipe key 'data.eval_path': no files match 'nope-*'",
    ),
    "tfrecord not tfrecords": t(
        "data.source=tfrecord",
        "data.path=junk*",
        "data.eval_path=junk*",
        expect="recipe key 'data.eval_path': cannot read",
        setup=file_at("junk.tfrecord", "not a tfrecord file at all"),
    ),
    "tfrecord encoding unknown": t("data.encoding=jpeg", expect="data.encoding"),
    "tfrecord dtype unknown": t("data.dtype=int64", expect="data.dtype"),
    "shuffle buffer zero": t("data.shuffle_buffer=0", expect="data.shuffle_buffer"),
    "placement unknown": t("data.placement=gpu", expect="data.placement"),
    "placement as a bool": t("data.placement=true", expect="data.placement"),
    "placement device of a stream": t(
        "data.source=tfrecord",
        "data.path=a*",
        "data.eval_path=a*",
        "data.placement=device",
        expect="recipe key 'data.placement': device needs an in-memory source",
    ),
    "images one class": t(
        "data.source=images",
        "data.path=imgs",
        "data.eval_path=imgs",
        "data.shape=[8,8,1]",
        expect="recipe key 'data.path': imgs needs one subfolder per class",
        setup=file_at("imgs/only/a.png", "x"),
    ),
    "images a file that is no image": t(
        "data.source=images",
        "data.path=imgs",
        "data.eval_path=imgs",
        "data.shape=[8,8,1]",
        expect="recipe key 'data.eval_path': cannot decode imgs/a/a.png",
        setup=lambda tmp: [file_at(f"imgs/{c}/a.png", "not a png")(tmp) for c in "ab"],
    ),
    "images shape two dims": t(
        "data.source=images",
        "data.path=imgs",
        "data.eval_path=imgs",
        "data.shape=[8,8]",
        expect="recipe key 'data.shape': source images needs [height, width, channels]",
    ),
    "images not images": t(
        "data.source=images",
        "data.path=imgs",
        "data.eval_path=imgs",
        "data.shape=[8,8,1]",
        expect="recipe key 'data.eval_path'",
        setup=lambda tmp: [file_at(f"imgs/{c}/a.png", "not a png")(tmp) for c in "ab"],
    ),
    "data range reversed": t("data.train_range=[100, 10]", expect="data.train_range"),
    "data range three items": t("data.train_range=[0, 10, 20]", expect="data.train_range"),
    "synthetic dim zero": t("data.source=synthetic", "data.shape=[0, 4]", expect="data.shape"),
    "synthetic dim negative": t("data.source=synthetic", "data.shape=[8, -8]", expect="data.shape"),
    "synthetic shape empty": t("data.source=synthetic", "data.shape=[]", expect="data.shape"),
    "synthetic huge": t("data.source=synthetic", "data.shape=[100000, 100000]", expect="data"),
    "synthetic one class": t("data.source=synthetic", "data.classes=1", expect="data.classes"),
    "synthetic count zero": t("data.source=synthetic", "data.count=0", expect="data.count"),
    "synthetic eval count negative": t(
        "data.source=synthetic", "data.eval_count=-5", expect="data.eval_count"
    ),
    "data unknown key": t("data.batchsize=32", expect="unknown recipe key 'data.batchsize'"),
    "optimizer name": t("optimizer.name=rmsprop", expect="recipe key 'optimizer.name'"),
    "learning rate zero": t("optimizer.learning_rate=0", expect="optimizer.learning_rate"),
    "learning rate negative": t("optimizer.learning_rate=-0.1", expect="optimizer.learning_rate"),
    "learning rate nan": t("optimizer.learning_rate=.nan", expect="optimizer.learning_rate"),
    "learning rate inf": t("optimizer.learning_rate=inf", expect="optimizer.learning_rate"),
    "learning rate a word": t("optimizer.learning_rate=fast", expect="optimizer.learning_rate"),
    "learning rate huge int": t(
        "optimizer.learning_rate=1" + "0" * 400, expect="optimizer.learning_rate"
    ),
    "beta_1 one": t("optimizer.beta_1=1", expect="optimizer.beta_1"),
    "beta_2 negative": t("optimizer.beta_2=-0.1", expect="optimizer.beta_2"),
    "epsilon zero": t("optimizer.epsilon=0", expect="optimizer.epsilon"),
    "momentum above 1": t(
        "optimizer.name=sgd", "optimizer.momentum=1.5", expect="optimizer.momentum"
    ),
    "weight decay negative": t(
        "optimizer.name=adamw", "optimizer.weight_decay=-1", expect="optimizer.weight_decay"
    ),
    "optimizer unknown key": t("optimizer.lr=0.1", expect="unknown recipe key 'optimizer.lr'"),
    "epochs zero": t("train.epochs=0", expect="train.epochs"),
    "epochs negative": t("train.epochs=-3", expect="train.epochs"),
    "steps per epoch zero": t("train.steps_per_epoch=0", expect="train.steps_per_epoch"),
    "checkpoint every negative": t("train.checkpoint_every=-1", expect="train.checkpoint_every"),
    "keep zero": t("train.keep=0", expect="train.keep"),
    "log every zero": t("train.log_every=0", expect="train.log_every"),
    # issue 43: a ZeroDivisionError (exit 1) in config and train
    "accumulate zero": t(
        "train.accumulate=0",
        expect="recipe key 'train.accumulate': expected an integer from 1 to 1024",
    ),
    "config accumulate zero": c(
        "config", "{q}", *s("train.accumulate=0"), expect="recipe key 'train.accumulate'"
    ),
    # issue 43: passed as null (one evaluation, at the end)
    "eval_every zero on a steps recipe": lm(
        "train.eval_every=0", expect="recipe key 'train.eval_every': expected an integer >= 1"
    ),
    # ---- language models, schedules, train.steps
    "task unknown": t("task=regress", expect="recipe key 'task'"),
    "text source on a classifier": t("data.source=text", expect="recipe key 'task'"),
    "language model on images": t(
        "task=language_model", expect="recipe key 'data.source': task language_model reads text"
    ),
    "transformer on a classifier": t(
        "model.layers=null", "model.transformer={layers: 1}", expect="recipe key 'task'"
    ),
    # issue 43: said "api keras needs exactly one of 'layers', 'build' or 'transformer'"
    "transformer remat on a layer list": t(
        "model.transformer.remat=true",
        expect="recipe key 'model.transformer.remat': model.transformer configures dtcli's GPT",
    ),
    "transformer and layers": lm("model.layers=[Dense]", expect="exactly one of 'layers'"),
    "transformer heads not dividing": lm(
        "model.transformer.heads=3", expect="recipe key 'model.transformer.heads'"
    ),
    "transformer zero layers": lm("model.transformer.layers=0", expect="transformer.layers"),
    "transformer unknown key": lm(
        "model.transformer.layerz=2", expect="'model.transformer.layerz' (did you mean 'layers'?)"
    ),
    "transformer dropout 1": lm("model.transformer.dropout=1", expect="transformer.dropout"),
    # issue 39: the architecture options
    "transformer kv_heads not dividing heads": lm(
        "model.transformer.kv_heads=3", expect="recipe key 'model.transformer.kv_heads'"
    ),
    "transformer context past max_positions": lm(
        "model.transformer.max_positions=32", expect="recipe key 'model.transformer.context'"
    ),
    "transformer rope_scaling without rope": lm(
        "model.transformer.rope_scaling={factor: 8.0}",
        expect="recipe key 'model.transformer.rope_scaling': scales rope",
    ),
    "transformer rope_theta without rope": lm(
        "model.transformer.rope_theta=500000",
        expect="recipe key 'model.transformer.rope_theta': sets rope's base, and model.transformer.positions is learned; set model.transformer.positions: rope or remove it",
    ),
    "transformer tokenizer past vocab_size": lm(
        "model.transformer.vocab_size=100",
        expect="recipe key 'model.transformer.vocab_size': the tokenizer (byte tokens) makes 256 ids, more than the model's 100",
    ),
    "tensor parallel key/value heads not dividing": c(
        "train",
        str(RECIPES / "tiny_gpt_tensor_parallel.yaml"),
        *s("model.transformer.kv_heads=2"),
        expect="key.kernel' has size 2, which does not divide by mesh axis 'model' of size 4 (it is the attention heads: 2 heads cannot be split over 4 devices without splitting a head; use a 'model' axis that divides model.transformer.kv_heads",
    ),
    "text path missing": lm("data.path=nope.txt", expect="recipe key 'data.path': no file"),
    "text file empty": lm("data.path={tmp}/e.txt", expect="is empty", setup=file_at("e.txt", "")),
    "text shorter than a window": lm(
        "data.path={tmp}/s.txt", expect="fewer than one window", setup=file_at("s.txt", "abc")
    ),
    "text eval fraction 1": lm("data.eval_fraction=1", expect="data.eval_fraction"),
    "text context past the model's": lm("data.context=65", expect="recipe key 'data.context'"),
    "text placement device": lm("data.placement=device", expect="data.placement"),
    "text TFDS name and a path": lm(
        "data.name=tiny_shakespeare", "data.path={tmp}", expect="recipe key 'data.name'"
    ),
    "text TFDS name unknown": lm("data.name=tiny_shakespear", expect="did you mean"),
    # ---- track (experiment trackers)
    "track unknown tracker": t(
        "track=[tensorboard, mlfow]",
        expect="recipe key 'track[1]': expected a tracker, one of tensorboard, mlflow, wandb",
    ),
    "track mlflow unknown key": t(
        "track=[{mlflow: {tracking_url: x}}]", expect="'track[0].mlflow.tracking_url'"
    ),
    "track wandb unknown key": t(
        "track=[{wandb: {projekt: x}}]", expect="'track[0].wandb.projekt'"
    ),
    "track wandb bad mode": t(
        "track=[{wandb: {mode: disabled}}]",
        expect="recipe key 'track[0].wandb.mode': expected one of 'offline', 'online'",
    ),
    "track listed twice": t("track=[mlflow, mlflow]", expect="track[1]': mlflow is listed twice"),
    "track mlflow not installed": t(
        "track=[mlflow]",
        expect="recipe key 'track[0]': mlflow is not installed; pip install 'dtensor-cli[mlflow]'",
        missing=("mlflow",),
    ),
    "track wandb not installed": t(
        "track=[tensorboard, {wandb: {mode: offline}}]",
        expect="recipe key 'track[1]': wandb is not installed; pip install 'dtensor-cli[wandb]'",
        missing=("wandb",),
    ),
    "track one option dotted": t(
        "track.mlflow.experiment=foo",
        expect="recipe key 'track': expected a list of trackers, like [mlflow] or "
        "[{mlflow: {experiment: foo}}], got {mlflow: {experiment: foo}}",
    ),
    "track an index": t("track[0]=mlflow", expect="like [mlflow] or [{mlflow:"),
    "track mlflow store scheme": t(
        'track=[{mlflow: {tracking_uri: "ftp://x"}}]',
        expect="recipe key 'track[0].mlflow.tracking_uri': expected a tracking store: "
        "sqlite:///FILE,",
    ),
    "track mlflow store empty": t(
        'track=[{mlflow: {tracking_uri: ""}}]',
        expect="recipe key 'track[0].mlflow.tracking_uri': expected a tracking store such as "
        "sqlite:///FILE or http(s)://SERVER, got an empty string",
    ),
    "track a comma list": t(
        "track=mlflow,tensorboard", expect="(did you mean [mlflow, tensorboard]?)"
    ),
    # ---- train.eval_tasks (lm-eval tasks at each evaluation)
    "train eval_tasks on a classifier": t(
        "train.eval_tasks={tasks: [tiny_mc]}",
        expect="recipe key 'train.eval_tasks': lm-evaluation-harness tasks score a language "
        "model's text; this recipe's task is classify",
    ),
    "train eval_tasks empty": lm(
        "train.eval_tasks={tasks: []}",
        expect="recipe key 'train.eval_tasks.tasks': expected a non-empty list of task names",
    ),
    "train eval_tasks missing": lm(
        "train.eval_tasks={limit: 5}", expect="recipe key 'train.eval_tasks.tasks'"
    ),
    "train eval_tasks a comma list": lm(
        "train.eval_tasks={tasks: ['tiny_mc,tiny_ppl']}",
        expect="recipe key 'train.eval_tasks.tasks[0]': expected a task name (one a list item",
    ),
    "train eval_tasks a string": lm(
        "train.eval_tasks={tasks: tiny_mc}",
        expect="recipe key 'train.eval_tasks.tasks': expected a list of strings",
    ),
    "train eval_tasks limit 0": lm(
        "train.eval_tasks={tasks: [tiny_mc], limit: 0}",
        expect="recipe key 'train.eval_tasks.limit': expected a number > 0",
    ),
    "train eval_tasks fewshot negative": lm(
        "train.eval_tasks={tasks: [tiny_mc], num_fewshot: -1}",
        expect="recipe key 'train.eval_tasks.num_fewshot': expected an integer >= 0 or null",
    ),
    "train eval_tasks batch 0": lm(
        "train.eval_tasks={tasks: [tiny_mc], batch_size: 0}",
        expect="recipe key 'train.eval_tasks.batch_size': expected an integer >= 1 or null",
    ),
    "train eval_tasks include path empty": lm(
        "train.eval_tasks={tasks: [tiny_mc], include_path: ''}",
        expect="recipe key 'train.eval_tasks.include_path'",
    ),
    "train eval_tasks on packed windows": jsonl_case(
        PAIR * 8,
        "data.packing=true",
        "train.eval_tasks={tasks: [tiny_mc]}",
        expect="recipe key 'train.eval_tasks': the training model takes packed windows",
    ),
    "train eval_tasks unknown": lm(
        "train.eval_tasks={tasks: [tiny_mcq], include_path: {tmp}/tasks}",
        expect="recipe key 'train.eval_tasks.tasks': unknown task 'tiny_mcq'",
        setup=lm_tasks(),
    ),
    # built before TensorFlow starts: not after the model is
    "train eval_tasks no doc_to_text": lm(
        "train.eval_tasks={tasks: [noprompt], include_path: {tmp}/tasks}",
        expect="recipe key 'train.eval_tasks.tasks': task 'noprompt' "
        "({tmp}/tasks/noprompt.yaml) cannot be built: its YAML sets no doc_to_text",
        setup=lm_tasks(noprompt=NO_PROMPT),
    ),
    "train eval_tasks data file missing": lm(
        "train.eval_tasks={tasks: [nodata], include_path: {tmp}/tasks}",
        expect="recipe key 'train.eval_tasks.tasks': task 'nodata' ({tmp}/tasks/nodata.yaml) "
        "cannot be built: Unable to find '{tmp}/tasks/gone.jsonl'",
        setup=lm_tasks(nodata=NO_DATA),
    ),
    "train eval_tasks include path a file": lm(
        "train.eval_tasks={tasks: [tiny_mc], include_path: {tmp}/f}",
        expect="recipe key 'train.eval_tasks.include_path' '{tmp}/f': not a folder",
        setup=file_at("f"),
    ),
    # checked once by launch, before any client starts (the names: as train checks them)
    "launch eval tasks include path a file": c(
        *("launch", "--clients", "2", "--devices-per-client", "cpu:2", GPT, "--mesh", "batch=4"),
        *("--set", "train.eval_tasks={tasks: [tiny_mc], include_path: {tmp}/f}"),
        expect="recipe key 'train.eval_tasks.include_path' '{tmp}/f': not a folder",
        setup=file_at("f"),
    ),
    "train eval_tasks key misspelt": lm(
        "train.eval_tasks={tasks: [tiny_mc], limits: 5}",
        expect="unknown recipe key 'train.eval_tasks.limits' (did you mean 'limit'?)",
    ),
    # ---- tokenizers and token shards
    "tokenizer on a classifier": t(
        "data.tokenizer=bytes", expect="recipe key 'data.tokenizer': source embedded reads no text"
    ),
    "tokenizer a number": lm(
        "data.tokenizer=5", expect="recipe key 'data.tokenizer': expected a string or a mapping"
    ),
    "tokenizer empty": lm(
        "data.tokenizer=''", expect="recipe key 'data.tokenizer': expected bytes"
    ),
    "tokenizer BPE without its size": lm(
        "data.tokenizer=bpe:",
        expect="recipe key 'data.tokenizer': expected bpe:N with N, the vocabulary size, an "
        "integer from 257 (the 256 bytes and the end-of-document token) to 1,048,576, like "
        "bpe:4096, got 'bpe:'; N is missing",
    ),
    "tokenizer BPE with a space": lm(
        "data.tokenizer=bpe: 300",
        expect="recipe key 'data.tokenizer': got the mapping {bpe: 300}, whose keys may be "
        "train, vocab_size (for the string bpe:300, leave out the space after the colon",
    ),
    "tokenizer BPE size a word": lm(
        "data.tokenizer=bpe:abc", expect="like bpe:4096, got 'bpe:abc'"
    ),
    "tokenizer BPE size negative": lm(
        "data.tokenizer=bpe:-5", expect="like bpe:4096, got 'bpe:-5'"
    ),
    "tokenizer BPE too small": lm(
        "data.tokenizer={train: bpe, vocab_size: 100}", expect="data.tokenizer.vocab_size"
    ),
    "tokenizer training unknown": lm(
        "data.tokenizer={train: wordpiece}", expect="recipe key 'data.tokenizer.train'"
    ),
    "tokenizer unknown key": lm(
        "data.tokenizer={train: bpe, size: 9}", expect="unknown recipe key 'data.tokenizer.size'"
    ),
    "tokenizer file missing": lm(
        "data.tokenizer={tmp}/no.json",
        expect="recipe key 'data.tokenizer': expected bytes | bpe:N | tokenizer.json (a path to "
        "one, or to a folder holding one), got '{tmp}/no.json'; no file or folder",
    ),
    "tokenizer unknown name": lm(
        "data.tokenizer=gpt2", expect="expected bytes | bpe:N | tokenizer.json"
    ),
    "tokenizer a binary file": lm(
        "data.tokenizer={tmp}/t.npy",
        expect="'{tmp}/t.npy' is not a tokenizer.json (the UTF-8 JSON Hugging Face `tokenizers` "
        "saves): a binary file, not UTF-8 text (byte 0x93 at offset 0)",
        setup=lambda tmp: (tmp / "t.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00"),
    ),
    "tokenizer file not one": lm(
        "data.tokenizer={tmp}/t.json",
        expect="is not a tokenizer.json",
        setup=file_at("t.json", "{}"),
    ),
    "tokens without a folder": lm(
        "data.source=tokens", expect="recipe key 'data.path': source tokens needs"
    ),
    "tokens folder without an index": lm(
        "data.source=tokens", "data.path={tmp}", expect="holds no index.json"
    ),
    # issue 43: said "holds no index.json"
    "tokens folder missing": lm(
        "data.source=tokens",
        "data.path={tmp}/nope",
        expect="recipe key 'data.path': '{tmp}/nope' does not exist (expected the folder "
        "`dtcli prepare-text` wrote)",
    ),
    "tokens folder a file": lm(
        "data.source=tokens",
        "data.path={tmp}/f",
        expect="recipe key 'data.path': '{tmp}/f' is a file, not a folder",
        setup=file_at("f"),
    ),
    "plan tokens folder missing": c(
        "plan",
        GPT,
        *("--devices", "cpu:8", "--mesh", "batch=4,model=2"),
        *s("data.source=tokens", "data.path={tmp}/nope"),
        expect="recipe key 'data.path': '{tmp}/nope' does not exist",
    ),
    "tokens with a tokenizer": lm(
        "data.source=tokens",
        "data.path={tmp}",
        "data.tokenizer=bytes",
        expect="source tokens uses the tokenizer its shards were made with",
    ),
    "tokens with an eval path": lm(
        "data.source=tokens", "data.path={tmp}", "data.eval_path={tmp}", expect="data.eval_path"
    ),
    "tokens on a classifier": t(
        "data.source=tokens", "data.path={tmp}", expect="recipe key 'task'"
    ),
    # ---- instruction data (source jsonl)
    "jsonl line not json": jsonl_case(
        '{"prompt": "a", "response": "b"}\n{"prompt": "a", "response":\n',
        expect="recipe key 'data.path': {tmp}/t.jsonl:2: not a JSON object (Expecting value",
    ),
    "jsonl line without its fields": jsonl_case(
        '{"question": "a", "answer": "b"}\n',
        expect='recipe key \'data.path\': {tmp}/t.jsonl:1: expected {"prompt", "response"}, '
        '{"messages": [...]} or {"instruction", "input", "output"}, got the keys '
        "['answer', 'question']",
    ),
    "jsonl empty response": jsonl_case(
        '\n{"instruction": "a", "input": "", "output": "  "}\n',
        expect="recipe key 'data.path': {tmp}/t.jsonl:2: 'output': an empty response",
    ),
    "jsonl unknown role": jsonl_case(
        '{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}\n',
        expect="{tmp}/t.jsonl:1: message 1: unknown role 'tool' (expected system, user, assistant)",
    ),
    "jsonl a record of two forms": jsonl_case(
        '{"prompt": "a", "response": "b", "messages": [{"role": "user", "content": "c"}]}\n',
        expect="recipe key 'data.path': {tmp}/t.jsonl:1: the record has both {\"messages\"} "
        'and {"prompt", "response"}: expected one form a line',
    ),
    "jsonl template without the answers": jsonl_case(
        PAIR,
        "data.chat_template={tmp}/t.jinja",
        setup=file_at(
            "t.jinja",
            "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}",
        ),
        expect="recipe key 'data.chat_template': {tmp}/t.jsonl:1: the template {tmp}/t.jinja "
        "renders none of the line's assistant text, so it has nothing in the loss",
    ),
    "jsonl template a json without one": jsonl_case(
        PAIR,
        "data.chat_template={tmp}/tokenizer_config.json",
        setup=file_at("tokenizer_config.json", '{"eos_token": "</s>"}'),
        expect="recipe key 'data.chat_template': {tmp}/tokenizer_config.json has no chat_template",
    ),
    "jsonl eval line not json": jsonl_case(
        "nope\n",
        "data.eval_path={tmp}/e.jsonl",
        eval_text="nope\n",
        expect="recipe key 'data.eval_path': {tmp}/e.jsonl:1: not a JSON object",
    ),
    "jsonl template the tokenizer lacks": jsonl_case(
        PAIR,
        "data.chat_template=chatml",
        expect="recipe key 'data.chat_template': chatml (built in) writes <|im_start|>, "
        "<|im_end|>, which the tokenizer (byte tokens (256 byte values plus the end-of-document "
        "token)) does not have as tokens",
    ),
    "jsonl template file missing": jsonl_case(
        PAIR,
        "data.chat_template={tmp}/no.jinja",
        expect="recipe key 'data.chat_template': expected plain, alpaca, chatml, llama3 or a "
        "Jinja template file, got '{tmp}/no.jinja' (No such file or directory)",
    ),
    "jsonl template not jinja": jsonl_case(
        PAIR,
        "data.chat_template={tmp}/t.jinja",
        setup=file_at("t.jinja", "{% for m in messages %}{{ m.content }}"),
        expect="recipe key 'data.chat_template': the template {tmp}/t.jinja is not a Jinja "
        "template (line 1:",
    ),
    "jsonl template raising": jsonl_case(
        PAIR,
        "data.chat_template={tmp}/t.jinja",
        setup=file_at("t.jinja", "{{ raise_exception('roles must alternate') }}"),
        expect="recipe key 'data.chat_template': {tmp}/t.jsonl:1: the template {tmp}/t.jinja "
        "refused the conversation (roles must alternate)",
    ),
    "jsonl example too long to refuse": jsonl_case(
        '{"prompt": "' + "a" * 80 + '", "response": "b"}\n',
        "data.truncate=refuse",
        expect="recipe key 'data.truncate': {tmp}/t.jsonl:1: the example is 101 tokens, more "
        "than data.context 64",
    ),
    "jsonl a folder": lm(
        "data.source=jsonl",
        "data.path={tmp}",
        expect="recipe key 'data.path': source jsonl reads one JSON Lines file, '{tmp}' is a folder",
    ),
    "jsonl one example and no eval path": jsonl_case(
        PAIR, expect="recipe key 'data.path': '{tmp}/t.jsonl' holds 1 example, none left"
    ),
    "jsonl without a path": lm("data.source=jsonl", expect="source jsonl needs a JSON Lines"),
    "jsonl on a classifier": t(
        "data.source=jsonl",
        "data.path={tmp}/t.jsonl",
        expect="recipe key 'task': data.source jsonl trains a language model",
    ),
    "jsonl with a bpe to train": lm(
        "data.source=jsonl",
        "data.path={tmp}/t.jsonl",
        "data.tokenizer=bpe:300",
        expect="recipe key 'data.tokenizer': source jsonl reads its examples with a tokenizer",
    ),
    "jsonl on a layer list": lm(
        "data.source=jsonl",
        "data.path={tmp}/t.jsonl",
        "model.transformer=null",
        "model.layers=[Dense]",
        expect="recipe key 'model': task language_model needs model.transformer",
    ),
    "packing with a model.build model": lm(
        "data.source=jsonl",
        "data.path={tmp}/t.jsonl",
        "data.context=32",
        "data.packing=true",
        "model.transformer=null",
        "model.build=custom_models:gpt",
        expect="recipe key 'data.packing': packed windows (ids, segments and positions, "
        "[3, context]) are read by dtcli's GPT (model.transformer) only",
    ),
    "packing of text": lm(
        "data.packing=true",
        expect="recipe key 'data.packing': only instruction data (data.source: jsonl) reads it, "
        "and data.source is text; remove data.packing",
    ),
    "chat template of text": lm(
        "data.chat_template=plain", expect="recipe key 'data.chat_template': only instruction"
    ),
    "prepare-text missing source": c(
        "prepare-text", "{tmp}/nope", "--out", "{tmp}/o", expect="SOURCE: no file"
    ),
    "prepare-text out not empty": c(
        "prepare-text", "{q}", "--out", "{tmp}/o", expect="not empty", setup=file_at("o/x")
    ),
    "prepare-text BPE size": c(
        "prepare-text", "{q}", "--tokenizer", "bpe:9", "--out", "{tmp}/o", expect="bpe:N"
    ),
    "prepare-text tokenizer missing": c(
        "prepare-text",
        "{q}",
        "--tokenizer",
        "{tmp}/t.json",
        "--out",
        "{tmp}/o",
        expect="--tokenizer '{tmp}/t.json': expected bytes | bpe:N | tokenizer.json",
    ),  # fmt: skip
    "prepare-text tokenizer a binary file": c(
        "prepare-text",
        "{q}",
        "--tokenizer",
        "{tmp}/t.gz",
        "--out",
        "{tmp}/o",
        expect="--tokenizer: '{tmp}/t.gz' is not a tokenizer.json",
        setup=lambda tmp: (tmp / "t.gz").write_bytes(b"\x1f\x8b\x08\x00" + bytes(20)),
    ),
    "prepare-text eval fraction": c(
        "prepare-text", "{q}", "--eval-fraction", "1", "--out", "{tmp}/o", expect="--eval-fraction"
    ),
    "lm heads over the model axis": c(
        "train",
        str(RECIPES / "tiny_gpt_tensor_parallel.yaml"),
        "--mesh",
        "model=8",
        expect="attention heads",
    ),
    "eval_every without steps": t("train.eval_every=5", expect="recipe key 'train.eval_every'"),
    "steps zero": lm("train.steps=0", expect="recipe key 'train.steps'"),
    "eval_every past an epoch": t(
        "train.steps=1000", "train.eval_every=100", expect="recipe key 'train.eval_every'"
    ),
    # no train.eval_every: it defaults to train.steps, the key the user gave (issue 24)
    "steps past an epoch, no eval_every": t(
        "train.steps=40",
        expect="recipe key 'train.steps': 40 steps between evaluations (train.eval_every unset "
        "or equal to train.steps) is more than one pass over the training data (1437 examples "
        "in batches of 64: 23 batches); set train.eval_every to at most 23",
    ),
    "epochs on a steps recipe": c("train", GPT, "--epochs", "3", expect="--epochs"),
    "schedule unknown": t("optimizer.schedule=linear", expect="optimizer.schedule"),
    "warmup past the decay": t(
        "optimizer.schedule=cosine",
        "optimizer.warmup_steps=10",
        "optimizer.decay_steps=5",
        expect="optimizer.warmup_steps",
    ),
    "warmup past a steps run": lm(
        "train.steps=20", "train.eval_every=10", expect="optimizer.warmup_steps"
    ),
    "min learning rate above it": t(
        "optimizer.min_learning_rate=1", expect="optimizer.min_learning_rate"
    ),
    "clip norm zero": t("optimizer.clip_norm=0", expect="optimizer.clip_norm"),
    "no_decay with adam": t("optimizer.no_decay=bias", expect="only adamw"),
    "no_decay bad regex": t(
        "optimizer.name=adamw", "optimizer.no_decay=(", expect="optimizer.no_decay"
    ),
    "generate missing": c("generate", "{tmp}/nope", expect="no such file"),
    "generate a classifier": c("generate", "{run}", expect="needs a language model"),
    "generate zero tokens": c("generate", "{run}", "--tokens", "0", expect="--tokens"),
    "generate seed negative": c(
        "generate", "{run}", "--seed", "-1", expect="--seed -1: expected an integer from 0 to"
    ),
    "generate seed past 2**32": c("generate", "{run}", "--seed", str(2**64), expect="--seed 1844"),
    "generate a billion tokens": c(
        "generate", "{run}", "--tokens", "1000000000", expect="--tokens 1000000000"
    ),
    "generate negative temperature": c(
        "generate", "{run}", "--temperature", "-1", expect="--temperature"
    ),
    "generate top-k zero": c("generate", "{run}", "--top-k", "0", expect="--top-k"),
    "generate empty prompt": c("generate", "{run}", "--prompt", "", expect="--prompt"),
    "generate top-p zero": c("generate", "{run}", "--top-p", "0", expect="--top-p 0.0: expected"),
    "generate top-p above one": c("generate", "{run}", "--top-p", "1.5", expect="--top-p 1.5"),
    "generate prompts missing": c(
        "generate", "{run}", "--prompts", "{tmp}/p.txt", expect="--prompts '{tmp}/p.txt': cannot"
    ),
    "generate prompts empty": c(
        "generate",
        "{run}",
        "--prompts",
        "{tmp}/p.txt",
        expect="holds no prompt",
        setup=file_at("p.txt", "\n \n"),
    ),
    "generate set unknown key": c(
        "generate", "{run}", "--set", "train.compil=xla", expect="unknown recipe key 'train.compil'"
    ),
    "generate prompts binary": c(
        "generate",
        "{run}",
        "--prompts",
        "{tmp}/p.png",
        expect="--prompts '{tmp}/p.png': not UTF-8 text (byte 0x89 on line 1)",
        setup=file_at("p.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"),
    ),
    "generate prompts with a NUL": c(
        "generate",
        "{run}",
        "--prompts",
        "{tmp}/p.txt",
        expect="not UTF-8 text (a NUL byte on line 2)",
        setup=file_at("p.txt", b"ROMEO:\nJU\0LIET:\n"),
    ),
    "generate prompt and prompts": c(
        "generate",
        "{run}",
        "--prompt",
        "a",
        "--prompts",
        "{tmp}/p.txt",
        expect="not both",
        setup=file_at("p.txt", "b\n"),
    ),
    # ---- generate --chat (a language model's run refuses the rest: test_generate*.py)
    "generate chat template without chat": c(
        "generate",
        "{run}",
        "--chat-template",
        "plain",
        expect="--chat-template 'plain': it renders --chat's prompts; give --chat",
    ),
    "generate chat without a prompt": c(
        "generate",
        "{run}",
        "--chat",
        expect="--chat: give the user's message with --prompt TEXT or --prompts FILE",
    ),
    "generate chat prompts not JSON": c(
        "generate",
        "{run}",
        "--chat",
        "--prompts",
        "{tmp}/p.jsonl",
        expect="--prompts '{tmp}/p.jsonl': line 2: not a JSON object (",
        setup=file_at("p.jsonl", '{"prompt": "hi"}\n{"prompt": "hi"\n'),
    ),
    "generate chat prompts without a user turn": c(
        "generate",
        "{run}",
        "--chat",
        "--prompts",
        "{tmp}/p.jsonl",
        expect="--prompts '{tmp}/p.jsonl': line 1: no user message (nothing to answer)",
        setup=file_at("p.jsonl", '{"messages": [{"role": "system", "content": "Be brief."}]}\n'),
    ),
    "generate chat prompts an empty prompt": c(
        "generate",
        "{run}",
        "--chat",
        "--prompts",
        "{tmp}/p.jsonl",
        expect="--prompts '{tmp}/p.jsonl': line 2: an empty prompt (its last user message has no "
        "text)",
        setup=file_at("p.jsonl", '{"prompt": "hi"}\n{"prompt": ""}\n'),
    ),
    "generate chat prompts of another form": c(
        "generate",
        "{run}",
        "--chat",
        "--prompts",
        "{tmp}/p.jsonl",
        expect='--prompts \'{tmp}/p.jsonl\': line 1: expected {"prompt"}, {"messages": [...]} or '
        '{"instruction", "input"}, got the keys [\'question\']',
        setup=file_at("p.jsonl", '{"question": "hi"}\n'),
    ),
    "generate chat prompts empty": c(
        "generate",
        "{run}",
        "--chat",
        "--prompts",
        "{tmp}/p.jsonl",
        expect="--prompts '{tmp}/p.jsonl': holds no prompt (one JSON object a line)",
        setup=file_at("p.jsonl", "\n\n"),
    ),
    "generate chat template missing": c(
        "generate",
        "{run}",
        "--chat",
        "--prompt",
        "hi",
        "--chat-template",
        "{tmp}/t.jinja",
        expect="--chat-template: expected plain, alpaca, chatml, llama3 or a Jinja template file, "
        "got '{tmp}/t.jinja' (No such file or directory)",
    ),
    "generate chat template not Jinja": c(
        "generate",
        "{run}",
        "--chat",
        "--prompt",
        "hi",
        "--chat-template",
        "{tmp}/t.jinja",
        expect="--chat-template: the template {tmp}/t.jinja is not a Jinja template (line 1: ",
        setup=file_at("t.jinja", "{% for m in messages %}{{ m }}"),
    ),
    "score missing": c("score", "{tmp}/nope", "--text", "ab", expect="no such file"),
    "score a classifier": c(
        "score", "{run}", "--text", "ab", expect="score needs a language model (task language"
    ),
    "score no text": c(
        "score", "{run}", expect="--text, --file: give the text to score with exactly one of them"
    ),
    "score text and file": c(
        "score",
        "{run}",
        "--text",
        "ab",
        "--file",
        "{tmp}/t.txt",
        expect="with exactly one of them",
        setup=file_at("t.txt", "cd"),
    ),
    "score empty text": c(
        "score", "{run}", "--text", "", expect="--text: expected at least one character"
    ),
    "score text not utf-8": c(
        "score", "{run}", "--text", "ab\udcff", expect="--text: not UTF-8 text (surrogates not"
    ),
    "score file missing": c(
        "score", "{run}", "--file", "{tmp}/t.txt", expect="--file '{tmp}/t.txt': cannot read it"
    ),
    "score file a folder": c(
        "score",
        "{run}",
        "--file",
        "{tmp}/d",
        expect="--file '{tmp}/d': cannot read it (Is a directory)",
        setup=folder_at("d"),
    ),
    "score file empty": c(
        "score",
        "{run}",
        "--file",
        "{tmp}/t.txt",
        expect="--file '{tmp}/t.txt': the file is empty",
        setup=file_at("t.txt", b""),
    ),
    "score file binary": c(
        "score",
        "{run}",
        "--file",
        "{tmp}/p.png",
        expect="--file '{tmp}/p.png': not UTF-8 text (byte 0x89 at offset 0)",
        setup=file_at("p.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"),
    ),
    "score file with a NUL": c(
        "score",
        "{run}",
        "--file",
        "{tmp}/t.txt",
        expect="not UTF-8 text (byte 0x00 at offset 9)",
        setup=file_at("t.txt", b"ROMEO:\nJU\0LIET:\n"),
    ),
    "score stride zero": c(
        "score", "{run}", "--text", "ab", "--stride", "0", expect="--stride 0: expected a positive"
    ),
    "score stride negative": c(
        "score", "{run}", "--text", "ab", "--stride", "-3", expect="--stride -3: expected"
    ),
    "score set unknown key": c(
        "score",
        "{run}",
        "--text",
        "ab",
        "--set",
        "train.compil=xla",
        expect="unknown recipe key 'train.compil'",
    ),
    "steps per call zero": t("train.steps_per_call=0", expect="train.steps_per_call"),
    "steps per call huge": t("train.steps_per_call=5000", expect="train.steps_per_call"),
    "steps per call text": t("train.steps_per_call=many", expect="train.steps_per_call"),
    "train a list": t("train=[1]", expect="recipe key 'train': expected a mapping"),
    "train unknown key": t("train.epoch=3", expect="unknown recipe key 'train.epoch'"),
    "top-level unknown key": t("optimiser.name=sgd", expect="unknown recipe key 'optimiser'"),
    # ---- --set, --mesh, --devices, --epochs and other train arguments
    "set without =": c(
        "train", "{q}", "--set", "seed", expect="--set 'seed': expected KEY.PATH=VALUE"
    ),
    "set empty key": c("train", "{q}", "--set", "=3", expect="--set"),
    "set empty path part": c("train", "{q}", "--set", "optimizer..name=sgd", expect="--set"),
    "set into a scalar": c("train", "{q}", "--set", "seed.value=1", expect="seed"),
    "set bad yaml": c("train", "{q}", "--set", "model.layers=[{Dense: {units: 10}", expect="--set"),
    "mesh arg no =": c(
        "train", "{q}", "--mesh", "batch:4", expect="--mesh 'batch:4': expected AXIS=SIZE"
    ),
    "mesh arg empty": c("train", "{q}", "--mesh", "", expect="--mesh"),
    "mesh arg duplicate axis": c("train", "{q}", "--mesh", "batch=4,batch=2", expect="--mesh"),
    "mesh arg size a word": c("train", "{q}", "--mesh", "batch=four,model=2", expect="--mesh"),
    "mesh arg size zero": c("train", "{q}", "--mesh", "batch=0,model=2", expect="--mesh"),
    "mesh arg size -3": c("train", "{q}", "--mesh", "batch=-3,model=2", expect="--mesh"),
    "mesh arg empty part": c("train", "{q}", "--mesh", "batch=4,,model=2", expect="--mesh"),
    "mesh arg product": c(
        "train", "{q}", "--mesh", "batch=2,model=2", "--devices", "cpu:8", expect="multiply to 4"
    ),
    # the mesh of 6 named first, not the batch of 64 its data axis 3 does not divide
    "mesh arg product and a batch": c(
        *("train", "{q}", "--mesh", "batch=3,model=2", "--devices", "cpu:8"),
        expect="mesh batch=3,model=2: axis sizes multiply to 6, but there are 8 devices",
    ),
    "config mesh arg product and a batch": c(
        *("config", "{q}", "--mesh", "batch=3,model=2", "--devices", "cpu:8"),
        expect="mesh batch=3,model=2: axis sizes multiply to 6, but there are 8 devices",
    ),
    "mesh arg axis typo": c(
        "train", "{q}", "--mesh", "batch=4,modle=2", expect="did you mean 'model'"
    ),
    "devices arg cpu:08": c("train", "{q}", "--devices", "cpu:08", expect="--devices"),
    "devices arg cpu:-1": c("train", "{q}", "--devices", "cpu:-1", expect="--devices"),
    "devices arg above the cap": c("train", "{q}", "--devices", "cpu:5000", expect="--devices"),
    "devices arg gpu:x": c("train", "{q}", "--devices", "gpu:x", expect="--devices"),
    "devices arg empty": c("train", "{q}", "--devices", "", expect="--devices"),
    # the option named, as --devices is: the value was typed, not read from the recipe
    "epochs arg zero": c(
        "train", "{q}", "--epochs", "0", expect="error: --epochs 0: expected an integer >= 1"
    ),
    "mesh arg two fills": c(
        *("train", "{q}", "--mesh", "batch=-1,model=-1"),
        expect="error: --mesh 'batch=-1,model=-1': at most one axis may be -1",
    ),
    "launch epochs arg zero": c(
        *("launch", "{q}", "--clients", "2", "--epochs", "0"),
        expect="error: --epochs 0: expected an integer >= 1",
    ),
    "epochs arg a word": c("train", "{q}", "--epochs", "two", expect="--epochs"),
    "unknown option": c("train", "{q}", "--epoch", "2", expect="No such option: --epoch"),
    "option without value": c("train", "{q}", "--out", expect="--out"),
    "no recipe": c("train", expect="RECIPE"),
    "two recipes": c("train", "{q}", "{q}", expect="unexpected extra argument"),
    "connect timeout zero": c("train", "{q}", "--connect-timeout", "0", expect="--connect-timeout"),
    "connect timeout nan": c(
        "train", "{q}", "--connect-timeout", "nan", expect="--connect-timeout"
    ),
    "client id without jobs": c("train", "{q}", "--client-id", "0", expect="--client-id"),
    "client id beyond jobs": c(
        "train",
        "{q}",
        "--client-id",
        "2",
        "--jobs",
        "localhost:9000,localhost:9001",
        expect="--client-id",
    ),
    "client id negative": c(
        "train",
        "{q}",
        "--client-id",
        "-1",
        "--jobs",
        "localhost:9000,localhost:9001",
        expect="--client-id",
    ),
    "jobs without port": c(
        "train", "{q}", "--client-id", "0", "--jobs", "localhost,localhost:9001", expect="--jobs"
    ),
    "jobs port a word": c(
        "train", "{q}", "--client-id", "0", "--jobs", "h:x,h:9001", expect="--jobs"
    ),
    "jobs duplicate": c(
        "train", "{q}", "--client-id", "0", "--jobs", "h:9000,h:9000", expect="--jobs"
    ),
    # ---- recipe files
    "recipe missing": c("train", "{tmp}/nope.yaml", expect="no such file"),
    "recipe a folder": c("train", "{tmp}", expect="recipe"),
    "recipe empty": c("train", "{r}", expect="recipe", setup=recipe_text("")),
    "recipe a list": c(
        "train", "{r}", expect="expected a mapping", setup=recipe_text("- a\n- b\n")
    ),
    "recipe bad yaml": c("train", "{r}", expect="line", setup=recipe_text("name: [a\nseed: 1\n")),
    "recipe tabs": c("train", "{r}", expect="line", setup=recipe_text("name: a\n\tseed: 1\n")),
    "recipe duplicate key": c(
        "train", "{r}", expect="'seed'", setup=recipe_text("name: a\nseed: 1\nseed: 2\n")
    ),
    "recipe not utf-8": c("train", "{r}", expect="UTF-8", setup=recipe_bytes(b"\xff\xfe\x00name")),
    "recipe unknown key in file": c(
        "train",
        "{r}",
        expect="unknown recipe key 'train.epochz'",
        setup=quick_edit(lambda raw: raw["train"].__setitem__("epochz", 3)),
    ),
    "recipe yaml anchors loop": c(
        "train", "{r}", expect="recipe", setup=recipe_text("name: &a [*a]\n")
    ),
    # ---- --out of train
    "out is a file": c("train", "{q}", "--out", "{tmp}/f", expect="is a file", setup=file_at("f")),
    "out empty": c("train", "{q}", "--out", "", expect="--out '': expected a folder"),
    "launch out ram": c(
        "launch", "--clients", "2", "{q}", "--out", "ram://x/run", expect="ram:// lives inside one"
    ),
    "out ram root": c("train", "{q}", "--out", "ram://", expect="expected a folder under the"),
    "out ram dotdot": c("train", "{q}", "--out", "ram://x/../..", expect="without '..'"),
    "grace period tiny": c("train", "{q}", "--grace-period", "1e-9", expect="at least 1"),
    # ---- --memory of train, launch and plan
    "memory not a size": c("train", "{q}", "--memory", "12XB", expect="--memory '12XB': expected"),
    "memory zero": c("plan", "{q}", "--memory", "0", expect="--memory '0': expected at least 1"),
    "memory and no memory check": c(
        "train", "{q}", "--memory", "1GiB", "--no-memory-check", expect="--no-memory-check"
    ),
    **{
        f"{command} memory under the plan": c(
            *args, "--memory", "1KiB", expect="--memory 1KiB: the plan needs"
        )
        for command, args in (
            ("train", ("train", "{q}")),
            ("launch", ("launch", "--clients", "2", "{q}")),
            ("plan", ("plan", "{q}")),
        )
    },
    # a URL TensorFlow has no file system for (s3:// without its plug-in): no network needed
    "out on s3 without a plug-in": c(
        "train", "{q}", "--out", "s3://bucket/run", expect="--out 's3://bucket/run': cannot use it"
    ),
    "resume on s3 without a plug-in": c(
        "train", "--resume", "s3://bucket/run", expect="--resume 's3://bucket/run': cannot use it"
    ),
    "out under a file": c(
        "train", "{q}", "--out", "{tmp}/f/run", expect="is a file", setup=file_at("f")
    ),
    "out not empty": c(
        "train", "{q}", "--out", "{tmp}/d", expect="not empty", setup=file_at("d/mine.txt")
    ),
    "out in /proc": c("train", "{q}", "--out", "/proc/dtcli-run", expect="--out"),
    # a name over the file system's limit (255 bytes): File name too long
    **{
        f"{where} name too long": c(
            *args, expect=f"{arg} '{path}': a name in it, or the whole path, is longer"
        )
        for where, arg, args in (
            ("train out", "--out", ("train", "{q}", "--out", LONG)),
            ("train out parent", "--out", ("train", "{q}", "--out", f"{LONG}/run")),
            ("launch out", "--out", ("launch", "--clients", "2", "{q}", "--out", LONG)),
            ("export out", "--out", ("export", "{run}", "--out", LONG)),
            ("plot out", "--out", ("plot", "{run}", "--out", LONG)),
            ("resume", "--resume", ("train", "--resume", LONG)),
            ("eval run", "CHECKPOINT", ("eval", LONG)),
            ("export run", "CHECKPOINT", ("export", LONG, "--out", "{tmp}/e")),
            ("generate run", "CHECKPOINT", ("generate", LONG)),
            ("score run", "CHECKPOINT", ("score", LONG, "--text", "ab")),
            ("plot run", "RUN_DIR", ("plot", LONG)),
        )
        for path in [args[args.index("--out") + 1] if arg == "--out" else LONG]
    },
    "out is the running run": c("train", "{q}", "--out", "{run}", expect="{run}", damage=hold_lock),
    # ---- resume
    "resume with a recipe": c("train", "{q}", "--resume", "{run}", expect="--resume"),
    "resume with out": c("train", "--resume", "{run}", "--out", "{tmp}/x", expect="--resume"),
    "resume missing": c("train", "--resume", "{tmp}/nope", expect="--resume"),
    "resume a file": c("train", "--resume", "{tmp}/f", expect="--resume", setup=file_at("f")),
    "resume an empty folder": c(
        "train", "--resume", "{tmp}/e", expect="--resume", setup=folder_at("e")
    ),
    "resume no checkpoint": c(
        "train", "--resume", "{run}", expect="checkpoint", damage=no_checkpoints
    ),
    "resume all damaged": c(
        "train", "--resume", "{run}", expect="checkpoint", damage=damaged_all("truncated data")
    ),
    "resume recipe garbage": c(
        "train", "--resume", "{run}", expect="recipe", damage=recipe_of_run("name: [\n")
    ),
    "resume recipe unknown key": c(
        "train",
        "--resume",
        "{run}",
        expect="unknown recipe key",
        damage=resume_edit(lambda raw: raw.__setitem__("colour", "red")),
    ),
    "resume held": c("train", "--resume", "{run}", expect="node7", damage=hold_lock),
    "resume new optimizer": c(
        "train", "--resume", "{run}", *s("optimizer.name=sgd"), expect="optimizer.name"
    ),
    "resume new batch": c(
        "train", "--resume", "{run}", *s("data.batch_size=32"), expect="data.batch_size"
    ),
    "resume new seed": c("train", "--resume", "{run}", *s("seed=7"), expect="seed"),
    "resume new model": c(
        "train", "--resume", "{run}", *s("model.layers=[{Dense: {units: 10}}]"), expect="model"
    ),
    "resume bad learning rate": c(
        "train",
        "--resume",
        "{run}",
        *s("optimizer.learning_rate=-1"),
        expect="optimizer.learning_rate",
    ),
    "resume bad mesh": c(
        *("train", "--resume", "{run}", "--epochs", "4", "--mesh", "batch=3", "--devices", "cpu:8"),
        expect="mesh batch=3,model=1: axis sizes multiply to 3, but there are 8 devices",
    ),
    "resume bad devices": c("train", "--resume", "{run}", "--devices", "cpu:x", expect="--devices"),
    "resume a checkpoint folder": c(
        "train",
        "--resume",
        "{ckpt}",
        expect="--resume '{ckpt}': a checkpoint, not a run directory; give its run: --resume "
        "{run} (a resume always goes on from the run's newest intact checkpoint; resuming from "
        "an older one is not supported)",
    ),
    "resume the checkpoints folder": c(
        "train",
        "--resume",
        "{run}/checkpoints",
        expect="--resume '{run}/checkpoints': a run's checkpoints folder, not a run directory; "
        "give its run: --resume {run} (",
    ),
    # refused before training (it failed after it, exit 1, naming an --out never given)
    "resume plots a file": c(
        "train",
        "--resume",
        "{run}",
        "--epochs",
        "5",
        expect="--resume '{run}': its plots ('{run}/plots') is a file, expected a folder",
        damage=plots_a_file,
    ),
    "resume records a folder": c(
        "train",
        "--resume",
        "{run}",
        "--epochs",
        "5",
        expect="--resume '{run}': its resumes.jsonl ('{run}/resumes.jsonl') is not a file",
        damage=resumes_a_folder,
    ),
    # ---- eval
    "eval missing": c("eval", "{tmp}/nope", expect="no such file or folder"),
    "eval ram missing": c("eval", "ram://nothing/run", expect="no such file or folder"),
    "eval on s3 without a plug-in": c("eval", "s3://bucket/run", expect="cannot use it"),
    "eval a file": c("eval", "{tmp}/f", expect="CHECKPOINT", setup=file_at("f")),
    "eval devices more gpus than there are": c(
        "eval", "{run}", "--devices", "gpu:64", expect="error: --devices 'gpu:64': "
    ),
    "eval an empty folder": c("eval", "{tmp}/e", expect="CHECKPOINT", setup=folder_at("e")),
    "eval no checkpoint": c("eval", "{run}", expect="checkpoint", damage=no_checkpoints),
    "eval all damaged": c("eval", "{run}", expect="damaged", damage=damaged_all("random index")),
    **{
        f"eval {kind}": c("eval", "{ckpt}", expect="damaged", damage=DAMAGES[kind])
        for kind in DAMAGES
    },
    "eval split bogus": c("eval", "{run}", "--split", "valid", expect="--split"),
    "eval batch zero": c("eval", "{run}", "--batch-size", "0", expect="--batch-size"),
    # the checkpoint by its own path, not the private folder it is read through
    "eval batch not dividing": c(
        *("eval", "{run}", "--batch-size", "30"),
        expect="error: --batch-size 30: eval batches of 30 do not divide by the data axis 'batch' "
        "of size 4 (mesh batch=4,model=2); pass --batch-size N with N a multiple of 4 (recipe "
        "stored with {ckpt})",
    ),
    # eval's batch is data.eval_batch_size, else data.batch_size: named, with eval's own option
    "eval mesh not dividing the recipe's batch": c(
        *("eval", "{run}", "--mesh", "batch=3", "--devices", "cpu:3"),
        expect="error: recipe key 'data.batch_size': eval batches of 64 (data.eval_batch_size, "
        "default data.batch_size) do not divide by the data axis 'batch' of size 3 (mesh "
        "batch=3,model=1); pass --batch-size N with N a multiple of 3",
    ),
    "eval batch a word": c("eval", "{run}", "--batch-size", "big", expect="--batch-size"),
    "eval bad mesh": c(
        *("eval", "{run}", "--mesh", "batch=3,model=2", "--devices", "cpu:8"),
        expect="mesh batch=3,model=2: axis sizes multiply to 6, but there are 8 devices",
    ),
    "eval bad devices": c("eval", "{run}", "--devices", "cpu:0", expect="--devices"),
    "eval unknown set key": c(
        "eval", "{run}", *s("data.nme=x"), expect="unknown recipe key 'data.nme'"
    ),
    "eval set model": c(
        *("eval", "{run}", *s("model.layers=[{Dense: {units: 10}}]")),
        expect="--set model.layers: eval keeps the checkpoint's model, whose model.layers is",
    ),
    # the same shapes, another function: it restored and evaluated a model never trained
    "eval set an activation": c(
        *(
            "eval",
            "{run}",
            *s("model.layers=[{Dense: {units: 128, activation: tanh}}, {Dense: {units: 10}}]"),
        ),
        expect="--set model.layers: eval keeps the checkpoint's model, whose model.layers is",
    ),
    "eval no argument": c("eval", expect="CHECKPOINT: missing; expected a run directory"),
    # ---- eval --tasks (lm-evaluation-harness): refused before TensorFlow or any restore
    "eval tasks unknown": c(
        *("eval", "{run}", "--tasks", "tiny_mcc", "--include-path", "{tmp}/tasks"),
        expect="error: --tasks: unknown task 'tiny_mcc' (not found in --include-path "
        "{tmp}/tasks or lm-eval's tasks); close: tiny_mc",
        setup=lm_tasks(),
    ),
    "eval tasks file does not parse": c(
        *("eval", "{run}", "--tasks", "broken", "--include-path", "{tmp}/tasks"),
        expect="task 'broken' not found; the task file '{tmp}/tasks/broken.yaml' does not parse",
        setup=lm_tasks(broken="task: broken\noutput_type: [multiple_choice\n"),
    ),
    # built before the checkpoint is restored
    "eval tasks no doc_to_text": c(
        *("eval", "{run}", "--tasks", "noprompt", "--include-path", "{tmp}/tasks"),
        expect="error: --tasks: task 'noprompt' ({tmp}/tasks/noprompt.yaml) cannot be built: "
        "its YAML sets no doc_to_text",
        setup=lm_tasks(noprompt=NO_PROMPT),
    ),
    "eval tasks data file missing": c(
        *("eval", "{run}", "--tasks", "nodata", "--include-path", "{tmp}/tasks"),
        expect="error: --tasks: task 'nodata' ({tmp}/tasks/nodata.yaml) cannot be built: "
        "Unable to find '{tmp}/tasks/gone.jsonl'",
        setup=lm_tasks(nodata=NO_DATA),
    ),
    "eval tasks include path missing": c(
        *("eval", "{run}", "--tasks", "tiny_mc", "--include-path", "{tmp}/nope"),
        expect="error: --include-path '{tmp}/nope': no such folder; expected a folder of task",
    ),
    "eval tasks include path a file": c(
        *("eval", "{run}", "--tasks", "tiny_mc", "--include-path", "{tmp}/f"),
        expect="--include-path '{tmp}/f': not a folder",
        setup=file_at("f"),
    ),
    "eval tasks on a classifier": c(
        *("eval", "{run}", "--tasks", "tiny_mc", "--include-path", "{tmp}/tasks"),
        expect="error: CHECKPOINT '{run}': --tasks needs a language model (task "
        "language_model); this run's task is classify",
        setup=lm_tasks(),
    ),
    "eval tasks with split": c(
        *("eval", "{run}", "--tasks", "tiny_mc", "--split", "train"),
        expect="error: --split train, --tasks: do not combine",
    ),
    "eval tasks limit zero": c(
        *("eval", "{run}", "--tasks", "tiny_mc", "--limit", "0"),
        expect="error: --limit 0: expected a count of examples per task",
    ),
    "eval tasks few-shot negative": c(
        *("eval", "{run}", "--tasks", "tiny_mc", "--num-fewshot", "-1"),
        expect="error: --num-fewshot -1: expected 0 or more",
    ),
    **{
        f"eval tasks seed {seed}": c(
            *("eval", "{run}", "--tasks", "tiny_mc", "--seed", seed),
            expect=f"error: --seed '{seed}': expected one integer >= 0 for all four seeds",
        )
        for seed in ("x", "1,2", "1,2,3,4,5")
    },
    "eval limit without tasks": c(
        "eval", "{run}", "--limit", "5", expect="error: --limit: only with --tasks"
    ),
    "eval tasks output path a file": c(
        *("eval", "{run}", "--tasks", "tiny_mc", "--include-path", "{tmp}/tasks"),
        *("--output-path", "{tmp}/f"),
        expect="--output-path '{tmp}/f': is a file, expected a folder",
        setup=lambda tmp: (lm_tasks()(tmp), file_at("f")(tmp)),
    ),
    # a checkpoint kept outside a run directory: no folder of its own for the samples
    "eval tasks log samples without a place": c(
        *("eval", "{run}/../alone", "--tasks", "tiny_mc", "--include-path", "{tmp}/tasks"),
        "--log-samples",
        expect="error: --log-samples: CHECKPOINT '{run}/../alone' is not inside a run directory",
        setup=lambda tmp: (lm_tasks()(tmp), shutil.copytree(newest(tmp / "run"), tmp / "alone")),
    ),
    # ---- export
    "export missing": c(
        "export", "{tmp}/nope", "--out", "{tmp}/sm", expect="no such file or folder"
    ),
    "export no out": c("export", "{run}", expect="--out: missing; expected a folder"),
    "export out a file": c(
        "export", "{run}", "--out", "{tmp}/f", expect="is a file", setup=file_at("f")
    ),
    "export out under a file": c(
        "export", "{run}", "--out", "{tmp}/f/sm", expect="is a file", setup=file_at("f")
    ),
    "export out not empty": c(
        "export", "{run}", "--out", "{tmp}/d", expect="not empty", setup=file_at("d/x")
    ),
    "export hf of a classifier": c(
        "export",
        "{run}",
        "--format",
        "hf",
        "--out",
        "{tmp}/hf",
        expect="--format hf: the run's model is no model.transformer",
    ),
    "export peft without lora": c(
        "export",
        "{run}",
        "--format",
        "peft",
        "--out",
        "{tmp}/p",
        expect="--format peft: the run has no LoRA adapters (its recipe's lora is null)",
    ),
    "export merge without lora": c(
        *("export", "{run}", "--merge", "--format", "hf", "--out", "{tmp}/m"),
        expect="--merge: the run has no LoRA adapters to fold in",
    ),
    "export merge savedmodel": c(
        "export",
        "{run}",
        "--merge",
        "--out",
        "{tmp}/m",
        expect="--merge: only with --format hf",
    ),
    "export peft dtype": c(
        *("export", "{run}", "--format", "peft", "--dtype", "bfloat16", "--out", "{tmp}/p"),
        expect="--dtype and --max-shard-size: only with --format hf",
    ),
    "export bad format": c(
        "export", "{run}", "--format", "onnx", "--out", "{tmp}/x", expect="--format 'onnx'"
    ),
    # ---- import-hf (a tiny GPT-2 folder written with NumPy: tests/hf_models.py)
    "import-hf no config": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="has no config.json",
        setup=file_at("hf/model.safetensors"),
    ),
    "import-hf model type": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="model_type 'bert' is not supported",
        setup=hf_folder(config={**hf_models.GPT2_CONFIG, "model_type": "bert"}),
    ),
    "import-hf option": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="config.json: scale_attn_by_inverse_layer_idx true is not supported",
        setup=hf_folder(config={**hf_models.GPT2_CONFIG, "scale_attn_by_inverse_layer_idx": True}),
    ),
    "import-hf no weights": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="has neither model.safetensors nor model.safetensors.index.json",
        setup=hf_folder(remove="model.safetensors"),
    ),
    "import-hf truncated": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="model.safetensors: is truncated",
        setup=hf_folder(cut=100),
    ),
    "import-hf shapes": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="tensor 'transformer.wpe.weight' has shape [16, 16]; config.json implies [32, 16]",
        setup=hf_folder(edit={"n_positions": 32}),
    ),
    "import-hf tokenizer too big": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="model.transformer.vocab_size: the model has 131 ids",
        setup=hf_folder(tokenizer=200),
    ),
    "import-hf no tokenizer": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        expect="has no tokenizer.json",
        setup=hf_folder(remove="tokenizer.json"),
    ),
    "import-hf out not empty": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/hf",
        expect="--out",
        setup=hf_folder(),
    ),
    "import-hf context": c(
        "import-hf",
        "{tmp}/hf",
        "--out",
        "{tmp}/run",
        "--context",
        "17",
        expect="--context 17: expected 1 to the model's 16 positions",
        setup=hf_folder(),
    ),
    # ---- model.from_hf (the same folder)
    "from_hf contradicts heads": c(
        "train",
        "{r}",
        expect="recipe key 'model.transformer.heads': 4 contradicts model.from_hf 'hf', whose "
        "config.json makes it 2",
        setup=from_hf_recipe("context: 8, heads: 4"),
    ),
    "from_hf contradicts the tokenizer": c(
        "train",
        "{r}",
        expect="recipe key 'data.tokenizer': 'gpt2' contradicts model.from_hf",
        setup=from_hf_recipe("context: 8", ", tokenizer: gpt2"),
    ),
    "from_hf context past the positions": c(
        "train",
        "{r}",
        expect="recipe key 'model.transformer.context':",
        setup=from_hf_recipe("context: 17"),
    ),
    "from_hf no folder": c(
        "train",
        "{r}",
        expect="recipe key 'model.from_hf'",
        setup=lambda tmp: (tmp / "r.yaml").write_text(
            "task: language_model\nmodel: {from_hf: nowhere}\ndata: {source: text}\n"
        ),
    ),
    # ---- lora (the same folder as its base)
    "lora targets nothing": c(
        "train",
        "{r}",
        expect="recipe key 'lora.targets': 'nothing' finds none of the model's weights; the "
        "kernels are block_0.attention.key.kernel, block_0.attention.proj.kernel, "
        "block_0.attention.query.kernel, block_0.attention.value.kernel, block_0.mlp.fc.kernel, "
        "block_0.mlp.proj.kernel",
        setup=lora_recipe("targets: nothing"),
    ),
    "lora targets biases norms embeddings": c(
        "train",
        "{r}",
        expect="recipe key 'lora.targets': 'bias$|ln_|embedding' finds only "
        "token_embedding.embeddings, position_embedding.embeddings, block_0.attention.key.bias",
        setup=lora_recipe("targets: 'bias$|ln_|embedding'"),
    ),
    "lora rank past a kernel": c(
        "train",
        "{r}",
        expect="recipe key 'lora.rank': 32 is larger than the input size 16 (dims [16]) of "
        "weight 'block_0.attention.query.kernel'; use a rank of at most 16",
        setup=lora_recipe("rank: 32"),
    ),
    "lora rank 0": c(
        "train",
        "{r}",
        expect="recipe key 'lora.rank': expected an integer >= 1, got 0",
        setup=lora_recipe("rank: 0"),
    ),
    "lora targets no regex": c(
        "train",
        "{r}",
        expect="recipe key 'lora.targets': not a valid regex",
        setup=lora_recipe("targets: '('"),
    ),
    "lora without a base": c(
        "train",
        "{r}",
        expect="recipe key 'lora': LoRA trains adapters on a base model, and this recipe has none",
        setup=recipe_text(
            "task: language_model\nmodel: {transformer: {layers: 1}}\nlora: {rank: 2}\n"
            "data: {source: text}\n"
        ),
    ),
    "lora on a classifier run": c(
        "train",
        "{r}",
        "--set",
        "model.from_run={run}",
        expect="recipe key 'lora': LoRA adapts dtcli's GPT (model.transformer), and this "
        "recipe's base is a tf-keras model",
        setup=recipe_text("lora: {rank: 2}\n"),
    ),
    "lora dropout with remat": c(
        "train",
        "{r}",
        expect="recipe key 'lora.dropout': recomputing a block (model.transformer.remat)",
        setup=lora_recipe("dropout: 0.1", "context: 8, remat: true"),
    ),
    "lora from_peft no folder": c(
        "train",
        "{r}",
        expect="recipe key 'lora.from_peft' 'nowhere': no such folder (expected a peft adapter "
        "folder: adapter_config.json, adapter_model.safetensors)",
        setup=lora_from_peft("rank: 8", {}, folder="nowhere"),
    ),
    "lora from_peft other modules": c(
        "train",
        "{r}",
        expect="recipe key 'lora.from_peft' 'peft': has no adapter of transformer.h.0.attn.c_attn "
        "(dtcli's block_0.attention.query.kernel), which lora.targets adapts",
        setup=lora_from_peft("rank: 8", {"transformer.h.0.mlp.c_fc": 8}),
    ),
    "lora from_peft rank": c(
        "train",
        "{r}",
        expect="recipe key 'lora.from_peft' 'peft': transformer.h.0.attn.c_attn's rank is 2; "
        "lora.rank makes it 4 or 8",
        setup=lora_from_peft("rank: 4, alpha: 8", {"transformer.h.0.attn.c_attn": 2}, alpha=4),
    ),
    "lora from_peft scale": c(
        "train",
        "{r}",
        expect="recipe key 'lora.from_peft' 'peft': transformer.h.0.attn.c_attn's scale is "
        "lora_alpha/r = 16/8 = 2; the recipe's lora.alpha/lora.rank is 8/8 = 1",
        setup=lora_from_peft("rank: 8, alpha: 8", {"transformer.h.0.attn.c_attn": 8}),
    ),
    # ---- model.from_run ({run}: the quickstart's classifier)
    "from_run no run": c(
        "train",
        "{r}",
        expect="recipe key 'model.from_run' 'nowhere': no such file or folder",
        setup=recipe_text("model: {from_run: nowhere}\n"),
    ),
    "from_run not a path": c(
        "train",
        "{r}",
        expect="recipe key 'model.from_run': expected a run directory or a checkpoint folder "
        "(a string), got 3",
        setup=recipe_text("model: {from_run: 3}\n"),
    ),
    "from_run no complete checkpoint": c(
        "train",
        "{q}",
        "--set",
        "model.from_run={run}",
        expect="recipe key 'model.from_run' '{run}': neither a checkpoint nor a run directory "
        "with a complete checkpoint",
        damage=no_checkpoints,
    ),
    "from_run damaged checkpoint": c(
        "train",
        "{q}",
        "--set",
        "model.from_run={ckpt}",
        expect="recipe key 'model.from_run': checkpoint {ckpt} is damaged: ",
        damage=DAMAGES["truncated data"],
    ),
    "from_run classifier as a GPT": c(
        "train",
        "{r}",
        "--set",
        "model.from_run={run}",
        expect="recipe key 'model.transformer': {'layers': 2} contradicts model.from_run "
        "'{run}', whose recipe makes it null",
        setup=recipe_text(
            "task: language_model\nmodel: {transformer: {layers: 2}}\ndata: {source: text}\n"
        ),
    ),
    "from_run and from_hf": c(
        "train",
        "{r}",
        expect="recipe key 'model.from_run': the model starts from a dtcli run's checkpoint, and "
        "model.from_hf from a Hugging Face folder; give one of them",
        setup=recipe_text("task: language_model\nmodel: {from_run: run, from_hf: hf}\n"),
    ),
    "export out in /proc": c("export", "{run}", "--out", "/proc/dtcli-sm", expect="--out"),
    "export out the run": c("export", "{run}", "--out", "{run}", expect="--out"),
    "export no checkpoint": c(
        "export", "{run}", "--out", "{tmp}/sm", expect="checkpoint", damage=no_checkpoints
    ),
    **{
        f"export {kind}": c(
            "export", "{ckpt}", "--out", "{tmp}/sm", expect="damaged", damage=DAMAGES[kind]
        )
        for kind in ("truncated data", "garbage meta", "random index")
    },
    # ---- plan
    "plan missing recipe": c("plan", "{tmp}/nope.yaml", expect="no such file"),
    "plan no recipe": c("plan", expect="RECIPE: missing; expected the recipe YAML file"),
    "plan bad set": c("plan", "{q}", *s("model.api=torch"), expect="model.api"),
    "plan bad mesh": c(
        "plan", "{q}", "--mesh", "batch=16", "--devices", "cpu:8", expect="multiply to 16"
    ),
    "plan bad devices": c("plan", "{q}", "--devices", "cpu:007", expect="--devices"),
    "plan rule rank": c(
        "plan", "{q}", *s("layouts.rules={'dense_1\\.bias': [model, unsharded]}"), expect="rank 1"
    ),
    "plan not divisible": c(
        "plan",
        "{q}",
        *s("model.layers=[{Dense: {units: 127}}, {Dense: {units: 10}}]"),
        expect="does not divide",
    ),
    "plan duplicate key": c(
        "plan", "{r}", expect="'name'", setup=recipe_text("name: a\nname: b\n")
    ),
    "plan unknown option": c("plan", "{q}", "--jsn", expect="No such option"),
    # ---- plan HF_DIR (a Hugging Face model folder)
    "plan hf no config.json": c("plan", "{tmp}", "--devices", "gpu:8", expect="has no config.json"),
    "plan hf no device count": c("plan", LLAMA3_8B, expect="needs the device count"),
    "plan hf auto measure": c(
        "plan", LLAMA3_8B, "--auto", "--devices", "gpu:8", "--measure", "5", expect="predicts only"
    ),
    "plan hf auto write": c(
        "plan",
        LLAMA3_8B,
        "--auto",
        "--devices",
        "gpu:8",
        "--write",
        "{tmp}/o.yaml",
        expect="--write: dtcli plan HF_DIR",
    ),
    # ---- plan --auto
    "auto with mesh": c("plan", "{q}", "--auto", "--mesh", "batch=8", expect="--mesh: --auto"),
    "auto top zero": c("plan", "{q}", "--auto", "--top", "0", expect="--top 0: expected"),
    "auto measure zero": c("plan", "{q}", "--auto", "--measure", "0", expect="--measure 0"),
    "auto measure not a number": c("plan", "{q}", "--auto", "--measure", "x", expect="--measure"),
    "measure without auto": c("plan", "{q}", "--measure", "5", expect="--measure: only with"),
    "repeats without measure": c(
        "plan", "{q}", "--auto", "--repeats", "3", expect="--repeats: only with --measure"
    ),
    "repeats zero": c(
        "plan", "{q}", "--auto", "--measure", "5", "--repeats", "0", expect="--repeats 0: expected"
    ),
    "auto write exists": c(
        "plan", "{q}", "--auto", "--write", "{tmp}/f.yaml", expect="exists", setup=file_at("f.yaml")
    ),
    "auto write a folder": c(
        "plan", "{q}", "--auto", "--write", "{tmp}/d", expect="is a folder", setup=folder_at("d")
    ),
    "auto write no folder": c(
        "plan", "{q}", "--auto", "--write", "{tmp}/no/o.yaml", expect="no such folder"
    ),
    "auto plot not png": c("plan", "{q}", "--auto", "--plot", "{tmp}/p.jpg", expect="--plot"),
    # refused before the search (it used to fail after it, --write with a PermissionError)
    "auto write unwritable": c(
        "plan", "{q}", "--auto", "--write", "/proc/auto.yaml", expect="--write '/proc/auto.yaml'"
    ),
    "auto plot unwritable": c(
        "plan", "{q}", "--auto", "--plot", "/sys/auto.png", expect="--plot '/sys/auto.png': cannot"
    ),
    "auto bad memory": c("plan", "{q}", "--auto", "--memory", "lots", expect="--memory 'lots'"),
    "auto unknown devices": c("plan", "{q}", "--auto", "--devices", "npu:8", expect="--devices"),
    # named as the user gave them, as train does (plan said "recipe key 'devices' = ...")
    "auto devices option more gpus than there are": c(
        "plan", "{q}", "--auto", "--devices", "gpu:64", expect="error: --devices 'gpu:64': "
    ),
    "plan devices option more gpus than there are": c(
        "plan", "{q}", "--devices", "gpu:64", expect="error: --devices 'gpu:64': "
    ),
    "auto budget under every candidate": c(
        "plan", "{q}", "--auto", "--memory", "1KiB", expect="no candidate fits; the smallest"
    ),
    # ---- plot
    "plot missing run": c("plot", "{tmp}/nope", expect="no such folder"),
    "plot no run": c("plot", expect="RUN_DIRS: missing; expected one or more run directories"),
    "plot run without metrics": c("plot", "{tmp}/e", expect="metrics", setup=folder_at("e")),
    "plot a file": c(
        "plot", "{tmp}/f", expect="RUN_DIR '{tmp}/f': not a folder", setup=file_at("f")
    ),
    "plot metric bogus": c(
        "plot", "{run}", "--metric", "f1", "--out", "{tmp}/p", expect="--metric"
    ),
    "plot task metric not recorded": c(
        "plot",
        "{run}",
        "--metric",
        "tiny_mc/acc",
        "--out",
        "{tmp}/p",
        expect="--metric tiny_mc/acc: no run here recorded it",
    ),
    "plot out a file": c(
        "plot", "{run}", "--out", "{tmp}/f", expect="is a file", setup=file_at("f")
    ),
    "plot out under a file": c(
        "plot", "{run}", "--out", "{tmp}/f/p", expect="is a file", setup=file_at("f")
    ),
    "plot plots a file": c(
        "plot",
        "{run}",
        expect="RUN_DIR '{run}': its plots ('{run}/plots') is a file, expected a folder",
        damage=plots_a_file,
    ),
    "plot default out a file": c(
        "plot",
        "{run}",
        "{run}",
        expect="the default --out 'plots': is a file",
        setup=file_at("plots"),
    ),
    "plot out in /proc": c("plot", "{run}", "--out", "/proc/dtcli-plots", expect="--out"),
    "plot one of two missing": c("plot", "{run}", "{tmp}/nope", "--out", "{tmp}/p", expect="nope"),
    "plot metrics all garbage": c(
        "plot",
        "{tmp}/g",
        "--out",
        "{tmp}/p",
        expect="metrics",
        setup=file_at("g/metrics.jsonl", "{not json\n[1,\n"),
    ),
    # ---- launch
    "launch no clients": c("launch", "{q}", expect="--clients: missing; expected how many"),
    "generate no argument": c("generate", expect="CHECKPOINT: missing; expected a language"),
    "score no argument": c("score", expect="CHECKPOINT: missing; expected a language"),
    "prepare-text no source": c("prepare-text", expect="SOURCE: missing; expected a text"),
    "launch clients zero": c("launch", "{q}", "--clients", "0", expect="--clients"),
    "launch clients negative": c("launch", "{q}", "--clients", "-2", expect="--clients"),
    "launch clients a word": c("launch", "{q}", "--clients", "two", expect="--clients"),
    "launch clients not dividing": c("launch", "{q}", "--clients", "3", expect="--clients"),
    "launch clients too many": c("launch", "{q}", "--clients", "16", expect="--clients"),
    "launch devices per client bad": c(
        "launch",
        "{q}",
        "--clients",
        "2",
        "--devices-per-client",
        "cpu:x",
        expect="--devices-per-client",
    ),
    "launch devices per client mismatch": c(
        "launch",
        "{q}",
        "--clients",
        "2",
        "--devices-per-client",
        "cpu:3",
        expect="--devices-per-client",
    ),
    "launch port zero": c("launch", "{q}", "--clients", "2", "--port", "0", expect="--port"),
    "launch port too high": c(
        "launch", "{q}", "--clients", "2", "--port", "65535", expect="--port"
    ),
    "launch bad set": c("launch", "{q}", "--clients", "2", *s("train.keep=0"), expect="train.keep"),
    "launch bad mesh": c("launch", "{q}", "--clients", "2", "--mesh", "batch=5", expect="mesh"),
    "launch out a file": c(
        "launch",
        "{q}",
        "--clients",
        "2",
        "--out",
        "{tmp}/f",
        expect="is a file",
        setup=file_at("f"),
    ),
    "launch out not empty": c(
        "launch",
        "{q}",
        "--clients",
        "2",
        "--out",
        "{tmp}/d",
        expect="not empty",
        setup=file_at("d/x"),
    ),
    "launch resume with recipe": c(
        "launch", "{q}", "--clients", "2", "--resume", "{run}", expect="--resume"
    ),
    "launch resume missing": c(
        "launch", "--clients", "2", "--resume", "{tmp}/nope", expect="--resume"
    ),
    "launch resume held": c(
        "launch", "--clients", "2", "--resume", "{run}", expect="node7", damage=hold_lock
    ),
    "launch no recipe": c("launch", "--clients", "2", expect="RECIPE"),
    "launch connect timeout": c(
        "launch", "{q}", "--clients", "2", "--connect-timeout", "-5", expect="--connect-timeout"
    ),
    # ---- doctor
    "doctor devices cpu:0": c("doctor", "--devices", "cpu:0", expect="--devices"),
    "doctor devices cpu:08": c("doctor", "--devices", "cpu:08", expect="--devices"),
    "doctor devices npu": c("doctor", "--devices", "npu", expect="--devices"),
    "doctor devices empty": c("doctor", "--devices", "", expect="--devices"),
    "doctor devices above the cap": c("doctor", "--devices", "cpu:9999", expect="--devices"),
    "doctor extra argument": c("doctor", "now", expect="unexpected extra argument"),
    "doctor unknown option": c("doctor", "--gpu", expect="No such option"),
    # ---- from a new user's trial (issue 24)
    "set a list item by index": t(
        "model.layers[0].Dense.units=32",
        expect="'model.layers' is a list: set an item by replacing the whole list, --set "
        "'model.layers=[{Dense: {units: 32, activation: relu}}, {Dense: {units: 10}}]'",
    ),
    "activation misspelt": t(
        "model.layers=[{Dense: {units: 8, activation: relux}}, {Dense: {units: 10}}]",
        expect="Unknown activation function 'relux' cannot be deserialized. (did you mean 'relu'?)",
    ),
    "epochs past any run": c(
        "train",
        "{q}",
        "--epochs",
        str(10**20),
        expect=f"--epochs {10**20}: expected at most 2**31 - 1 (2,147,483,647), got 1",
    ),
    "steps past any run": lm(
        "train.steps=3000000000", expect="recipe key 'train.steps': expected at most"
    ),
    "mesh given twice": c(
        "train",
        "{q}",
        "--mesh",
        "batch=4",
        "--mesh",
        "model=2",
        expect="--mesh: given 2 times ('batch=4', then 'model=2'); give it once",
    ),
    "out a link to nothing": c(
        "train",
        "{q}",
        "--out",
        "{tmp}/link",
        setup=lambda tmp: (tmp / "link").symlink_to(tmp / "nowhere"),
        expect="is a symbolic link to nothing; expected a folder for the run",
    ),
    "resume whose lock is a folder": c(
        "train",
        "--resume",
        "{run}",
        "--epochs",
        "5",
        damage=lambda run: (run / rundir.LOCK).mkdir(),
        expect="its .dtcli.lock is a folder, expected dtcli's lock file",
    ),
    # ---- sweep: every refusal before any trial starts (nothing written)
    "sweep grid value fails the recipe's checks": c(
        *("sweep", "{q}", "--grid", "optimizer.learning_rate=1e-3,-1"),
        expect="trial 1 (optimizer.learning_rate=-1): recipe key 'optimizer.learning_rate': "
        "expected a positive number",
    ),
    "sweep random without seed": c(
        *("sweep", "{q}", "--random", "2", "optimizer.learning_rate=uniform(1e-4,1e-2)"),
        expect="--random: needs --seed S",
    ),
    "sweep bad distribution": c(
        *("sweep", "{q}", "--random", "2", "optimizer.learning_rate=normal(0,1)", "--seed", "0"),
        expect="--random 'optimizer.learning_rate=normal(0,1)': expected KEY=DIST",
    ),
    "sweep unknown metric": c(
        *("sweep", "{q}", "--grid", "optimizer.learning_rate=1e-3", "--metric", "eval_los"),
        expect="--metric 'eval_los': not a metric this recipe's runs write (did you mean eval_loss?)",
    ),
    "sweep grid without =": c(
        *("sweep", "{q}", "--grid", "optimizer.learning_rate"),
        expect="--grid 'optimizer.learning_rate': expected KEY=V1,V2,...",
    ),
    "sweep grid and random": c(
        *("sweep", "{q}", "--grid", "seed=1,2", "--random", "2", "train.epochs=int(1,3)"),
        expect="--grid and --random: give one of them",
    ),
    "sweep jobs zero": c(
        *("sweep", "{q}", "--grid", "seed=1,2", "--jobs", "0"),
        expect="--jobs 0: expected at least 1",
    ),
    "sweep jobs over the cores": c(
        *("sweep", "{q}", "--grid", "seed=1,2", "--jobs", "100000"),
        expect="at most one trial per core",
    ),
    "sweep other trials on the same out": c(
        *("sweep", "{q}", "--grid", "seed=1,2", "--out", "{tmp}/s"),
        setup=lambda tmp: (
            (tmp / "s").mkdir()
            or (tmp / "s" / "sweep.json").write_text(
                json.dumps({"recipe": QUICK, "sets": [], "trials": []})
            )
        ),
        expect="--out '{tmp}/s': holds another sweep",
    ),
    "sweep grid value twice": c(
        *("sweep", "{q}", "--grid", "optimizer.learning_rate=1e-3,1e-3", "--dry-run"),
        expect="--grid 'optimizer.learning_rate=1e-3,1e-3': the value 1e-3 of "
        "'optimizer.learning_rate' is given twice",
    ),
    "sweep grid value twice once typed": c(
        *("sweep", "{q}", "--grid", "optimizer.learning_rate=1e-3,0.001", "--grid", "seed=1,2"),
        *("--dry-run",),
        expect="--grid 'optimizer.learning_rate=...': the value 0.001 of "
        "'optimizer.learning_rate' is given twice (as 1e-3 and 0.001)",
    ),
    "sweep jobs on devices auto": c(
        *("sweep", "{q}", "--grid", "seed=1,2", "--jobs", "2", "--set", "devices=auto"),
        *("--dry-run",),
        expect="--jobs 2: trials at once need every trial on cpu or every trial on gpu:N",
    ),
    # ---- the top level
    "unknown command": c("fit", "{q}", expect="No such command"),
    "misspelt command": c("trian", "{q}", expect="No such command"),
}


@pytest.mark.parametrize("name", CASES, ids=list(CASES))
def test_bad_input(name, tmp_path, trained_run, cli, cpu8, monkeypatch):
    case = CASES[name]
    # lm-eval's cases read local task data only; its caches outside the case's folder
    for key, value in {"HF_HOME": "hf", "HF_DATASETS_CACHE": "hf/datasets"}.items():
        monkeypatch.setenv(key, str(tmp_path / value))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for package in case.missing:
        monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    tmp = tmp_path / "case"
    tmp.mkdir()
    run = tmp / "run"
    if any("{run}" in a or "{ckpt}" in a for a in case.args):
        shutil.copytree(trained_run, run)
    ckpt = newest(run) if run.exists() else tmp / "no-run"
    fill = {
        "{q}": QUICK,
        "{r}": str(tmp / "r.yaml"),
        "{tmp}": str(tmp),
        "{run}": str(run),
        "{ckpt}": str(ckpt),
    }

    def expand(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    try:
        if case.setup is not None:
            case.setup(tmp)
        if case.damage is not None:
            case.damage(run)
        before = snapshot(tmp)
        result = cli(*[expand(a) for a in case.args], cwd=tmp)
        after = snapshot(tmp)
    finally:
        while HELD:
            HELD.pop().close()
    assert result.code == case.code, result.err
    assert "Traceback" not in result.err and "Traceback" not in result.out
    assert "dtcli-held-" not in result.err  # a private temporary folder (storage.held_open)
    assert 1 <= len(result.err_lines) <= 2, result.err
    last = result.err_lines[-1]
    assert last.startswith("error: "), result.err
    assert expand(case.expect) in last, last
    assert after == before, sorted(set(after) ^ set(before)) or "a file changed"


def test_the_table_is_big_enough():
    commands = {case.args[0] for case in CASES.values() if case.args}
    assert len(CASES) >= 150
    assert {"train", "eval", "plan", "plot", "export", "launch", "doctor"} <= commands
