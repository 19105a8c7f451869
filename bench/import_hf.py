"""Time and peak host memory (RSS) of `dtcli import-hf` on a GPT-2-small-shaped model
(transformers' GPT2Config() defaults, 124 M parameters, random weights saved by transformers).

    python bench/import_hf.py                              # 1 device and batch=2,model=4 on cpu:8
    python bench/import_hf.py --folder /tmp/dtcli-import-hf --meshes batch=1

It saves the model once (kept in --folder for the next run), then for each mesh runs two fresh
processes and reads each one's peak RSS from the kernel (getrusage of its only child):
  - `built`: the imported run's model built on that mesh and its checkpoint restored (what any
    command that holds the model pays);
  - `import`: `dtcli import-hf` itself, wall time included.
The verdict compares the import's extra memory (import - built) with the checkpoint's size
(model.safetensors): at most 1.3x means no second copy of the model on the host. The
batch=2,model=4 run shards the heads and the MLP (Megatron rules) so that no virtual device holds
a full copy. One line per mesh, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 1.3
MEGATRON = (
    "layouts.rules={'attention\\.(query|key|value)\\.kernel': [unsharded, model, unsharded], "
    "'attention\\.proj\\.kernel': [model, unsharded, unsharded], 'mlp\\.fc\\.kernel': "
    "[unsharded, model], 'mlp\\.proj\\.kernel': [model, unsharded]}"
)
# Runs argv as this wrapper's only child and prints the child's peak RSS in KiB.
WRAPPER = (
    "import resource, subprocess, sys; "
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "sys.stderr.write(p.stderr[-2000:] if p.returncode else ''); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if p.returncode == 0 else -1)"
)
# Builds an imported run's model on a mesh and restores its checkpoint: the model's own RSS.
BUILT = """
import sys
from pathlib import Path
from dtcli import checkpoint as ckpt_lib, session as session_lib
from dtcli.recipe import Overrides
from dtcli.rundir import checkpoint_recipe, tokenizer_file
run, mesh, devices, sets = Path(sys.argv[1]), sys.argv[2], sys.argv[3], tuple(sys.argv[4:])
ckpt = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
recipe = checkpoint_recipe(ckpt, "generate", Overrides(sets, mesh, devices))
s = session_lib.prepare(recipe, splits=(), tokenizer_file=tokenizer_file(ckpt), command="generate")
saver = ckpt_lib.Checkpointer(ckpt.parent, {"model": s.model.module}, 1)
saver.restore(ckpt, s.model.weights, partial=True)
"""


def verdict(import_kib: int, built_kib: int, checkpoint_bytes: int) -> dict:
    """The import's extra memory over the built model, against the checkpoint's size."""
    extra = (import_kib - built_kib) * 1024
    ratio = extra / checkpoint_bytes
    return {"extra_bytes": extra, "ratio": round(ratio, 3), "within": ratio <= LIMIT}


def _peak(argv: list[str]) -> int:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True)
    if out.returncode or out.stdout.strip() == "-1":
        raise SystemExit(f"failed: {' '.join(argv)}\n{out.stderr}")
    return int(out.stdout.strip())


def make_model(folder: Path) -> Path:
    """GPT2Config() with random weights and GPT-2's byte-level BPE shape of tokenizer."""
    hf = folder / "gpt2-small"
    if (hf / "model.safetensors").is_file():
        return hf
    sys.path.insert(0, str(ROOT / "tests"))
    import hf_models
    from transformers import AutoModelForCausalLM, GPT2Config

    AutoModelForCausalLM.from_config(GPT2Config()).save_pretrained(hf)
    hf_models.tokenizer_json(hf)
    return hf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/dtcli-import-hf")
    parser.add_argument("--meshes", default="batch=1,batch=2+model=4")
    args = parser.parse_args()
    folder = Path(args.folder)
    hf = make_model(folder)
    size = (hf / "model.safetensors").stat().st_size
    rows = []
    for mesh in args.meshes.split(","):
        mesh = mesh.replace("+", ",")
        devices = "cpu:1" if mesh == "batch=1" else "cpu:8"
        sets = [] if mesh == "batch=1" else ["--set", MEGATRON]
        run = folder / f"run-{mesh.replace(',', '-').replace('=', '')}"
        shutil.rmtree(run, ignore_errors=True)
        cmd = [sys.executable, "-m", "dtcli.cli", "import-hf", str(hf), "--out", str(run)]
        start = time.perf_counter()
        imported = _peak([*cmd, "--mesh", mesh, "--devices", devices, *sets, "--no-progress"])
        seconds = time.perf_counter() - start
        built = _peak([sys.executable, "-c", BUILT, str(run), mesh, devices, *sets[1:]])
        row = {
            "mesh": mesh,
            "seconds": round(seconds, 1),
            "import_kib": imported,
            "built_kib": built,
            **verdict(imported, built, size),
        }
        print(
            f"{mesh}: {seconds:.1f} s, peak {imported / 2**20:.2f} GiB, model built "
            f"{built / 2**20:.2f} GiB, extra {row['ratio']}x the checkpoint"
        )
        rows.append(row)
    print(json.dumps({"checkpoint_bytes": size, "runs": rows}))


if __name__ == "__main__":
    main()
