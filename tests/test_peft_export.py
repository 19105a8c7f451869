"""LoRA adapters in and out as Hugging Face users use them, through the real commands: a LoRA
run on a tiny GPT-2 (query, value, attention.proj, mlp.fc: c_attn fused with a zero key block)
and on a tiny Llama (every kernel, the untied head too) from model.from_hf, 3 AdamW steps; then

- `export --format peft` loaded by peft onto transformers' model of the base folder gives the
  log probabilities `dtcli score` gives (1e-4);
- `export --merge --format hf` loaded by transformers gives them too;
- `lora.from_peft` of an adapter peft saved (random A and B): the first step's loss is the peft
  model's loss of that batch (1e-4), the base's is not;
- a LoRA run's `--format hf` without `--merge` is refused in one line.
"""

from __future__ import annotations

import json

import hf_models
import numpy as np
import pytest
import torch
import yaml

TOLERANCE = 1e-4
# Every command here on 8 devices without Grappler's rewrites (conftest.without_grappler): the
# checks compare with transformers and peft, whose math they are.
pytestmark = pytest.mark.usefixtures("without_grappler")
# The session's 8 virtual CPUs: the LoRA runs train on a data mesh (GPT-2) and a 2-D one
# (Llama); score reads them on another.
MESHES = {"gpt2": {"batch": 8}, "llama": {"batch": 4, "model": 2}}
SCORE_ON = ("--mesh", "batch=2,model=4", "--devices", "cpu:8")
TARGETS = {"gpt2": r"attention\.(query|value|proj)|mlp\.fc", "llama": r"\.kernel$"}
CONTEXT = 64  # the bases' positions
# One window of the context: score's log probabilities are then the whole text's.
TEXT = "We are accounted poor citizens, the patricians good."


def _recipe(tmp, kind, lora, steps=3, learning_rate=1e-2):
    text = tmp / "text.txt"
    if not text.exists():
        text.write_text("\n".join(hf_models.LINES * 4))
    return {
        "task": "language_model",
        "devices": "cpu:8",
        "mesh": MESHES[kind],
        "model": {"from_hf": str(tmp / "hf"), "transformer": {"context": CONTEXT}},
        "lora": {"rank": 4, "alpha": 8.0, **lora},
        "data": {"source": "text", "path": str(text), "batch_size": 8, "shuffle": False},
        "optimizer": {"name": "adamw", "learning_rate": learning_rate},
        "train": {"steps": steps, "log_every": 1},
    }


def _train(cli, tmp, name, recipe):
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(recipe))
    result = cli("train", tmp / f"{name}.yaml", "--out", tmp / name, "--no-progress")
    assert result.code == 0, result.err
    return tmp / name


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, without_grappler):
    """Each base made by transformers, a LoRA run of 3 steps from it, and what `dtcli score`
    gives of TEXT under the run's newest checkpoint (its tokens and log probabilities)."""
    from conftest import run_cli

    out = {}
    for kind, make in (("gpt2", hf_models.gpt2), ("llama", hf_models.llama)):
        tmp = tmp_path_factory.mktemp(f"lora-{kind}")
        make(tmp / "hf")
        run = _train(run_cli, tmp, "run", _recipe(tmp, kind, {"targets": TARGETS[kind]}))
        out[kind] = (tmp, run, _scored(run_cli, run))
    return out


def _logprobs(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float()
    logp = torch.log_softmax(logits, -1)[0, :-1].numpy()
    return logp[np.arange(len(ids) - 1), ids[1:]]


def _scored(cli, run):
    """`dtcli score --json` of the run's newest checkpoint: its tokens and log probabilities."""
    result = cli("score", run, "--text", TEXT, "--json", *SCORE_ON)
    assert result.code == 0, result.err
    got = json.loads(result.out)
    assert len(got["tokens"]) <= CONTEXT
    return got["tokens"], np.array(got["logprobs"])


def _base(tmp):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_peft_export_loaded_by_peft_gives_dtcli_log_probabilities(lora_runs, kind, cli):
    from peft import PeftModel
    from safetensors.numpy import load_file

    tmp, run, (ids, got) = lora_runs[kind]
    out = tmp / "peft"
    result = cli("export", run, "--format", "peft", "--out", out)
    assert result.code == 0, result.err
    tensors = load_file(out / "adapter_model.safetensors")
    assert min(np.abs(t).max() for n, t in tensors.items() if "lora_B" in n) > 0  # trained
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str((tmp / "hf").resolve())

    model = PeftModel.from_pretrained(_base(tmp), out).eval()
    want = _logprobs(model, ids)
    assert np.abs(got - want).max() < TOLERANCE
    assert np.abs(_logprobs(_base(tmp), ids) - want).max() > 100 * TOLERANCE  # the adapters count


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_merged_hf_export_gives_dtcli_log_probabilities(lora_runs, kind, cli):
    from transformers import AutoModelForCausalLM

    tmp, run, (ids, got) = lora_runs[kind]
    out = tmp / "merged"
    result = cli("export", run, "--merge", "--format", "hf", "--out", out)
    assert result.code == 0, result.err
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert np.abs(got - _logprobs(model, ids)).max() < TOLERANCE
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"  # the base's


def test_hf_export_of_a_lora_run_without_merge_is_refused(lora_runs, cli):
    tmp, run, _ = lora_runs["gpt2"]
    result = cli("export", run, "--format", "hf", "--out", tmp / "refused")
    assert result.code == 2
    assert result.err.strip().splitlines()[-1] == (
        "error: --format hf: the run holds LoRA adapters beside a frozen base; add --merge (the "
        "adapters folded into the base's weights) or use --format peft (the adapters alone)"
    )
    assert not (tmp / "refused").exists()


@pytest.mark.parametrize(
    "kind, modules, targets",
    [
        ("gpt2", ["c_attn", "mlp.c_fc"], r"attention\.(query|key|value)|mlp\.fc"),
        ("llama", ["q_proj", "v_proj", "down_proj"], r"attention\.(query|value)|mlp\.proj"),
    ],
)
def test_from_peft_starts_from_the_peft_adapter(lora_runs, kind, modules, targets, cli):
    """A peft adapter saved by peft (random A and B, so it changes the model) as the step-0
    adapters: the first step's loss (steps.jsonl: before its update) is the peft model's loss
    of that batch, not the base's."""
    from peft import LoraConfig, get_peft_model

    from dtcli import data as data_lib
    from dtcli import metrics
    from dtcli import recipe as recipe_lib

    tmp, _, _ = lora_runs[kind]
    peft_model = get_peft_model(
        _base(tmp),
        LoraConfig(r=4, lora_alpha=8, target_modules=modules, fan_in_fan_out=kind == "gpt2"),
    )
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(tmp / "theirs")
    peft_model.eval()

    recipe = _recipe(tmp, kind, {"targets": targets, "from_peft": str(tmp / "theirs")}, steps=1)
    run = _train(cli, tmp, "from-peft", recipe)
    first = metrics.read(run / "steps.jsonl")[0]["loss"]
    resolved = recipe_lib.load(run / "recipe.yaml")
    batch = data_lib.load(resolved.data, ("train",), run / "tokenizer.json", 10**6).train
    x, y = (torch.tensor(a[:8].astype(np.int64)) for a in (batch.x, batch.y))

    def loss(model):
        with torch.no_grad():
            logits = model(x).logits
        return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))

    assert abs(first - loss(peft_model)) < TOLERANCE
    assert abs(first - loss(_base(tmp))) > 100 * TOLERANCE
