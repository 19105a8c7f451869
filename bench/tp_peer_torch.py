"""The PyTorch side of bench/tp_peer.py: nanoGPT's GPT under torch.distributed.tensor.parallel.

Runs under the PyTorch a user would train with (`--torch-python` of bench/tp_peer.py), which
need not have dtcli; bench/tp_peer.py calls it, a user need not. Two commands:

    init OUT --layers L --width D --heads H --context T --vocab V --seed S
        a random GPT-2-shaped model (transformers' GPT2LMHeadModel(GPT2Config(...)), dropout 0)
        saved to OUT with save_pretrained: the initial weights both tools train from.
    train CONFIG.json
        world-size processes (gloo, one thread each) train nanoGPT's GPT from that folder's
        weights on the batches CONFIG names; rank 0 writes the losses and times to CONFIG's `out`.

The model is nanoGPT's model.py (../shared/peers/nanogpt) with two changes that make it
GPT-2's (and dtcli's import of it): its fused c_attn becomes three Linear layers q, k and v,
each [d, d], before any sharding (a column split of the fused [3d, d] weight would give each
rank a mix of q, k and v columns: silently wrong attention), and its GELU the tanh one
(GPT-2's gelu_new). The tensor-parallel plan per block: q, k, v column-wise (each rank its
n_head / tp heads), attn.c_proj row-wise, mlp.c_fc column-wise, mlp.c_proj row-wise; the
attention's input prepared once as a replicated DTensor, so the backward all-reduces its
gradient once for q, k and v together (Megatron's `f`: 4 all-reduces a block per forward and
backward, counted with torch.profiler; 6 without it); embeddings, LayerNorms and the tied head
replicated. With a data-parallel mesh dim (`dp` > 1) every gradient is averaged over it
in one flat all-reduce (as DDP's bucket does) before clipping, so each step trains on the mean
over the global batch, as dtcli's does.

AdamW as dtcli's (tf-keras' form): torch.optim.AdamW with its eps set each step to
eps / sqrt(1 - beta_2^t), which makes its update lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) *
m / (sqrt(v) + eps), tf-keras' term for term; decoupled decay on weights of 2 or more dims (not
on biases or LayerNorm gains: dtcli's `no_decay: (bias|gamma|beta)$`); the learning rate each
step from the schedule the config lists; gradients clipped to the global norm as
tf.clip_by_global_norm does (scaled by clip / max(norm, clip)).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# HF GPT-2's Conv1D weights are [in, out]; nn.Linear's are [out, in] (nanoGPT's from_pretrained).
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class SplitAttention(nn.Module):
    """nanoGPT's CausalSelfAttention with q, k, v as three Linear layers: on a rank of a
    tensor-parallel group it holds `heads` of the model's heads (its columns of q, k, v)."""

    def __init__(self, width: int, heads: int, head_dim: int):
        super().__init__()
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.c_proj = nn.Linear(width, width)
        self.heads = heads
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x may be a replicated DTensor (the plan's PrepareModuleInput); q/k/v give local shards.
        B, T = x.shape[0], x.shape[1]
        q, k, v = (
            t.view(B, T, self.heads, self.head_dim).transpose(1, 2)
            for t in (self.q(x), self.k(x), self.v(x))
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))


def build_model(nanogpt: Path, hf_dir: Path, heads_per_rank: int | None = None) -> nn.Module:
    """nanoGPT's GPT with GPT-2's attention split and GELU, holding the weights of `hf_dir`
    (model.safetensors, config.json). `heads_per_rank`: the heads each attention keeps (the
    model's n_head / tp; None: all)."""
    sys.path.insert(0, str(nanogpt))
    import model as nanogpt_model  # nanoGPT's model.py
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    config = nanogpt_model.GPTConfig(
        block_size=cfg["n_positions"],
        vocab_size=cfg["vocab_size"],
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        n_embd=cfg["n_embd"],
        dropout=0.0,
        bias=True,
    )
    gpt = nanogpt_model.GPT(config)
    width, heads = cfg["n_embd"], cfg["n_head"]
    for block in gpt.transformer.h:
        block.attn = SplitAttention(width, heads_per_rank or heads, width // heads)
        block.mlp.gelu = nn.GELU(approximate="tanh")
    gpt.load_state_dict(mapped_state(load_file(str(hf_dir / "model.safetensors"))), strict=True)
    return gpt


def mapped_state(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF GPT-2's tensors under this model's names: Conv1D weights transposed, c_attn's
    [3d, d] rows (after the transpose) cut into q, k and v, the head tied to wte."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in hf.items():
        name = name.removeprefix("transformer.")
        if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
            continue  # HF's causal-mask buffers, not weights
        if name.endswith(CONV1D):
            tensor = tensor.t()
        if ".attn.c_attn." in name:
            prefix, kind = name.split(".attn.c_attn.")
            for part, piece in zip("qkv", tensor.chunk(3, dim=0)):
                out[f"transformer.{prefix}.attn.{part}.{kind}"] = piece.contiguous()
            continue
        if name == "lm_head.weight":
            continue
        out[f"transformer.{name}"] = tensor.contiguous()
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def init(args: argparse.Namespace) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    config = GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.context,
        n_embd=args.width,
        n_layer=args.layers,
        n_head=args.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=args.vocab - 1,  # GPT-2's 50256 is past a byte vocabulary
        eos_token_id=args.vocab - 1,
    )
    GPT2LMHeadModel(config).save_pretrained(args.out)


def plan() -> dict:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    return {
        "attn": PrepareModuleInput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Replicate(),),
            use_local_output=False,
        ),
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.c_proj": RowwiseParallel(),
        "mlp.c_fc": ColwiseParallel(),
        "mlp.c_proj": RowwiseParallel(),
    }


def worker(rank: int, cfg: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]))
    torch.set_num_threads(1)
    dp, tp = cfg["dp"], cfg["tp"]
    dist.init_process_group("gloo", rank=rank, world_size=dp * tp)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = build_model(Path(cfg["nanogpt"]), Path(cfg["hf_dir"]), cfg["heads"] // tp)
    for block in model.transformer.h:
        parallelize_module(block, mesh["tp"], plan())
    losses, norms, first_s, timed_s = train(model, cfg, mesh)
    if rank == 0:
        report = {"losses": losses, "grad_norms": norms, "first_step_s": first_s}
        report["threads"] = torch.get_num_threads()
        report["ms_per_step"] = 1000 * timed_s / (cfg["steps"] - cfg["timed_from"])
        Path(cfg["out"]).write_text(json.dumps(report))
    dist.destroy_process_group()


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Sharded (DTensor) and replicated weights in groups of their own (foreach over one kind
    at a time), each split into decayed (2+ dims) and undecayed (biases, LayerNorm gains)."""
    from torch.distributed.tensor import DTensor

    groups: dict[tuple[bool, bool], list] = {}
    for p in model.parameters():
        groups.setdefault((isinstance(p, DTensor), p.dim() >= 2), []).append(p)
    return [
        {"params": ps, "weight_decay": weight_decay if decay else 0.0}
        for (_, decay), ps in groups.items()
    ]


def clip(params: list, clip_norm: float, tp_group) -> float:
    """Scale the gradients by clip / max(norm, clip), the norm over the whole model: the
    squares of sharded gradients summed over the tensor-parallel group, the replicated ones
    counted once (every rank holds the same); returns the norm."""
    from torch.distributed.tensor import DTensor

    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    sharded = torch.zeros(())
    replicated = torch.zeros(())
    for p, g in zip(params, local):
        # RowwiseParallel's bias is a DTensor too, but replicated: each rank holds all of it.
        if isinstance(p.grad, DTensor) and any(x.is_shard() for x in p.grad.placements):
            sharded += g.pow(2).sum()
        else:
            replicated += g.pow(2).sum()
    dist.all_reduce(sharded, group=tp_group)
    norm = float((sharded + replicated).sqrt())
    if norm > clip_norm:
        torch._foreach_mul_(local, clip_norm / norm)
    return norm


def average_over_dp(params: list, dp: int, dp_group) -> None:
    """Every gradient's local part averaged over the data-parallel dim, in one flat buffer."""
    from torch.distributed.tensor import DTensor

    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=dp_group)
    flat /= dp
    offset = 0
    for g in local:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def train(model: nn.Module, cfg: dict, mesh) -> tuple[list[float], list[float], float, float]:
    """The steps; (each step's loss over the global batch, its gradient norm before clipping,
    the first step's seconds, the seconds of the steps after `timed_from`: data feed, step and
    host loop)."""
    import numpy as np

    dp = cfg["dp"]
    dp_rank = mesh.get_local_rank("dp")
    tokens = np.load(cfg["batches"])  # [steps, global batch, context + 1]
    rows = tokens.shape[1] // dp
    tokens = tokens[:, dp_rank * rows : (dp_rank + 1) * rows]
    params = [p for p in model.parameters()]
    opt = cfg["optimizer"]
    optimizer = torch.optim.AdamW(
        param_groups(model, opt["weight_decay"]),
        lr=opt["learning_rates"][0],
        betas=(opt["beta_1"], opt["beta_2"]),
        eps=opt["epsilon"],
    )
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    losses, norms = [], []
    dist.barrier()
    started = time.perf_counter()
    first_s = timed_start = 0.0
    for step in range(cfg["steps"]):
        batch = torch.from_numpy(tokens[step].astype(np.int64))
        _, loss = model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
        loss.backward()
        if dp > 1:
            average_over_dp(params, dp, dp_group)
        if opt["clip_norm"] is not None:
            norms.append(clip(params, opt["clip_norm"], tp_group))
        t = step + 1
        for group in optimizer.param_groups:
            group["lr"] = opt["learning_rates"][step]
            group["eps"] = opt["epsilon"] / math.sqrt(1 - opt["beta_2"] ** t)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if step == 0:
            first_s = time.perf_counter() - started
        if t == cfg["timed_from"]:
            timed_start = time.perf_counter()
    timed_s = time.perf_counter() - timed_start
    mean = torch.stack(losses)
    dist.all_reduce(mean, group=dp_group)
    return (mean / dp).tolist(), norms, first_s, timed_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("init")
    make.add_argument("out")
    for key in ("layers", "width", "heads", "context", "vocab", "seed"):
        make.add_argument(f"--{key}", type=int, required=True)
    run = sub.add_parser("train")
    run.add_argument("config")
    args = parser.parse_args()
    if args.command == "init":
        init(args)
        return
    cfg = json.loads(Path(args.config).read_text())
    torch.multiprocessing.spawn(worker, args=(cfg,), nprocs=cfg["dp"] * cfg["tp"], join=True)


if __name__ == "__main__":
    main()
