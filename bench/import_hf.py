"""Time and peak host memory (RSS) of `dtcli import-hf` on a GPT-2-small-shaped model
(transformers' GPT2Config() defaults, 124 M parameters, random weights saved by transformers).

    python bench/import_hf.py                              # 1 device and batch=2,model=4 on cpu:8
    python bench/import_hf.py --folder /tmp/dtcli-import-hf --meshes batch=1
    python bench/import_hf.py --score ../shared/data/tinyshakespeare/input.txt

The model's tokenizer is a byte-level BPE of 8,192 ids trained on --corpus (tiny Shakespeare
where ../shared has it) when the model is made.

It saves the model once (kept in --folder for the next run), then for each mesh runs two fresh
processes:
  - `import`: `dtcli import-hf` itself, its wall time and its peak RSS (getrusage of the
    wrapper's only child);
  - `built`: the model the import fills, built on that mesh as the import builds it
    (import_hf.build_target) and every weight written with zeros as the import writes them
    (TensorFlow started, each device's shards resident, no file read): its RSS then (VmRSS).
The verdict compares the import's extra memory (import peak - built) with the checkpoint's size
(model.safetensors): at most 1.3x means no second copy of the model on the host. The
batch=2,model=4 run shards the heads, the MLP and the embeddings' feature dim over `model`
(Megatron rules) so that no virtual device holds a full copy of a large weight. One line per
mesh, then one JSON line. With --score FILE, the batch=1 import also scores FILE's first
--score-bytes bytes (within one context: transformers scores them in one pass) with
`dtcli score --json` on batch=2,model=4 over cpu:8 against transformers' log probabilities of
the same tokens, and exports the run (`export --format hf`) for transformers to load back: the
largest gap of each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
LIMIT = 1.3
# Megatron's tensor parallelism over `model`, the embeddings split on their feature dim: no
# virtual device holds a full copy of any large weight (the rules' paths: docs/language-models.md).
MEGATRON = (
    "layouts.rules={'block_\\d+\\.attention\\.(query|key|value)\\.kernel': "
    "[unsharded, model, unsharded], 'block_\\d+\\.attention\\.proj\\.kernel': "
    "[model, unsharded, unsharded], 'block_\\d+\\.mlp\\.fc\\.kernel': [unsharded, model], "
    "'block_\\d+\\.mlp\\.proj\\.kernel': [model, unsharded], "
    "'(token|position)_embedding\\.embeddings': [unsharded, model]}"
)
# Runs argv as this wrapper's only child and prints the child's peak RSS in KiB.
WRAPPER = (
    "import resource, subprocess, sys; "
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "sys.stderr.write(p.stderr[-2000:] if p.returncode else ''); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if p.returncode == 0 else -1)"
)
# Builds the model an import fills on a mesh as the import builds it, sets every weight to
# zeros one at a time as the import sets them (a variable built on a mesh is not resident until
# it is written), and prints the RSS in KiB.
BUILT = """
import sys
from pathlib import Path
import numpy as np
from dtcli import import_hf, models, recipe as recipe_lib
from dtcli.recipe import Overrides
run, mesh, devices, sets = Path(sys.argv[1]), sys.argv[2], sys.argv[3], tuple(sys.argv[4:])
recipe = recipe_lib.load(run / "recipe.yaml", Overrides(sets, mesh, devices), command="export")
target = import_hf.build_target(recipe, run / "tokenizer.json", "--devices")
for weight in target.built.weights:
    var = target.built.variables[weight.path]
    var.assign(models.place(np.zeros(weight.shape, np.float32), var, target.mesh))
status = Path("/proc/self/status").read_text().splitlines()
print(next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")))
"""


def verdict(import_kib: int, built_kib: int, checkpoint_bytes: int) -> dict:
    """The import's extra memory over the built model, against the checkpoint's size."""
    extra = (import_kib - built_kib) * 1024
    ratio = extra / checkpoint_bytes
    return {"extra_bytes": extra, "ratio": round(ratio, 3), "within": ratio <= LIMIT}


def _built(argv: list[str]) -> int:
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(argv)}\n{out.stderr[-2000:]}")
    return int(out.stdout.strip().splitlines()[-1])


def _peak(argv: list[str]) -> int:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True)
    if out.returncode or out.stdout.strip() == "-1":
        raise SystemExit(f"failed: {' '.join(argv)}\n{out.stderr}")
    return int(out.stdout.strip())


def make_model(folder: Path, corpus: Path) -> Path:
    """GPT2Config() with random weights (seed 0), and a byte-level BPE of 8,192 ids trained on
    `corpus` (GPT-2's kind of tokenizer, smaller)."""
    hf = folder / "gpt2-small"
    if (hf / "model.safetensors").is_file():
        return hf
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(GPT2Config()).save_pretrained(hf)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()),
        show_progress=False,
    )
    tok.train([str(corpus)], trainer)
    tok.save(str(hf / "tokenizer.json"))
    return hf


def score_check(hf: Path, run: Path, text_file: Path, size: int, folder: Path) -> dict:
    """`dtcli score --json` of `run` on batch=2,model=4 (cpu:8) against transformers on the
    same tokens; then the run exported and loaded back by transformers: the largest gaps."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    text = folder / "score.txt"
    text.write_bytes(text_file.read_bytes()[:size])
    cmd = [sys.executable, "-m", "dtcli.cli", "score", str(run), "--file", str(text), "--json"]
    start = time.perf_counter()
    out = subprocess.run(
        [*cmd, "--mesh", "batch=2,model=4", "--devices", "cpu:8", "--no-progress"],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"score failed:\n{out.stderr[-2000:]}")
    got = json.loads(out.stdout)
    ids = torch.tensor([got["tokens"]])

    def logprobs(model: Any) -> np.ndarray:
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits.double(), -1)[0, :-1]
        return logp.gather(-1, ids[0, 1:, None])[:, 0].numpy()

    want = logprobs(AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval())
    exported = folder / "export"
    shutil.rmtree(exported, ignore_errors=True)
    cmd = [sys.executable, "-m", "dtcli.cli", "export", str(run), "--format", "hf"]
    subprocess.run([*cmd, "--out", str(exported)], check=True, capture_output=True)
    back = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    return {
        "score_tokens": got["count"] + 1,
        "score_seconds": round(seconds, 1),
        "score_max_gap": float(np.abs(np.array(got["logprobs"]) - want).max()),
        "export_max_gap": float(np.abs(logprobs(back) - want).max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/dtcli-import-hf")
    parser.add_argument("--meshes", default="batch=1,batch=2+model=4")
    parser.add_argument("--corpus", default=str(SHAKESPEARE if SHAKESPEARE.is_file() else __file__))
    parser.add_argument("--score", default=None, help="a text file to score (see above)")
    parser.add_argument("--score-bytes", type=int, default=2000)
    args = parser.parse_args()
    folder = Path(args.folder)
    hf = make_model(folder, Path(args.corpus))
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
        built = _built([sys.executable, "-c", BUILT, str(run), mesh, devices, *sets[1:]])
        row = {
            "mesh": mesh,
            "seconds": round(seconds, 1),
            "import_kib": imported,
            "built_kib": built,
            **verdict(imported, built, size),
        }
        print(
            f"{mesh}: {seconds:.1f} s, peak {imported / 2**20:.2f} GiB, the built model's RSS "
            f"{built / 2**20:.2f} GiB, extra {row['ratio']}x the checkpoint"
        )
        rows.append(row)
    result: dict[str, Any] = {"checkpoint_bytes": size, "runs": rows}
    if args.score:
        run = folder / "run-batch1"
        if not run.is_dir():
            raise SystemExit("--score: scores the batch=1 import; include batch=1 in --meshes")
        result.update(score_check(hf, run, Path(args.score), args.score_bytes, folder))
        print(
            f"score of {result['score_tokens']} tokens on batch=2,model=4: largest gap to "
            f"transformers {result['score_max_gap']:.2e}; its export loaded back by "
            f"transformers: {result['export_max_gap']:.2e}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
