"""lm-eval multiple-choice requests per second on the GPT-2-small shape, one device: dtcli's
harness (what `dtcli eval RUN --tasks` runs) against lm-eval's own `hf` model (PyTorch) on the
same weights, the same requests, the same thread count.

The model: transformers' GPT2Config() (12 layers, 768 wide, 12 heads, GPT-2's 50,257 ids,
1,024 positions), random weights (seed 0) saved with save_pretrained, a byte-level BPE of 8,192
ids trained on --corpus as its tokenizer (bench/import_hf.py's model, kept in --folder), and
`dtcli import-hf` of it. The task: --items multiple-choice items made from --corpus's lines (a
line's first words, its true rest and the rests of 3 other lines: 4 requests an item), written
as a local task YAML over a JSON Lines file.

Each side runs in its own process (TensorFlow and torch never share one), with
TF_NUM_INTRAOP_THREADS / torch.set_num_threads = --threads, and evaluates the task twice on the
same loaded model: the first pass pays dtcli's compile (one lowering per padded shape) and
torch's first-call costs, the second is timed: requests / its wall seconds. dtcli restores the
run on one device as `dtcli eval RUN --tasks ... --mesh batch=1 --devices cpu:1` does
(compiled with XLA) and runs harness.SessionLM at --batch-size rows; lm-eval's HFLM runs
float32 on the CPU at the same batch size. Printed: each side's rates, acc, and the largest gap
between the two sides' per-request log likelihoods (same math: it should be float noise); last,
one JSON line (--json: only that line).

    python bench/lm_eval_speed.py                    # 30 items (120 requests), batch 16
    python bench/lm_eval_speed.py --items 50 --batch-size 32 --threads 2
    python bench/lm_eval_speed.py --quick            # a 2-layer, 64-wide GPT-2: the plumbing

Measured: see docs/benchmarks.md (noisy on a shared 2-core machine: re-measure on a quiet one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
TASK = "bench_mc"
CHOICES = 4
TOKENIZER_IDS = 8192
# The --quick model: the plumbing in seconds, no figure worth reporting.
QUICK = {"n_layer": 2, "n_embd": 64, "n_head": 4}


def make_model(folder: Path, corpus: Path, quick: bool) -> Path:
    """GPT2Config() (or QUICK's shape) with random weights (seed 0) saved by transformers, and a
    byte-level BPE of TOKENIZER_IDS ids trained on `corpus` with a tokenizer_config.json that
    lm-eval's hf model (PreTrainedTokenizerFast) loads; kept for the next run."""
    hf = folder / ("gpt2-quick" if quick else "gpt2-small")
    if (hf / "model.safetensors").is_file():
        return hf
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(**(QUICK if quick else {}))
    AutoModelForCausalLM.from_config(config).save_pretrained(hf)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_IDS,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    tok.save(str(hf / "tokenizer.json"))
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    (hf / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return hf


def mc_items(text: str, count: int) -> list[dict[str, Any]]:
    """`count` items from the text's lines of 6 or more words: the first 3 words as the
    question, CHOICES continuations (the line's own rest at a position that moves with the
    item, the others the rests of the lines after it), each with its leading space."""
    lines = [line.split() for line in text.splitlines() if len(line.split()) >= 6]
    need = count + CHOICES - 1
    if len(lines) < need:
        raise SystemExit(f"--corpus: {len(lines)} lines of 6 or more words; need {need}")
    items = []
    for i in range(count):
        rests = [" " + " ".join(lines[i + k][3:]) for k in range(CHOICES)]
        answer = i % CHOICES
        rests[0], rests[answer] = rests[answer], rests[0]
        items.append({"question": " ".join(lines[i][:3]), "choices": rests, "answer": answer})
    return items


def write_task(folder: Path, items: list[dict[str, Any]]) -> Path:
    """TASK as a local lm-eval task (YAML over an absolute JSON Lines path) in folder/tasks."""
    tasks = folder / "tasks"
    shutil.rmtree(tasks, ignore_errors=True)
    tasks.mkdir(parents=True)
    data = tasks / f"{TASK}.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    (tasks / f"{TASK}.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {json.dumps(str(data))}\noutput_type: multiple_choice\ntest_split: test\n"
        "doc_to_text: question\ndoc_to_choice: choices\ndoc_to_target: answer\n"
        'target_delimiter: ""\nmetric_list:\n  - metric: acc\n'
        "metadata:\n  version: 1.0\n"
    )
    return tasks


def offline_env(folder: Path, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(folder / "hf_home"),
        HF_DATASETS_CACHE=str(folder / "hf_home" / "datasets"),
        TF_NUM_INTRAOP_THREADS=str(threads),
        TF_NUM_INTEROP_THREADS="1",
        OMP_NUM_THREADS=str(threads),
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    return env


def timed_twice(lm: Any, tasks: Path, batch_size: int) -> dict[str, Any]:
    """TASK evaluated twice on `lm` by dtcli's harness.evaluate (simple_evaluate, samples
    logged): the first pass's and the second's wall seconds, acc, each request's log
    likelihood (item by item, choice by choice)."""
    from dtcli import harness

    options = harness.TaskOptions(
        tasks=(TASK,), include_path=str(tasks), batch_size=batch_size, log_samples=True
    )
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        results = harness.evaluate(lm, options)
        seconds.append(time.perf_counter() - start)
    samples = sorted(results["samples"][TASK], key=lambda s: s["doc_id"])
    return {
        "first_seconds": seconds[0],
        "seconds": seconds[1],
        "acc": results["results"][TASK]["acc,none"],
        "loglikelihoods": [[float(r[0]) for r in s["filtered_resps"]] for s in samples],
    }


def dtcli_side(run: Path, tasks: Path, batch_size: int) -> dict[str, Any]:
    """The run restored on one device as `dtcli eval RUN --tasks --mesh batch=1 --devices
    cpu:1` restores it, behind harness.SessionLM."""
    from dtcli import rundir, storage
    from dtcli.harness.model import SessionLM
    from dtcli.recipe import Overrides
    from dtcli.session.restore import restored_session

    def restore(found: Path, held: Path) -> Any:
        recipe = rundir.checkpoint_recipe(held, "eval", Overrides((), "batch=1", "cpu:1"))
        return restored_session(found, held, recipe, "eval", None, "--devices")

    session = rundir.read_checkpoint(storage.as_path(run), restore)
    return timed_twice(SessionLM(session, batch_size), tasks, batch_size)


def hf_side(hf: Path, tasks: Path, batch_size: int, threads: int) -> dict[str, Any]:
    """lm-eval's HFLM on the model folder: float32, CPU, `threads` torch threads."""
    import torch
    from lm_eval.models.huggingface import HFLM

    torch.set_num_threads(threads)
    lm = HFLM(pretrained=str(hf), device="cpu", dtype="float32", batch_size=batch_size)
    return timed_twice(lm, tasks, batch_size)


def side(name: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One side in a fresh process (this script with --side): its JSON line."""
    cmd = [sys.executable, __file__, "--side", name, "--folder", str(folder)]
    cmd += ["--batch-size", str(args.batch_size), "--threads", str(args.threads)]
    cmd += ["--context", str(args.context)]
    cmd += ["--quick"] * args.quick
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=offline_env(folder, args.threads)
    )
    if proc.returncode != 0:
        raise SystemExit(f"the {name} side failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(dtcli: dict[str, Any], hf: dict[str, Any], requests: int, args: Any) -> dict:
    gap = max(
        abs(a - b)
        for mine, theirs in zip(dtcli["loglikelihoods"], hf["loglikelihoods"], strict=True)
        for a, b in zip(mine, theirs, strict=True)
    )
    rows = {}
    for name, got in (("dtcli", dtcli), ("hf", hf)):
        rows[name] = {
            "requests_per_second": round(requests / got["seconds"], 2),
            "seconds": round(got["seconds"], 2),
            "first_pass_seconds": round(got["first_seconds"], 2),
            "acc": got["acc"],
        }
    return {
        "model": "quick" if args.quick else "gpt2-small",
        "requests": requests,
        "context": args.context,
        "batch_size": args.batch_size,
        "threads": args.threads,
        **rows,
        "ratio_dtcli_over_hf": round(hf["seconds"] / dtcli["seconds"], 3),
        "max_loglikelihood_gap": gap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/dtcli-lm-eval-speed")
    parser.add_argument("--corpus", default=str(SHAKESPEARE if SHAKESPEARE.is_file() else __file__))
    parser.add_argument("--items", type=int, default=30, help=f"{CHOICES} requests an item")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--context", type=int, default=128, help="import-hf --context (GPT-2's own: 1024)"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="a 2-layer, 64-wide GPT-2")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--side", choices=["dtcli", "hf"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    folder = Path(args.folder)
    hf = make_model(folder, Path(args.corpus), args.quick)
    run, tasks = folder / f"run-{hf.name}-{args.context}", folder / "tasks"
    if args.side == "dtcli":
        print(json.dumps(dtcli_side(run, tasks, args.batch_size)))
        return
    if args.side == "hf":
        print(json.dumps(hf_side(hf, tasks, args.batch_size, args.threads)))
        return
    items = mc_items(Path(args.corpus).read_text(), args.items)
    write_task(folder, items)
    if not (run / "recipe.yaml").is_file():
        shutil.rmtree(run, ignore_errors=True)
        cmd = [sys.executable, "-m", "dtcli.cli", "import-hf", str(hf), "--out", str(run)]
        cmd += ["--context", str(args.context), "--mesh", "batch=1", "--devices", "cpu:1"]
        subprocess.run(cmd, check=True, env=offline_env(folder, args.threads))
    mine, theirs = side("dtcli", args, folder), side("hf", args, folder)
    result = report(mine, theirs, CHOICES * args.items, args)
    if not args.json:
        for name in ("dtcli", "hf"):
            row = result[name]
            print(
                f"{name:>5}: {row['requests_per_second']:8.2f} requests/s ({result['requests']} "
                f"in {row['seconds']} s; first pass {row['first_pass_seconds']} s), acc "
                f"{row['acc']:.3f}"
            )
        print(f"largest log-likelihood gap between the two: {result['max_loglikelihood_gap']:.2e}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
