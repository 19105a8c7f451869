"""Issue 44's one-device measuring tools decide what they compare: bench/nanogpt.py's GPT-2-small
rows give both sides the same model and head, and bench/matmul_limit.py's products are exactly
the step's matmuls. Their timings are run by hand (docs/benchmarks.md), never by a test."""

from __future__ import annotations

from pathlib import Path

from conftest import _bench_script

from dtcli.models.transformer import flops_per_token, weights
from dtcli.recipe import TransformerConfig

nanogpt = _bench_script("nanogpt")
matmul_limit = _bench_script("matmul_limit")


def test_gpt2_small_rows_give_both_sides_the_same_shape_vocabulary_and_warmup():
    s = nanogpt.GPT2_SMALL
    peer = nanogpt.nanogpt_args(s, 40, 768, False, "gpt2", bf16=True)
    flags = dict(a[2:].split("=", 1) for a in peer if a.startswith("--"))
    mine = nanogpt.dtcli_sets(s, Path("input.txt"), 40, 768, "graph", "gpt2", bf16=True)

    assert peer[0] == nanogpt.CPU_AUTOCAST and flags["dtype"] == "bfloat16"
    assert mine["train.precision"] == "bf16" and mine["train.compile"] == "graph"
    pairs = {
        "n_layer": "model.transformer.layers",
        "n_head": "model.transformer.heads",
        "n_embd": "model.transformer.d_model",
        "block_size": "model.transformer.context",
        "batch_size": "data.batch_size",
        "dropout": "model.transformer.dropout",
        "warmup_iters": "optimizer.warmup_steps",
    }
    assert {k: float(flags[k]) for k in pairs} == {k: float(mine[v]) for k, v in pairs.items()}
    assert (flags["n_layer"], flags["n_embd"], flags["block_size"]) == ("12", "768", "128")
    # GPT-2's head on both sides: nanoGPT's meta.pkl (prepare_nanogpt), dtcli's vocab_size.
    assert flags["dataset"] == nanogpt.NANOGPT_DATA["gpt2"]
    assert mine["model.transformer.vocab_size"] == nanogpt.VOCAB_SIZES["gpt2"] == 50304
    assert mine["train.steps"] == 40 and mine["train.eval_every"] == 10
    # The bytes row set: both on bytes, dtcli's vocabulary its tokenizer's own.
    bytes_ = nanogpt.nanogpt_args(s, 40, 768, False, nanogpt.nanogpt_data("nanoGPT", "bytes", s))
    assert f"--dataset={nanogpt.NANOGPT_DATA['bytes']}" in bytes_
    assert "model.transformer.vocab_size" not in nanogpt.dtcli_sets(s, Path("x"), 40, 768, "auto")
    # The README shape keeps its rows as they were: nanoGPT on its characters, dtcli's recipe.
    readme = nanogpt.dtcli_sets(nanogpt.CPU, Path("x"), 200, 128, "auto")
    assert "model.transformer.layers" not in readme and "train.compile" not in readme
    assert nanogpt.nanogpt_data("nanoGPT", "bytes", nanogpt.CPU) == "chars"
    # On a GPU: the GPU, bf16 and the row's compile setting, at either shape.
    gpu = nanogpt.dataclasses.replace(s, device="gpu")
    for setting in (nanogpt.GPU, gpu):
        sets = nanogpt.dtcli_sets(setting, Path("x"), 200, 768, "dtensor")
        assert (sets["devices"], sets["train.precision"], sets["train.compile"]) == (
            "gpu",
            "bf16",
            "dtensor",
        )
    assert "--n_layer=12" in nanogpt.nanogpt_args(gpu, 40, 768, True, "bytes")
    assert not any(
        a.startswith("--n_layer") for a in nanogpt.nanogpt_args(nanogpt.GPU, 40, 384, True)
    )


def test_dtcli_compile_adds_one_row_per_setting_and_auto_is_the_dtcli_row():
    names = nanogpt.row_names(nanogpt.GPT2_SMALL, True, False, True, ["auto", "xla", "graph"])
    assert names == [
        "nanoGPT",
        "dtcli",
        *nanogpt.BF16_ROWS,
        "dtcli compile=xla",
        "dtcli bf16 compile=xla",
        "dtcli compile=graph",
        "dtcli bf16 compile=graph",
    ]


def test_the_limit_counts_every_matmul_of_the_step_and_nothing_else():
    """The products' FLOPs are nanoGPT's formula less its 6 FLOPs per token per LayerNorm
    weight (which is not a matmul): a missing backward product or head would break this."""
    s = matmul_limit.Shape(layers=3, width=96, heads=4, context=32, batch=2, vocab=320)
    cfg = TransformerConfig(layers=3, d_model=96, heads=4, context=32)
    norms = sum(w.shape[0] for w in weights(cfg, 320) if w.layer == "LayerNormalization")

    products = matmul_limit.step_products(s)
    total = sum(p.flops for _, p in products)

    assert total == s.tokens * (flops_per_token(cfg, 320, 32) - 6 * norms)
    assert matmul_limit.step_flops(s) == s.tokens * flops_per_token(cfg, 320, 32)
    # Per layer 6 dense products x 3 and attention's 6; the tied head's 3 once.
    assert len(products) == 3 * (18 + 6) + 3
    groups = matmul_limit.grouped(products)
    assert sum(count for count, _ in groups.values()) == len(products)
    assert groups[matmul_limit.Product(1, 64, 320, 96)] == (1, ["head dX"])


def test_each_nanogpt_row_is_set_against_the_limit_of_its_own_threads_dtype_and_shape():
    s = matmul_limit.Shape(layers=12, width=768, heads=12, context=128, batch=4, vocab=256)
    shape = {"layers": 12, "width": 768, "heads": 12, "context": 128, "batch": 4, "vocab": 256}
    lim = {"step_flops": 2e9, "gflops": {"onednn": 100.0, "xla": 50.0, "best": 100.0}}
    results = {
        (2, "float32"): lim,
        (2, "bf16"): {**lim, "gflops": dict.fromkeys(lim["gflops"], 200.0)},
    }
    rows = [
        {"run": "dtcli", "threads": 2, "ms_per_step": 40.0, **shape},  # 50 GFLOP/s
        {"run": "dtcli bf16", "threads": 2, "ms_per_step": 40.0, **shape},
        {"run": "nanoGPT", "threads": 1, "ms_per_step": 40.0, **shape},
        {"run": "nanoGPT", "threads": 2, "ms_per_step": 40.0, **shape, "vocab": 50304},
    ]
    lines = matmul_limit.row_ratios(s, rows, results)
    assert "0.500 of onednn, 1.000 of xla" in lines[0]
    assert "0.250 of onednn" in lines[1]
    assert lines[2].endswith("no 1-thread float32 limit measured, left out")
    assert lines[3].endswith("another shape or vocabulary, left out")
