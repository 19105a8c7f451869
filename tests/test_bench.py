"""The benchmarks' own parts that decide what they compare: bench/nanogpt.py gives nanoGPT the
text it claims (its characters, or dtcli's bytes for the same-arithmetic row) and counts FLOPs
with dtcli's formula. Their timings are run by hand (docs/benchmarks.md), never by a test."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
from conftest import _bench_script

nanogpt = _bench_script("nanogpt")
variants = _bench_script("variants")
lm_eval_speed = _bench_script("lm_eval_speed")


def read_ids(folder) -> np.ndarray:
    parts = [np.fromfile(folder / f"{split}.bin", dtype=np.uint16) for split in ("train", "val")]
    return np.concatenate(parts)


def test_nanogpt_reads_the_text_as_its_characters_and_as_dtclis_bytes(tmp_path):
    text = tmp_path / "input.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 3)
    peer = tmp_path / "peer"
    peer.mkdir()
    script = (
        "# nanoGPT's script\nctx = nullcontext() if device_type == 'cpu' else "
        "torch.amp.autocast(device_type=device_type, dtype=ptdtype)\n"
    )
    (peer / "train.py").write_text(script)

    repo = nanogpt.prepare_nanogpt(tmp_path / "work", text, peer)

    assert (repo / "train.py").read_text() == script
    # The bf16 row's copy: the CPU autocasts too, and nothing else changed.
    assert (repo / nanogpt.CPU_AUTOCAST).read_text() == script.replace(
        "nullcontext() if device_type == 'cpu' else ", ""
    )
    chars = repo / "data" / "shakespeare_char"
    meta = pickle.loads((chars / "meta.pkl").read_bytes())
    assert meta["vocab_size"] == len(set(text.read_text()))
    assert "".join(meta["itos"][int(i)] for i in read_ids(chars)) == text.read_text()
    bytes_ = repo / "data" / "shakespeare_bytes"
    assert pickle.loads((bytes_ / "meta.pkl").read_bytes())["vocab_size"] == 256
    np.testing.assert_array_equal(read_ids(bytes_), np.frombuffer(text.read_bytes(), np.uint8))
    # --vocab gpt2: the same byte ids under a head as wide as GPT-2's.
    gpt2 = repo / "data" / "shakespeare_gpt2"
    assert pickle.loads((gpt2 / "meta.pkl").read_bytes())["vocab_size"] == 50304
    np.testing.assert_array_equal(read_ids(gpt2), read_ids(bytes_))
    # The same 90/10 cut for both.
    cut = int(0.9 * len(text.read_bytes()))
    assert np.fromfile(bytes_ / "train.bin", dtype=np.uint16).size == cut
    assert np.fromfile(chars / "train.bin", dtype=np.uint16).size == cut


def test_the_byte_row_runs_only_when_asked():
    assert nanogpt.BYTE_ROW not in nanogpt.row_names(nanogpt.CPU, no_compile_row=False)
    assert nanogpt.row_names(nanogpt.CPU, True, byte_row=True) == [
        "nanoGPT",
        "dtcli",
        nanogpt.BYTE_ROW,
    ]


def test_another_nanogpt_without_the_cpu_line_is_refused_not_benchmarked_unchanged(tmp_path):
    text = tmp_path / "input.txt"
    text.write_text("some text\n")
    peer = tmp_path / "peer"
    peer.mkdir()
    (peer / "train.py").write_text("ctx = nullcontext()\n")
    with pytest.raises(SystemExit, match="no line"):
        nanogpt.prepare_nanogpt(tmp_path / "work", text, peer)


def test_the_bf16_rows_run_only_when_asked_and_each_run_gets_its_cores(tmp_path):
    assert nanogpt.row_names(nanogpt.CPU, True, bf16_rows=True) == [
        "nanoGPT",
        "dtcli",
        *nanogpt.BF16_ROWS,
    ]
    env = nanogpt.thread_env(1, tmp_path)
    assert env["OMP_NUM_THREADS"] == "1" and "TF_NUM_INTRAOP_THREADS" not in env
    assert nanogpt.cores(None) is None
    probe = "import os; print(len(os.sched_getaffinity(0)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, preexec_fn=nanogpt.cores(1)
    )
    assert done.stdout.strip() == "1"


def test_flops_per_token_is_nanogpts_estimate():
    # nanoGPT's estimate_mfu: 6 N + 12 L H Q T per token, N its parameters less the position
    # embedding (the tied head counted once), bias-free blocks and LayerNorms.
    layers, width, context, vocab = 6, 384, 256, 65
    params = vocab * width + layers * (12 * width * width + 2 * width) + width
    want = 6 * params + 12 * layers * width * context
    assert nanogpt.flops_per_token(nanogpt.GPU, width, vocab) == want


def test_variants_count_the_runs_that_trained_and_give_each_its_environment():
    """A reliability question (do bf16 XLA steps go NaN on a GPU?) is a count over repeats: a
    failed run is one of a variant's runs, not the end of the benchmark, and --env reaches only
    its variant."""
    parsed = variants.parse_variants(
        ["default:", "tuned:train.precision=bf16,data.batch_size=8"],
        ["tuned:XLA_FLAGS=--xla_gpu_autotune_level=0 --xla_dump_to=/tmp/x"],
    )
    assert parsed == [
        ("default", [], {}),
        (
            "tuned",
            ["train.precision=bf16", "data.batch_size=8"],
            {"XLA_FLAGS": "--xla_gpu_autotune_level=0 --xla_dump_to=/tmp/x"},
        ),
    ]
    for bad, why in [
        ("nobody:A=1", "no --variant is named 'nobody'"),
        ("tuned:A", "expected NAME:VAR=VALUE"),
        ("tuned:=1", "expected NAME:VAR=VALUE"),
        ("A=1", "expected NAME:VAR=VALUE"),
    ]:
        with pytest.raises(ValueError, match=why):
            variants.parse_variants(["tuned:"], [bad])
    with pytest.raises(ValueError, match="--variant 'a:x=1': expected a NAME no other variant"):
        variants.parse_variants(["a:", "a:x=1"], [])

    ok = {"s_per_step": 0.01, "tokens_per_sec": 100.0, "compile_seconds": 2.0, "eval_loss": 2.5}
    runs = [
        ok,
        {"error": "exit 1: error: non-finite training loss (nan)"},
        {**ok, "eval_loss": 2.7},
    ]
    summary = variants.summarize(runs)
    assert summary["trained"] == "2/3" and summary["eval_loss"] == pytest.approx(2.6)
    assert summary["errors"] == ["exit 1: error: non-finite training loss (nan)"]
    assert variants.summarize([runs[1]])["s_per_step"] is None
    classifier = {**ok, "tokens_per_sec": None}  # no tokens: no rate, and no error either
    assert variants.summarize([classifier, classifier])["tokens_per_sec"] is None


def test_a_python_without_torch_and_an_endless_timeout_are_refused_before_any_run(
    tmp_path, monkeypatch
):
    """Each nanoGPT row needs torch: a Python without it is refused up front (exit 2), not
    after the dtcli rows ran with a traceback per nanoGPT row; NaN or infinite seconds too."""
    no_torch = tmp_path / "python"
    no_torch.write_text(f"#!/bin/sh\nexec {sys.executable} -S -c 'import torch_is_not_here'\n")
    no_torch.chmod(0o755)
    assert not nanogpt.has_torch(str(no_torch))
    assert not nanogpt.has_torch(str(tmp_path / "nowhere"))
    for argv, said in (
        (["--torch-python", str(no_torch)], "--torch-python: "),
        (["--timeout", "nan"], "--timeout: seconds above 0"),
        (["--timeout", "inf"], "--timeout: seconds above 0"),
    ):
        proc = subprocess.run(
            [sys.executable, nanogpt.__file__, *argv], capture_output=True, text=True
        )
        assert proc.returncode == 2 and said in proc.stderr.splitlines()[-1], proc.stderr


def test_import_hf_verdict_is_the_extra_memory_over_the_checkpoint():
    bench = _bench_script("import_hf")
    # 1 GiB checkpoint; the import peaks 1.25 GiB above the built model: within 1.3x.
    row = bench.verdict(import_kib=3 * 2**20 + 2**18, built_kib=2 * 2**20, checkpoint_bytes=2**30)
    assert row == {"extra_bytes": 2**30 + 2**28, "ratio": 1.25, "within": True}
    assert not bench.verdict(4 * 2**20, 2 * 2**20, 2**30)["within"]


sft_lora = _bench_script("sft_lora")


def test_sft_exact_match_compares_each_answer_stripped_with_its_own_response():
    references = [{"prompt": "Uppercase: ab", "response": "AB"}, {"prompt": "x", "response": "C"}]
    answers = [{"text": " AB"}, {"text": " AB"}]  # the second is another prompt's answer
    assert sft_lora.exact_match(answers, references) == 0.5
    assert sft_lora.exact_match([{"text": " AB\n"}, {"text": "C"}], references) == 1.0
    with pytest.raises(ValueError, match="1 answers for 2 references"):
        sft_lora.exact_match(answers[:1], references)


def test_sft_training_figures_sum_the_records_and_read_trains_done_line():
    records = [
        {"step": 500, "train_tokens": 300, "seconds": 2.0},
        {"step": 1000, "train_tokens": 900, "seconds": 1.0},
    ]
    log = "step 1000/1000 loss 1.7\ndone: 1,000 steps (42.5 s training in this process); eval..."
    figures = sft_lora.training_figures(records, log, window_tokens=16 * 64)
    assert figures == {
        "steps": 1000,
        "train_seconds": 42.5,
        "tokens_per_sec": 400.0,
        "window_tokens_per_sec": 1000 * 16 * 64 / 3.0,
    }
    with pytest.raises(ValueError, match="no 'done:"):
        sft_lora.training_figures(records, "step 10/10 loss 1.0\n", 1)


def test_sft_trainable_parameters_count_the_weights_that_train():
    plan = {
        "weights": [
            {"shape": [320, 128], "trainable": False},
            {"shape": [128, 16], "trainable": True},
            {"shape": [16, 4, 32], "trainable": True},
        ]
    }
    assert sft_lora.trainable_parameters(plan) == 128 * 16 + 16 * 4 * 32


def test_lm_eval_speed_items_ask_each_lines_own_rest_among_three_others():
    """bench/lm_eval_speed.py's task: a line's first 3 words, its own rest at an answer
    position that moves, the next 3 lines' rests as the wrong choices; short lines skipped."""
    rows = [f"w{i} x{i} y{i} a{i} b{i} c{i}" for i in range(10)]
    items = lm_eval_speed.mc_items("\n".join(["too short", *rows]), 5)
    assert len(items) == 5
    for i, item in enumerate(items):
        assert item["question"] == f"w{i} x{i} y{i}"
        assert item["choices"][item["answer"]] == f" a{i} b{i} c{i}"
        assert sorted(item["choices"]) == sorted(f" a{k} b{k} c{k}" for k in range(i, i + 4))
    assert [item["answer"] for item in items] == [0, 1, 2, 3, 0]
    with pytest.raises(SystemExit, match="need"):
        lm_eval_speed.mc_items("\n".join(rows), 8)
