"""`dtcli plan HF_DIR`: a published model planned from its config.json and safetensors headers,
before anything is loaded (dtcli/published.py, autoplan/nominal.py).

The fixtures in tests/data/hf are config.json files as the hub ships them (Llama 3 8B, GPT-2
small), without weights; small checkpoints are saved by transformers here, so that the headers
read are the ones transformers writes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, env

from dtcli import plan as plan_lib
from dtcli import published as published_lib
from dtcli.errors import UsageError
from dtcli.recipe import Overrides

HF = ROOT / "tests" / "data" / "hf"
LLAMA3_8B = HF / "llama3_8b"
GPT2 = HF / "gpt2"
LLAMA3_8B_PARAMETERS = 8_030_261_248  # Meta's Llama 3 8B: embeddings and head untied
GPT2_PARAMETERS = 124_439_808  # GPT-2 small, its head tied to the token embedding
# Llama 3 8B fits 80 GiB devices at a 2,048 context with remat (at its 8,192 the attention
# scores dtcli keeps take 100 GiB per device on batch=2,model=4).
SHORT = ["--set", "model.transformer.context=2048", "--set", "model.transformer.remat=true"]


def report(folder: Path, *sets: str, mesh: str | None = None, devices: str = "gpu:8"):
    return plan_lib.published_report(str(folder), Overrides(sets, mesh, devices), devices_key="x")


def test_llama3_8b_weight_bytes_are_its_parameters_in_float32():
    r = report(LLAMA3_8B, mesh="batch=2,model=4")
    assert r.published["parameters"] == LLAMA3_8B_PARAMETERS
    # 128,256 is a multiple of 64: no padded rows, every byte a parameter of the config
    assert r.totals()["parameters"]["replicated"] == LLAMA3_8B_PARAMETERS * 4
    assert r.memory.weights == r.totals()["parameters"]["per_device"]
    # Megatron's rules on the model axis, stated; the batch: one sequence per data shard
    assert r.axes == {"batch": 2, "model": 4}
    split = {p.weight.path: p.spec for p in r.plans}
    assert split["block_0.mlp.gate.kernel"] == ("unsharded", "model")
    assert split["block_0.attention.key.kernel"] == ("unsharded", "model", "unsharded")
    assert r.batch_size == 2 and r.input_shape == (8192,)
    assert any("Megatron" in line for line in r.assumed)
    assert r.published["safetensors"] is None


def test_gpt2_small_has_its_parameters_and_dtclis_padded_rows():
    r = report(GPT2, devices="gpu:1")
    assert r.published["parameters"] == GPT2_PARAMETERS
    padded = 50_304 - 50_257  # rows dtcli's vocabulary rounding adds (a multiple of 64)
    assert r.totals()["parameters"]["replicated"] == (GPT2_PARAMETERS + padded * 768) * 4
    assert r.input_shape == (1024,) and r.batch_size == 1 and r.rules == {}


def test_set_overrides_work_as_for_a_recipe():
    r = report(LLAMA3_8B, "model.transformer.context=2048", "data.batch_size=8", mesh="batch=8")
    assert r.input_shape == (2048,) and r.batch_size == 8 and r.assumed == ()


def test_the_plan_path_never_imports_tensorflow(tmp_path):
    # A fresh process: the table and the verdict without TensorFlow (what keeps it under 5 s).
    code = (
        f"import sys; from dtcli import cli; SHORT = {SHORT!r}; "
        f"code = cli.run(['plan', {str(LLAMA3_8B)!r}, '--devices', 'gpu:8', "
        "'--mesh', 'batch=2,model=4', '--memory', '80GiB', *SHORT]); "
        "print('tensorflow' in sys.modules, code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT
    )
    assert proc.stdout.strip().splitlines()[-1] == "False 0", proc.stderr[-2000:]
    assert "8,030,261,248 parameters" in proc.stdout
    assert re.search(r"fits\s+yes", proc.stdout)


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory) -> dict[str, tuple[Path, int]]:
    """Small GPT-2 and Llama checkpoints saved by transformers, with their parameter counts."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    out = {}
    folder = tmp_path_factory.mktemp("hf")
    configs = {
        "gpt2": (
            GPT2LMHeadModel,
            GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=300),
        ),
        "llama": (
            LlamaForCausalLM,
            LlamaConfig(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                vocab_size=300,
                tie_word_embeddings=False,
            ),
        ),
    }
    for name, (cls, config) in configs.items():
        model = cls(config)
        model.save_pretrained(folder / name)
        out[name] = (folder / name, model.num_parameters())
    return out


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_headers_transformers_wrote_agree_and_count(saved_models, name):
    folder, parameters = saved_models[name]
    model = published_lib.read(str(folder))
    assert model.parameters == parameters  # transformers' own count
    files = model.to_json()["safetensors"]
    assert files["dtypes"] == ["F32"] and files["bytes"] >= parameters * 4


def _copy(saved: Path, tmp_path: Path) -> Path:
    folder = tmp_path / saved.name
    shutil.copytree(saved, folder)
    return folder


def test_a_header_that_disagrees_with_the_config_is_refused(saved_models, tmp_path, cli):
    folder = _copy(saved_models["llama"][0], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 48
    (folder / "config.json").write_text(json.dumps(config))
    result = cli("plan", folder, "--devices", "gpu:1")
    assert result.code == 2
    line = result.err.strip().splitlines()[-1]
    assert line.startswith("error: ") and "'model.layers.0.mlp.down_proj.weight'" in line
    assert "has shape [32, 64]; config.json implies [32, 48]" in line


def test_a_truncated_safetensors_file_is_refused(saved_models, tmp_path):
    folder = _copy(saved_models["gpt2"][0], tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(UsageError, match="truncated"):
        published_lib.read(str(folder))


def test_auto_on_devices_this_machine_lacks_ranks_by_nominal_rates(cli):
    args = ("plan", LLAMA3_8B, "--auto", "--devices", "gpu:8", "--memory", "80GiB", *SHORT)
    result = cli(*args, "--json")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert out["nominal"] is True and "H100" in out["device_kind"]
    assert out["rates"]["meshes"]["8"]["flop_rate"] == 494.7e12  # TF32 dense: float32 training
    fitting = [c for c in out["candidates"] if c["fits"]]
    assert fitting and all(c["bytes_per_device"] <= 80 * 2**30 for c in fitting)
    predicted = [c["predicted_ms"] for c in fitting]
    assert predicted == sorted(predicted)
    # 8.03e9 parameters x 16 B (weights, gradients, 2 Adam slots) do not fit one 80 GiB device
    assert not any(c["fits"] for c in out["candidates"] if c["devices"] == "gpu:1")
    assert any("nominal NVIDIA H100" in line for line in out["published"]["assumed"])
    text = cli(*args)
    assert "494.7 TFLOP/s" in text.out and "not on this machine" in text.out
