"""dtcli's built-in language model: a decoder-only GPT as a tf-keras model (`model.transformer`).

Its layers are in gpt_layers.py; this module is their assembly and the arithmetic (parameters,
FLOPs), which needs no TensorFlow.

Token and learned position embeddings, `layers` pre-LayerNorm blocks of causal self-attention
and a GELU MLP, a final LayerNorm and an output head (by default the token embedding's
transpose, as in GPT-2 and nanoGPT). Initial weights follow nanoGPT: normal(0, 0.02), the
residual projections scaled by 1/sqrt(2 * layers).

The weight paths are stable, so layout rules can target them (`block_i`: i from 0):

    token_embedding.embeddings          [vocab, d_model]
    position_embedding.embeddings       [context, d_model]
    block_i.ln_1.gamma  (.beta)        [d_model]
    block_i.attention.query.kernel     [d_model, heads, head_dim]   (also key, value)
    block_i.attention.query.bias       [heads, head_dim]            (with bias: true)
    block_i.attention.proj.kernel      [heads, head_dim, d_model]
    block_i.attention.proj.bias        [d_model]
    block_i.ln_2.gamma  (.beta)        [d_model]
    block_i.mlp.fc.kernel  (.bias)     [d_model, mlp_ratio * d_model]
    block_i.mlp.proj.kernel  (.bias)   [mlp_ratio * d_model, d_model]
    ln_f.gamma  (.beta)                 [d_model]
    head.kernel                         [d_model, vocab]   (tie_embeddings: false)

Tensor parallel (Megatron): shard the attention heads (dim 1 of query/key/value, dim 0 of
attention.proj) and the MLP's hidden dim (dim 1 of fc, dim 0 of proj) on one mesh axis; each
block then all-reduces twice per pass. Heads are an explicit dim of the attention kernels, so a
head is never split across devices: the head count must divide by that axis (checked with the
layouts).
The token embedding is looked up by gathering from its value, which works with the table
sharded on either dim (a resource gather refuses a vocab-sharded table).
"""

from __future__ import annotations

from typing import Any

from dtcli.layout import WeightInfo
from dtcli.mesh import UNSHARDED
from dtcli.recipe import TransformerConfig


def build(cfg: TransformerConfig, vocab: int, compute: Any = None) -> Any:
    """The GPT as a Functional tf_keras.Model: int tokens [batch, context] -> logits
    [batch, context, vocab]. `compute` (models.compute.Compute): how its layers read their
    weights (FSDP gather, bf16); default float32, no gather."""
    import tf_keras

    # Imported here, not at the top: the layers import TensorFlow (plan and config do not).
    from dtcli.models import gpt_layers as g

    c = compute or g.FLOAT32
    token_embedding = g.Embedding(cfg, vocab, "token_embedding", c)
    ids = tf_keras.Input((cfg.context,), dtype="int32", name="tokens")
    x = g.PositionEmbedding(cfg, "position_embedding", c)(token_embedding(ids))
    x = tf_keras.layers.Dropout(cfg.dropout, name="dropout")(x)
    for i in range(cfg.layers):
        x = g.Block(cfg, f"block_{i}", c)(x)
    x = g.layer_norm(cfg, "ln_f", c)(x)
    if cfg.tie_embeddings:
        logits = g.TiedHead(token_embedding, "head", c)(x)
    else:
        logits = g.Dense(vocab, False, g.STD, "head", c)(x)
    return tf_keras.Model(ids, logits, name="gpt")


def weights(cfg: TransformerConfig, vocab: int) -> list[WeightInfo]:
    """Every weight `build` makes (path, shape, owning layer class), in the order the built
    model lists them (models.keras.keras_variables: the model's layers in order, and inside a
    layer its attributes sorted by name), from the config alone: no TensorFlow, so a memory
    plan can be made before anything is allocated. A test compares it with the built model."""
    d, heads = cfg.d_model, cfg.heads
    head_dim, hidden = d // heads, cfg.mlp_ratio * d

    def dense(path: str, kernel: tuple[int, ...], bias: tuple[int, ...], layer: str) -> list:
        own = [WeightInfo(f"{path}.bias", bias, layer)] if cfg.bias else []
        return own + [WeightInfo(f"{path}.kernel", kernel, layer)]

    def norm(path: str) -> list:
        beta = [WeightInfo(f"{path}.beta", (d,), "LayerNormalization")] if cfg.bias else []
        return beta + [WeightInfo(f"{path}.gamma", (d,), "LayerNormalization")]

    out = [
        WeightInfo("token_embedding.embeddings", (vocab, d), "Embedding"),
        WeightInfo("position_embedding.embeddings", (cfg.context, d), "PositionEmbedding"),
    ]
    qkv = ((d, heads, head_dim), (heads, head_dim))
    for i in range(cfg.layers):
        b = f"block_{i}"
        for part in ("key", "proj", "query", "value"):  # attribute names, sorted
            kernel, bias = ((heads, head_dim, d), (d,)) if part == "proj" else qkv
            out += dense(f"{b}.attention.{part}", kernel, bias, "EinsumDense")
        out += norm(f"{b}.ln_1") + norm(f"{b}.ln_2")
        out += dense(f"{b}.mlp.fc", (d, hidden), (hidden,), "Dense")
        out += dense(f"{b}.mlp.proj", (hidden, d), (d,), "Dense")
    out += norm("ln_f")
    if not cfg.tie_embeddings:
        out.append(WeightInfo("head.kernel", (d, vocab), "Dense"))
    return out


def parameters(cfg: TransformerConfig, vocab: int) -> int:
    """Trainable parameters (arithmetic, no TensorFlow)."""
    d, hidden = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    per_block = 4 * d * d + 2 * d * hidden + 2 * d * (2 if cfg.bias else 1)
    if cfg.bias:
        per_block += 4 * d + hidden + d
    total = vocab * d + cfg.context * d + cfg.layers * per_block + d * (2 if cfg.bias else 1)
    if not cfg.tie_embeddings:
        total += d * vocab
    return total


def flops_per_token(cfg: TransformerConfig, vocab: int, context: int) -> float:
    """Training FLOPs per token: 6 per weight of the matmuls (forward 2, backward 4) plus the
    attention scores and weighted sums over `context` positions (PaLM's appendix B estimate,
    as nanoGPT's MFU)."""
    matmul_weights = parameters(cfg, vocab) - cfg.context * cfg.d_model
    return 6.0 * matmul_weights + 12.0 * cfg.layers * cfg.d_model * context


def tensor_parallel_rules(model_axis: str, gated: bool = False) -> dict[str, list[str]]:
    """Megatron's layout rules for this model (recipes/tiny_gpt_tensor_parallel.yaml): the
    heads, the MLP's hidden units and the embeddings' features split along `model_axis`;
    `gated`: SwiGLU's gate (`mlp.gate`) split as `mlp.fc` is. What `plan --auto` tries, and
    `plan HF_DIR`'s default on a model axis."""
    m, u = model_axis, UNSHARDED
    rules = {
        r"(token|position)_embedding\.embeddings": [u, m],
        r"block_\d+\.attention\.(query|key|value)\.kernel": [u, m, u],
        r"block_\d+\.attention\.proj\.kernel": [m, u, u],
        r"block_\d+\.mlp\.fc\.kernel": [u, m],
        r"block_\d+\.mlp\.proj\.kernel": [m, u],
    }
    if gated:
        rules[r"block_\d+\.mlp\.gate\.kernel"] = [u, m]
    return rules
