"""Peak host memory (RSS) of `dtcli train` on TFRecord data of two sizes: streamed data keeps it
flat as the data set grows.

    python bench/rss.py                    # 0.1 GB and 1 GB of generated TFRecords in /tmp
    python bench/rss.py --sizes 0.1,1 --folder /tmp/dtcli-rss --steps 100

For each size it generates MNIST-shaped TFRecords once (bench/make_tfrecords.py; kept for the
next run), then trains mnist_core_mlp.yaml on them for `--steps` steps (one epoch cut short, a
full evaluation of the 1000 eval examples) in a fresh process, and reads that process's peak RSS
from the kernel (getrusage of the only child). It prints one line per size and the difference,
and last one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "mnist_core_mlp.yaml"

# Runs `dtcli train` as this wrapper's only child and prints the child's peak RSS in KiB.
WRAPPER = (
    "import resource, subprocess, sys; "
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "sys.stderr.write(p.stderr[-2000:] if p.returncode else ''); "
    "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0.1,1", help="comma list of data set sizes in GB")
    ap.add_argument("--folder", type=Path, default=Path("/tmp/dtcli-rss"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--files", type=int, default=16)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "bench"))
    from make_tfrecords import generate

    results = []
    for size in [float(s) for s in args.sizes.split(",")]:
        folder = args.folder / f"{size}gb"
        if not (folder / "eval-00000-of-00001.tfrecord").is_file():
            generate(size, folder, args.files)
        on_disk = sum(p.stat().st_size for p in folder.glob("train*.tfrecord"))
        cmd = [
            sys.executable, "-m", "dtcli.cli", "train", str(RECIPE),
            "--set", "data.source=tfrecord",
            "--set", f"data.path={folder}/train*.tfrecord",
            "--set", f"data.eval_path={folder}/eval-*.tfrecord",
            "--set", f"train.steps_per_epoch={args.steps}",
            "--epochs", "1", "--out", str(args.folder / f"run-{size}gb"), "--no-progress",
        ]  # fmt: skip
        if (args.folder / f"run-{size}gb").exists():
            import shutil

            shutil.rmtree(args.folder / f"run-{size}gb")
        out = subprocess.run(
            [sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=True
        )
        code, kib = (int(v) for v in out.stdout.split())
        if code:
            raise SystemExit(f"dtcli train failed on {folder}: {out.stderr}")
        results.append({"gb_on_disk": on_disk / 1e9, "peak_rss_mb": kib / 1024})
        print(f"{on_disk / 1e9:6.2f} GB of TFRecords: peak RSS {kib / 1024:8.1f} MB", flush=True)
    if len(results) >= 2:
        diff = results[-1]["peak_rss_mb"] - results[0]["peak_rss_mb"]
        print(f"difference: {diff:+.1f} MB (target: less than 150 MB)")
    print(json.dumps(results))


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
