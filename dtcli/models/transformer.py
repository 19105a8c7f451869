"""dtcli's built-in language model: a decoder-only GPT as a tf-keras model (`model.transformer`).

Its layers are in gpt_layers.py; this module is their assembly and the arithmetic (parameters,
FLOPs), which needs no TensorFlow.

Token embeddings (and learned position embeddings, or rotary ones inside the attention),
`layers` pre-norm blocks of causal self-attention and an MLP, a final norm and an output head
(by default the token embedding's transpose, as in GPT-2 and nanoGPT). The options of
`model.transformer` make it GPT-2 (gelu_tanh, bias, learned positions) or Llama-family (swiglu,
rmsnorm, rope, fewer key/value heads, untied head) as Hugging Face computes them; the defaults
are nanoGPT's. Initial weights follow nanoGPT: normal(0, 0.02), the residual projections scaled
by 1/sqrt(2 * layers).

The weight paths are stable, so layout rules and LoRA can target them (`block_i`: i from 0);
model_vocab is the vocabulary rounded up (model.transformer.vocab_size's, else the tokenizer's),
mlp_hidden defaults to mlp_ratio * d_model, head_dim is d_model // heads:

    token_embedding.embeddings          [model_vocab, d_model]
    position_embedding.embeddings       [max_positions, d_model]      (positions: learned)
    block_i.ln_1.gamma  (.beta)         [d_model]   (rmsnorm: gamma only, RMSNormalization)
    block_i.attention.query.kernel      [d_model, heads, head_dim]    (.bias [heads, head_dim])
    block_i.attention.key.kernel        [d_model, kv_heads, head_dim] (.bias [kv_heads, head_dim])
    block_i.attention.value.kernel      [d_model, kv_heads, head_dim] (.bias [kv_heads, head_dim])
    block_i.attention.proj.kernel       [heads, head_dim, d_model]    (.bias [d_model])
    block_i.ln_2.gamma  (.beta)         [d_model]
    block_i.mlp.gate.kernel  (.bias)    [d_model, mlp_hidden]   (swiglu: the SiLU-gated branch)
    block_i.mlp.fc.kernel  (.bias)      [d_model, mlp_hidden]   (swiglu: the "up" projection)
    block_i.mlp.proj.kernel  (.bias)    [mlp_hidden, d_model]
    ln_f.gamma  (.beta)                 [d_model]
    head.kernel                         [d_model, model_vocab]  (tie_embeddings: false)

(.bias and .beta with bias: true.) With vocab_size set below model_vocab, a `vocab_mask` layer
after the head sets the logits of the ids past it to -inf.

LoRA (`lora:`, models/lora.py): each kernel PATH.kernel that lora.targets finds gets PATH.lora_a
[its input dims..., r] and PATH.lora_b [r, its output dims...], listed right after the kernel,
trainable and float32, while every other weight is frozen (bfloat16 with base_precision bf16):

    block_i.mlp.fc.lora_a [d_model, r]   .lora_b [r, mlp_hidden]  (gate, proj, head: likewise)
    block_i.attention.query.lora_a [d_model, r]   .lora_b [r, heads, head_dim]  (key, value)
    block_i.attention.proj.lora_a [heads, head_dim, r]   .lora_b [r, d_model]

The layer's output is base(x) + lora.alpha / r * ((dropout(x) . A) . B); W + alpha / r * A . B
(A's r contracted with B's) is the merged kernel.

Tensor parallel (Megatron): shard the attention heads (dim 1 of query/key/value, dim 0 of
attention.proj) and the MLP's hidden dim (dim 1 of fc, dim 0 of proj) on one mesh axis; each
block then all-reduces twice per pass. Heads are an explicit dim of the attention kernels, so a
head is never split across devices: the head count must divide by that axis (checked with the
layouts). Key/value kernels split their kv_heads where the axis divides them, else stay
replicated while the queries split (each device repeats the key/value heads its queries read).
The token embedding is looked up by gathering from its value, which works with the table
sharded on either dim (a resource gather refuses a vocab-sharded table).

Packed windows (data.packing: true): the input is [batch, 3, context] instead of [batch, context]
tokens: row 0 the token ids, row 1 each token's segment (1, 2, ... per example of the window, 0
for padding), row 2 its position in its example (0 at the example's first token). A position
then attends only to positions at or before it in its own segment, and learned positions and
rope use row 2, so each example computes what it would alone in a window of its own. No weight
changes: the same checkpoint runs either input.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dtcli.layout import WeightInfo
from dtcli.mesh import UNSHARDED
from dtcli.recipe import TransformerConfig


def build(
    cfg: TransformerConfig,
    vocab: int,
    compute: Any = None,
    example_shape: tuple[int, ...] | None = None,
    adapters: Any = None,
) -> Any:
    """The GPT as a Functional tf_keras.Model: int tokens [batch, context] (or a packed window
    [batch, 3, context]) -> logits [batch, context, vocab]. `vocab`: the tables' rows
    (model_vocab). `compute` (models.compute.Compute): how its layers read their weights (FSDP
    gather, bf16); default float32, no gather. `example_shape`: one example as the data gives
    it, (context,) or packed (3, context); default (model.transformer.context,). `adapters`:
    LoRA's, by kernel path (models.lora.adapters); none by default."""
    import tf_keras

    # Imported here, not at the top: the layers import TensorFlow (plan and config do not).
    from dtcli.models import gpt_layers as g
    from dtcli.models.norms import norm_layer

    c = compute or g.FLOAT32
    shape = tuple(example_shape or (cfg.context,))
    adapters = adapters or g.NO_ADAPTERS
    token_embedding = g.Embedding(cfg, vocab, "token_embedding", c)
    window = tf_keras.Input(shape, dtype="int32", name="tokens")
    # Packed: each block's attention mask and the positions, made once from the window.
    packing: dict[str, Any] = {}
    ids = window
    if is_packed(shape):
        ids, packing["keep"], packing["positions"] = g.PackedWindow(name="packed_window")(window)
    x = token_embedding(ids)
    if cfg.positions == "learned":
        at = {"positions": packing["positions"]} if packing else {}
        x = g.PositionEmbedding(cfg, "position_embedding", c)(x, **at)
    x = tf_keras.layers.Dropout(cfg.dropout, name="dropout")(x)
    for i in range(cfg.layers):
        x = g.Block(cfg, f"block_{i}", c, adapters)(x, **packing)
    x = norm_layer(cfg, "ln_f", c)(x)
    if cfg.tie_embeddings:
        logits = g.TiedHead(token_embedding, "head", c)(x)
    else:
        logits = g.Dense(vocab, False, g.STD, "head", c, adapters.get("head.kernel"))(x)
    if masks_vocab(cfg, vocab):
        logits = g.VocabMask(cfg.vocab_size, "vocab_mask")(logits)
    return tf_keras.Model(window, logits, name="gpt")


@contextmanager
def any_window(module: Any) -> Iterator[None]:
    """While it lasts, the built GPT `module` takes unpacked windows of any length up to its
    context ([batch, length] tokens -> [batch, length, vocab] logits). Its layers already
    compute on the length they are given (the causal mask, the first `length` learned positions
    or rope angles); only the Functional model's input check, made at the context's length,
    refuses a shorter one. Positions before the end of a window see exactly what they would
    in a full one, so a short request need not be padded to the whole context (lm-eval's
    loglikelihood batches)."""
    had = "_manual_input_spec" in module.__dict__
    kept = module.__dict__.get("_manual_input_spec")
    module.input_spec = None  # tf-keras' setter: no check of the input's shape
    try:
        yield
    finally:
        if had:
            module.input_spec = kept
        else:
            del module._manual_input_spec


PACKED_ROWS = 3  # a packed window's rows: token ids, segment ids, position ids


def is_packed(example_shape: tuple[int, ...]) -> bool:
    """Whether one example of this shape is a packed window (3, context), not (context,)."""
    return len(example_shape) == 2 and example_shape[0] == PACKED_ROWS


def window(example_shape: tuple[int, ...]) -> int:
    """The tokens of one window of a language model's example shape, packed or not."""
    return int(example_shape[-1])


def masks_vocab(cfg: TransformerConfig, vocab: int) -> bool:
    """Whether the model's tables have rows past its real vocabulary, masked in its output."""
    return cfg.vocab_size is not None and cfg.vocab_size < vocab


def weights(cfg: TransformerConfig, vocab: int) -> list[WeightInfo]:
    """Every weight `build` makes (path, shape, owning layer class), in the order the built
    model lists them (models.keras.keras_variables: the model's layers in order, and inside a
    layer its attributes sorted by name), from the config alone: no TensorFlow, so a memory
    plan can be made before anything is allocated. A test compares it with the built model."""
    d, heads, kv, head_dim, hidden = (
        cfg.d_model,
        cfg.heads,
        cfg.key_heads,
        cfg.head_dim,
        cfg.hidden,
    )

    def dense(path: str, kernel: tuple[int, ...], bias: tuple[int, ...], layer: str) -> list:
        own = [WeightInfo(f"{path}.bias", bias, layer)] if cfg.bias else []
        return own + [WeightInfo(f"{path}.kernel", kernel, layer)]

    def norm(path: str) -> list:
        if cfg.norm == "rmsnorm":
            return [WeightInfo(f"{path}.gamma", (d,), "RMSNormalization")]
        beta = [WeightInfo(f"{path}.beta", (d,), "LayerNormalization")] if cfg.bias else []
        return beta + [WeightInfo(f"{path}.gamma", (d,), "LayerNormalization")]

    out = [WeightInfo("token_embedding.embeddings", (vocab, d), "Embedding")]
    if cfg.positions == "learned":
        rows = cfg.position_rows
        out.append(WeightInfo("position_embedding.embeddings", (rows, d), "PositionEmbedding"))
    attention = {
        "key": ((d, kv, head_dim), (kv, head_dim)),
        "proj": ((heads, head_dim, d), (d,)),
        "query": ((d, heads, head_dim), (heads, head_dim)),
        "value": ((d, kv, head_dim), (kv, head_dim)),
    }
    mlp = {"fc": ((d, hidden), (hidden,)), "proj": ((hidden, d), (d,))}
    if cfg.activation == "swiglu":
        mlp["gate"] = mlp["fc"]
    for i in range(cfg.layers):
        b = f"block_{i}"
        for part in sorted(attention):  # attribute names, sorted
            out += dense(f"{b}.attention.{part}", *attention[part], "EinsumDense")
        out += norm(f"{b}.ln_1") + norm(f"{b}.ln_2")
        for part in sorted(mlp):
            out += dense(f"{b}.mlp.{part}", *mlp[part], "Dense")
    out += norm("ln_f")
    if not cfg.tie_embeddings:
        out.append(WeightInfo("head.kernel", (d, vocab), "Dense"))
    return out


def parameters(cfg: TransformerConfig, vocab: int) -> int:
    """Trainable parameters (arithmetic, no TensorFlow)."""
    return sum(math.prod(w.shape) for w in weights(cfg, vocab))


def flops_per_token(cfg: TransformerConfig, vocab: int, context: int) -> float:
    """Training FLOPs per token: 6 per weight (forward 2, backward 4; every weight but the
    position table: swiglu's three MLP matrices and grouped-query attention's smaller key/value
    kernels as they are) plus the attention scores and weighted sums over `context` positions
    (PaLM's appendix B estimate, as nanoGPT's MFU)."""
    positions = cfg.position_rows * cfg.d_model if cfg.positions == "learned" else 0
    matmul_weights = parameters(cfg, vocab) - positions
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
