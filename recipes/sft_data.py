"""The instruction set `recipes/sft_lora.yaml` fine-tunes on, made offline and checkable exactly.

    python recipes/sft_data.py data/sft          # writes data/sft/train.jsonl and eval.jsonl

Each line is `{"prompt": "Uppercase: thee", "response": "THEE"}`: a word of 3 to 7 random
lowercase letters and the same word in capitals. A model pretrained on plain text (tiny_gpt on
tiny Shakespeare) has never seen the instruction, so its greedy answer is never exact (0 of 200);
the answer copies the word's letters in order, each mapped to its capital, which tiny_gpt learns
in 1,000 steps (LoRA: 64% exact; full fine-tuning: 100%; docs/fine-tuning.md). The held-out
words are disjoint from the training ones (other operands, not other wording), so an exact
answer there is the skill, not a memorized line.

The words are drawn from a fixed seed: the same command writes the same files everywhere.
"""

from __future__ import annotations

import json
import random
import string
import sys
from pathlib import Path

SEED = 20261127
TRAIN = 4000
EVAL = 200
LETTERS = string.ascii_lowercase


def words(count: int, rng: random.Random, taken: set[str]) -> list[str]:
    """`count` distinct words of 3 to 7 letters, none in `taken` (which they are added to)."""
    out: list[str] = []
    while len(out) < count:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 7)))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


def example(word: str) -> dict[str, str]:
    return {"prompt": f"Uppercase: {word}", "response": word.upper()}


def splits(seed: int = SEED, train: int = TRAIN, held_out: int = EVAL) -> tuple[list, list]:
    """(train, eval) examples; no eval word is a training word."""
    rng, taken = random.Random(seed), set()
    eval_words = words(held_out, rng, taken)
    train_words = words(train, rng, taken)
    return [example(w) for w in train_words], [example(w) for w in eval_words]


def write(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.jsonl", folder / "eval.jsonl"
    for path, rows in zip(paths, splits()):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python recipes/sft_data.py OUT_DIR")
    for path in write(Path(sys.argv[1])):
        print(path)
