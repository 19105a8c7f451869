"""The base, LoRA and full fine-tuning on recipes/sft_lora.yaml's instructions, side by side.

    python bench/sft_lora.py --base runs/tiny_gpt [--data data/sft] [--out runs/sft_bench]
        [--steps N] [--full-learning-rate 1e-3]

--base: tiny_gpt pretrained with an end-of-text token (recipes/sft_lora.yaml's header says how:
prepare-text's shards). The examples are recipes/sft_data.py's, written into --data where it
holds none. LoRA (the recipe as it is) and full fine-tuning (the recipe with lora: null, its
learning rate --full-learning-rate decaying to a tenth of it) train the same steps (the
recipe's, or --steps) on the same examples in the same order, each in a fresh `dtcli train`.
Then the base and both runs are measured by dtcli's own commands:
  - eval_loss: the held-out response loss, nats a token (`dtcli eval RUN --json`; the base's
    checkpoint evaluated on the instruction data through --set data.*: the same template,
    windows and masked prompts);
  - exact_match: greedy `dtcli generate RUN --chat --prompts eval.jsonl --json` (the base with
    the same --set data.*: the recipe's plain template), an answer exact when its text, spaces
    stripped, is the response; stopped: the answers that ended at the end of turn;
  - steps, train_seconds (train's `done:` line: the steps with their evaluations and
    checkpoints, not the start-up), wall_seconds (the whole `dtcli train` process),
    tokens_per_sec (the loss's tokens, the responses, as train counts them, over
    metrics.jsonl's records) and window_tokens_per_sec (every token of the windows the model
    reads: batch x context a step), trainable_parameters (`dtcli plan --json`: the weights that
    train).
Prints one JSON object ({"base", "lora", "full", "steps", "machine"}) on stdout, a table on
stderr. About 5 minutes on 2 cores for 1,000 steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "sft_lora.yaml"
# Long enough for the longest answer (7 letters, the space before it, the end of turn).
ANSWER_TOKENS = 16
DONE = re.compile(r"^done: ([\d,]+) steps \(([\d.]+) s training in this process\)", re.M)


def exact_match(answers: list[dict], references: list[dict]) -> float:
    """The fraction of answers (generate --json's objects) whose text, stripped of spaces, is
    the reference's response; the two lists in the same order."""
    if len(answers) != len(references):
        raise ValueError(f"{len(answers)} answers for {len(references)} references")
    hits = sum(a["text"].strip() == r["response"] for a, r in zip(answers, references))
    return hits / len(references)


def training_figures(records: list[dict], log: str, window_tokens: int) -> dict:
    """A run's steps, its training seconds (train's `done:` line) and its tokens a second over
    metrics.jsonl's records (each record's steps in its seconds): the loss's tokens (the
    responses: train_tokens), and the windows' (`window_tokens` a step: batch x context, what
    the model reads)."""
    found = DONE.search(log)
    if found is None:
        raise ValueError("no 'done: N steps (S s training in this process)' line in the log")
    tokens = sum(r["train_tokens"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    steps = records[-1]["step"] if records else 0
    return {
        "steps": int(found.group(1).replace(",", "")),
        "train_seconds": float(found.group(2)),
        "tokens_per_sec": tokens / seconds if seconds > 0 else math.nan,
        "window_tokens_per_sec": steps * window_tokens / seconds if seconds > 0 else math.nan,
    }


def trainable_parameters(plan: dict) -> int:
    """The parameters of `dtcli plan --json`'s weights that train."""
    return sum(math.prod(w["shape"]) for w in plan["weights"] if w.get("trainable", True))


def table(results: dict) -> str:
    """The three rows side by side, as the docs show them."""
    head = (
        f"{'':6} {'exact':>6} {'eval loss':>9} {'steps':>6} {'train s':>8} {'tok/s':>7} "
        f"{'window tok/s':>12} {'trainable':>10}"
    )
    lines = [head]
    for name in ("base", "lora", "full"):
        r = results[name]
        lines.append(
            f"{name:6} {r['exact_match']:6.1%} {r['eval_loss']:9.4f} {r.get('steps', 0):6} "
            f"{r.get('train_seconds', 0):8.1f} {r.get('tokens_per_sec', 0):7.0f} "
            f"{r.get('window_tokens_per_sec', 0):12.0f} {r['trainable_parameters']:10,}"
        )
    return "\n".join(lines)


def dtcli(*args: object) -> tuple[str, float]:
    """`dtcli ARGS` in a fresh process -> (stdout, wall seconds); a failure stops the bench."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "dtcli.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        sys.exit(f"dtcli {' '.join(map(str, args[:2]))} failed:\n{proc.stderr}")
    return proc.stdout, time.perf_counter() - start


def sets(assignments: dict) -> list[str]:
    return [a for key, value in assignments.items() for a in ("--set", f"{key}={value}")]


def measure(run: Path, data: Path, extra: list[str]) -> dict:
    """eval_loss, exact_match and stopped of a run (`extra`: generate's and eval's options)."""
    out, _ = dtcli("eval", run, "--json", "--no-progress", *extra)
    loss = json.loads(out.strip().splitlines()[-1])["loss"]
    prompts = data / "eval.jsonl"
    ask = ("--chat", "--prompts", prompts, "--json", "--temperature", "0")
    out, _ = dtcli("generate", run, *ask, "--tokens", ANSWER_TOKENS, "--no-progress", *extra)
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    references = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    return {
        "eval_loss": loss,
        "exact_match": exact_match(answers, references),
        "stopped": sum(a["stopped"] for a in answers) / len(answers),
    }


def fine_tune(name: str, out: Path, common: dict, own: dict) -> dict:
    """One run of the recipe (LoRA, or full with `own`'s keys), measured."""
    run = out / name
    assignments = {**common, **own}
    plan, _ = dtcli("plan", RECIPE, *sets(assignments), "--json")
    _, wall = dtcli("train", RECIPE, *sets(assignments), "--out", run, "--no-progress")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    batch = json.loads(plan)["batch"]["global_shape"]  # [batch, context] ([batch, 3, context])
    window = batch[0] * batch[-1]
    figures = training_figures(records, (run / "train.log").read_text(), window)
    trainable = trainable_parameters(json.loads(plan))
    return {**figures, "wall_seconds": wall, "trainable_parameters": trainable, "run": str(run)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="tiny_gpt pretrained with EOT")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "sft")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "sft_bench")
    parser.add_argument("--steps", type=int, help="default: the recipe's train.steps")
    parser.add_argument("--full-learning-rate", type=float, default=1e-3)
    args = parser.parse_args()
    base, data, out = args.base.resolve(), args.data.resolve(), args.out.resolve()
    if not (data / "eval.jsonl").is_file():
        subprocess.run([sys.executable, ROOT / "recipes" / "sft_data.py", data], check=True)
    common = {
        "model.from_run": base,
        "data.path": data / "train.jsonl",
        "data.eval_path": data / "eval.jsonl",
    }
    if args.steps:
        common.update({"train.steps": args.steps, "train.eval_every": min(250, args.steps)})
    full = {
        "lora": "null",
        "optimizer.learning_rate": args.full_learning_rate,
        "optimizer.min_learning_rate": args.full_learning_rate / 10,
    }
    results = {"lora": fine_tune("lora", out, common, {})}
    results["full"] = fine_tune("full", out, common, full)
    instructions = {
        "data.source": "jsonl",
        "data.path": data / "train.jsonl",
        "data.eval_path": data / "eval.jsonl",
        "data.chat_template": "plain",
        "data.batch_size": 16,
        "data.eval_batch_size": 40,
    }
    # The base's own recipe reads its shards: --set makes it one of instruction data.
    results["base"] = {**measure(base, data, sets(instructions)), "trainable_parameters": 0}
    for name in ("lora", "full"):
        results[name].update(measure(Path(results[name]["run"]), data, []))
    results.update(steps=results["lora"]["steps"], machine=_machine())
    print(table(results), file=sys.stderr)
    print(json.dumps(results))


def _machine() -> dict:
    from dtcli import cpuinfo

    return {"cpu": cpuinfo.model_name(), "cores": os.cpu_count(), "platform": platform.platform()}


if __name__ == "__main__":
    main()
