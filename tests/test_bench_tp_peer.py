"""bench/tp_peer.py's PyTorch side computes GPT-2: nanoGPT's model with c_attn cut into q, k and
v, loaded from a transformers folder, gives transformers' logits, and its attention split by
heads as the tensor-parallel plan splits it (q/k/v rows, c_proj columns) sums to the whole.
A wrong transpose or a fused-weight column split would train a different model on the torch
side and show only as a loss gap in a long benchmark run. No timings, no processes."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import ROOT, _bench_script

# The test extra installs torch and transformers; ../shared beside the checkout holds nanoGPT.
NANOGPT = ROOT.parent / "shared" / "peers" / "nanogpt"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A random GPT-2 (2 layers, 32 wide, 4 heads), every weight and bias random."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=64, bos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape))
    path = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(path)
    return path, model.eval()


def test_the_split_model_gives_transformers_logits(folder):
    path, hf = folder
    peer = _bench_script("tp_peer_torch").build_model(NANOGPT, path)
    ids = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))

    with torch.no_grad():
        logits, _ = peer(ids, ids)
        expected = hf(ids).logits

    assert torch.allclose(logits, expected, atol=2e-5), (logits - expected).abs().max()


def test_attention_split_by_heads_sums_to_the_whole(folder):
    """Each of tp=2 ranks keeps rows r of q, k, v (ColwiseParallel shards dim 0) and
    columns r of c_proj (RowwiseParallel, dim 1; the bias added once, after the all-reduce)."""
    tp_peer_torch = _bench_script("tp_peer_torch")
    path, _ = folder
    whole = tp_peer_torch.build_model(NANOGPT, path).transformer.h[0].attn
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    parts = []
    with torch.no_grad():
        for rank in range(2):
            part = tp_peer_torch.SplitAttention(32, heads=2, head_dim=whole.head_dim)
            rows = slice(16 * rank, 16 * (rank + 1))
            # A rank's shapes after the plan's sharding: q/k/v [16, 32], c_proj [32, 16].
            part.q, part.k, part.v = (torch.nn.Linear(32, 16) for _ in range(3))
            part.c_proj = torch.nn.Linear(16, 32)
            for name in "qkv":
                getattr(part, name).weight.copy_(getattr(whole, name).weight[rows])
                getattr(part, name).bias.copy_(getattr(whole, name).bias[rows])
            part.c_proj.weight.copy_(whole.c_proj.weight[:, rows])
            part.c_proj.bias.zero_()
            parts.append(part(x))
        summed = parts[0] + parts[1] + whole.c_proj.bias

        assert torch.allclose(summed, whole(x), atol=1e-5)
