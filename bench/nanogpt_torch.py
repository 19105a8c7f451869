"""nanoGPT's CPU run of shakespeare_char, rebuilt in PyTorch, for a same-machine time per step.

The peer a dtcli user would pick for a small GPT on a CPU is nanoGPT. Its README's CPU settings:
4 layers, 4 heads, 128 wide, context 64, batch 12, no dropout, no bias, AdamW (lr 1e-3, 100
warmup steps, cosine to 1e-4 over 2,000 steps, betas 0.9/0.99, weight decay 0.1 on matrices),
gradients clipped to 1, tied embeddings, one token per character (65 of them). This file is that
model and step (nanoGPT's model.py and train.py, condensed; `compile=False` as its CPU line says)
so that its ms/step can be measured on the machine dtcli runs on, side by side with dtcli.

Needs PyTorch, which dtcli does not depend on: `pip install torch` in any environment.

    python bench/nanogpt_torch.py --threads 1 --steps 300     # ms/step, one thread
    python bench/nanogpt_torch.py --threads 2 --steps 2000 --eval   # the whole run, eval loss

Prints one JSON line: threads, steps, ms_per_step (after 20 warm-up steps), and with --eval the
evaluation loss on the last 10% (nanoGPT's estimate: 200 random batches).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval", action="store_true", help="estimate the eval loss at the end")
    parser.add_argument("--data", type=Path, default=SHAKESPEARE)
    args = parser.parse_args()

    import numpy as np
    import torch
    import torch.nn as nn
    from torch.nn import functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    layers, heads, width, context, batch = 4, 4, 128, 64, 12

    text = args.data.read_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = np.array([index[c] for c in text], dtype=np.int64)
    cut = int(0.9 * len(data))
    train, val = data[:cut], data[cut:]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(width, bias=False)
            self.c_attn = nn.Linear(width, 3 * width, bias=False)
            self.attn_proj = nn.Linear(width, width, bias=False)
            self.ln_2 = nn.LayerNorm(width, bias=False)
            self.c_fc = nn.Linear(width, 4 * width, bias=False)
            self.mlp_proj = nn.Linear(4 * width, width, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(len(chars), width)
            self.wpe = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width, bias=False)
            self.lm_head = nn.Linear(width, len(chars), bias=False)
            self.wte.weight = self.lm_head.weight  # tied, as nanoGPT
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(idx.shape[1])
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.99),
    )

    def lr_at(step: int) -> float:
        if step < 100:
            return 1e-3 * (step + 1) / 101
        ratio = min((step - 100) / (2000 - 100), 1.0)
        return 1e-4 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1e-3 - 1e-4)

    rng = np.random.default_rng(0)

    def batch_of(split: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        starts = rng.integers(0, len(split) - context - 1, batch)
        x = np.stack([split[i : i + context] for i in starts])
        y = np.stack([split[i + 1 : i + 1 + context] for i in starts])
        return torch.from_numpy(x), torch.from_numpy(y)

    warm, started = 20, None
    for step in range(args.steps):
        if step == warm:
            started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        x, y = batch_of(train)
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss.item()  # nanoGPT reads the loss back at every log_interval=1 step
    elapsed = time.perf_counter() - started
    result = {
        "threads": args.threads,
        "steps": args.steps,
        "ms_per_step": 1000 * elapsed / (args.steps - warm),
    }
    if args.eval:
        model.eval()
        with torch.no_grad():
            result["eval_loss"] = float(np.mean([model(*batch_of(val)).item() for _ in range(200)]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
