"""LoRA's memory on GPT-2 small's shape: `dtcli plan` against a live run's shards, per device.

    python bench/lora_memory.py [--base-precision float32|bf16] [--rank 8]

Builds GPT-2 small (12 x 768, 12 heads, vocabulary 50,257 -> 50,304: tests/data/hf/gpt2's
config.json; random weights, nothing downloaded) with LoRA adapters on the attention's query and
value kernels, on 8 virtual CPUs as batch=4,model=2 with Megatron rules, trains one step (AdamW,
context 64), then unpacks every variable on every device and prints one JSON line: the live
bytes per device of all weights, the frozen base, the trainable adapters and the optimizer's
variables, the plan's figures (dtcli.memory) and whether they are equal. About 1 minute and
6.5 GB of memory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "data" / "hf" / "gpt2" / "config.json"


def folder_of_gpt2_small(tmp: Path) -> Path:
    """GPT-2 small's config.json and a small byte-level BPE tokenizer.json (the plan reads the
    config's vocabulary, not the tokenizer's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = tmp / "gpt2"
    folder.mkdir()
    shutil.copy(CONFIG, folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def per_device(variables: list, devices: int) -> list[int]:
    """Bytes of each device's local shards of `variables`."""
    from tensorflow.experimental import dtensor

    sums = [0] * devices
    for var in variables:
        for i, shard in enumerate(dtensor.unpack(var.read_value())):
            sums[i] += shard.numpy().nbytes
    return sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-precision", default="bf16", choices=("float32", "bf16"))
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()

    from dtcli import devices, plan
    from dtcli import recipe as R
    from dtcli import session as T
    from dtcli.models import transformer

    devices.configure("cpu:8", 8)
    import tensorflow as tf

    tmp = Path(tempfile.mkdtemp())
    text = tmp / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    recipe = R.load(
        {
            "task": "language_model",
            "devices": "cpu:8",
            "mesh": {"batch": 4, "model": 2},
            "layouts": {"rules": transformer.tensor_parallel_rules("model")},
            "model": {"from_hf": str(folder_of_gpt2_small(tmp)), "transformer": {"context": 64}},
            "lora": {
                "targets": r"attention\.(query|value)\.kernel$",
                "rank": args.rank,
                "base_precision": args.base_precision,
            },
            "data": {"source": "text", "path": str(text), "batch_size": 8},
            "optimizer": {"name": "adamw"},
            "train": {"steps": 1},
        }
    )
    start = time.perf_counter()
    s = T.prepare(recipe, splits=("train",))
    T.run_steps(s, 1)  # anything an optimizer makes on its first step exists now
    variables = s.model.module.variables
    optimizer = tf.train.TrackableView(s.optimizer.trackable).descendants()
    live = {
        "weights": per_device(variables, 8),
        "frozen": per_device([v for v in variables if not v.trainable], 8),
        "trainable": per_device(s.model.trainable_variables, 8),
        "optimizer": per_device([v for v in optimizer if isinstance(v, tf.Variable)], 8),
    }
    planned = plan.make_report(recipe).memory
    want = {
        "weights": planned.weights,
        "frozen": planned.frozen,
        "trainable": planned.trainable,
        "optimizer": planned.optimizer,
    }
    print(
        json.dumps(
            {
                "base_precision": args.base_precision,
                "rank": args.rank,
                "live_per_device": live,
                "plan_per_device": want,
                "equal": all(live[k] == [v] * 8 for k, v in want.items()),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
    )
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
