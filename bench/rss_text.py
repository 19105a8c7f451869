"""Peak host memory (RSS) of `dtcli prepare-text` and of `dtcli train` from its token shards, on
generated text corpora of two sizes: both stream, so their peaks stay flat as the corpus grows.

    python bench/rss_text.py                       # 10 MB and 100 MB in /tmp/dtcli-rss-text
    python bench/rss_text.py --sizes 10,100 --tokenizer bpe:1024 --steps 100

For each size (MB) it generates a corpus once (files of up to 10 MB of seeded Zipf-distributed
words in lines and paragraphs: a text a BPE finds merges in; kept for the next run), then in
fresh processes runs prepare-text on it and trains recipes/tiny_gpt.yaml for `--steps` steps
from the shards (one evaluation of the eval shards at the end), reading each process's peak RSS
from the kernel (bench/rss.py's wrapper). It prints a line per size and step, the differences,
and last one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "tiny_gpt.yaml"
FILE_MB = 10
sys.path.insert(0, str(ROOT / "bench"))
from rss import WRAPPER  # noqa: E402 - bench/ is not a package


def words(rng: np.random.Generator, count: int = 20_000) -> np.ndarray:
    """`count` made-up words of 1 to 4 syllables."""
    syllables = [a + b for a in "bcdfghklmnprstvw" for b in ("a", "e", "i", "o", "u", "ou", "ea")]
    lengths = rng.integers(1, 5, count)
    return np.array(["".join(rng.choice(syllables, n)) for n in lengths])


def generate(folder: Path, megabytes: int, seed: int = 0) -> None:
    """`megabytes` MB of text in files of FILE_MB, written a paragraph at a time."""
    rng = np.random.default_rng(seed)
    vocab = words(rng)
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()
    folder.mkdir(parents=True, exist_ok=True)
    left = megabytes * 1_000_000
    for i in range(-(-megabytes // FILE_MB)):
        target = min(left, FILE_MB * 1_000_000)
        with open(folder / f"doc-{i:03d}.txt", "w") as f:
            written = 0
            while written < target:  # 100 paragraphs of 50 lines of 12 words at a time
                picks = vocab[rng.choice(len(vocab), 60_000, p=zipf)]
                lines = [
                    " ".join(picks[j : j + 12]).capitalize() + "." for j in range(0, 60_000, 12)
                ]
                text = "".join("\n".join(lines[k : k + 50]) + "\n\n" for k in range(0, 5000, 50))
                written += f.write(text[: target - written])
        left -= written


def peak(cmd: list[str]) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of `cmd` run as the wrapper's only child."""
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=True
    )
    code, kib = (int(v) for v in out.stdout.split())
    if code:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr}")
    return kib / 1024, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,100", help="comma list of corpus sizes in MB")
    ap.add_argument("--folder", type=Path, default=Path("/tmp/dtcli-rss-text"))
    ap.add_argument("--tokenizer", default="bpe:1024")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-fraction", default="0.01")
    args = ap.parse_args()
    dtcli = [sys.executable, "-m", "dtcli.cli"]
    results = []
    for size in [int(s) for s in args.sizes.split(",")]:
        corpus = args.folder / f"text-{size}mb"
        if not (corpus / "done").is_file():
            generate(corpus, size)
            (corpus / "done").write_text("")
        shards, run = args.folder / f"shards-{size}mb", args.folder / f"run-{size}mb"
        for old in (shards, run):
            shutil.rmtree(old, ignore_errors=True)
        prepare_mb, prepare_s = peak(
            [*dtcli, "prepare-text", f"{corpus}/*.txt", "--tokenizer", args.tokenizer,
             "--eval-fraction", args.eval_fraction, "--out", str(shards)]
        )  # fmt: skip
        train_mb, train_s = peak(
            [*dtcli, "train", str(RECIPE), "--set", "data.source=tokens",
             "--set", f"data.path={shards}", "--set", f"train.steps={args.steps}",
             "--set", f"optimizer.warmup_steps={args.steps // 10}", "--out", str(run),
             "--no-progress"]
        )  # fmt: skip
        index = json.loads((shards / "index.json").read_text())
        train = index["splits"]["train"]
        results.append(
            {
                "corpus_mb": size,
                "train_tokens": train["tokens"],
                "shards": len(train["shards"]),
                "prepare_peak_rss_mb": prepare_mb,
                "prepare_seconds": prepare_s,
                "train_peak_rss_mb": train_mb,
                "train_seconds": train_s,
            }
        )
        print(
            f"{size:5d} MB of text ({train['tokens']:,} train tokens in {len(train['shards'])} "
            f"shards): prepare-text peak RSS {prepare_mb:7.1f} MB ({prepare_s:.0f} s), train "
            f"{train_mb:7.1f} MB ({train_s:.0f} s)",
            flush=True,
        )
    if len(results) >= 2:
        for key in ("prepare_peak_rss_mb", "train_peak_rss_mb"):
            diff = results[-1][key] - results[0][key]
            print(f"{key}: {diff:+.1f} MB from the smallest corpus to the largest")
    print(json.dumps(results))


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
