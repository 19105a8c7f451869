"""model.transformer's architecture options (activation, norm, positions, key/value heads, the
real vocabulary): the weights by arithmetic equal the built model's for every combination; a
Llama-like and a GPT-2 config compute Hugging Face's log probabilities on the same weights (copied
here by the documented mapping), on one device and on batch=2,model=2 (Megatron rules, and FSDP);
the padded vocabulary is masked everywhere.

transformers and torch are references only (dtcli never imports them); their models here are
tiny and random, built with from_config."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from dtcli import recipe
from dtcli.autoplan.candidates import gpt_tensor_parallel
from dtcli.models import transformer

VOCAB, TABLE, CONTEXT, BATCH = 100, 128, 16, 4
U = recipe.UNSHARDED


def small(**kw) -> recipe.TransformerConfig:
    base = dict(layers=2, d_model=32, heads=4, context=CONTEXT)
    return recipe.TransformerConfig(**{**base, **kw})


def test_weights_by_arithmetic_equal_the_built_model_for_every_option(cpu8):
    from dtcli.models.keras import keras_variables

    # Every combination of the options that shape the weights, key/value heads in turn (they
    # change the key/value kernels' shapes alone): 32 models, not 96.
    options = itertools.product(
        ["gelu_tanh", "swiglu"], ["layernorm", "rmsnorm"], ["learned", "rope"], [True, False]
    )
    for i, (activation, norm, positions, bias) in enumerate(list(options) * 2):
        tie, kv = i < 16, (4, 2, 1)[i % 3]
        cfg = small(
            layers=1,
            activation=activation,
            norm=norm,
            positions=positions,
            kv_heads=kv,
            bias=bias,
            tie_embeddings=tie,
            mlp_hidden=40,
            max_positions=24,
            vocab_size=VOCAB,
        )
        built = transformer.build(cfg, TABLE)
        listed = [(p, tuple(v.shape), o, v.trainable) for p, v, o in keras_variables(built)]
        arithmetic = [
            (w.path, w.shape, w.layer, w.trainable) for w in transformer.weights(cfg, TABLE)
        ]
        assert arithmetic == listed, cfg
        assert transformer.parameters(cfg, TABLE) == built.count_params(), cfg


# --- Hugging Face references -------------------------------------------------------------------


def perturbed(model: torch.nn.Module, seed: int) -> dict[str, np.ndarray]:
    """Every parameter of `model` set to random values (norm weights around 1, biases around 0,
    so a swap of gamma and beta or a missing norm shows), as numpy arrays by name."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.1
            p.copy_(
                1.0 + noise
                if "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
                else noise * 2
            )
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def padded_rows(table: np.ndarray, rows: int) -> np.ndarray:
    return np.concatenate([table, np.zeros((rows - len(table), *table.shape[1:]), table.dtype)])


def llama_weights(sd: dict, cfg: recipe.TransformerConfig) -> dict[str, np.ndarray]:
    """dtcli's weights from a LlamaForCausalLM state dict (the shared spec's mapping)."""
    d, hd = cfg.d_model, cfg.head_dim
    out = {"token_embedding.embeddings": padded_rows(sd["model.embed_tokens.weight"], TABLE)}
    for i in range(cfg.layers):
        hf, b = f"model.layers.{i}.", f"block_{i}."
        for part, heads in (("q", cfg.heads), ("k", cfg.key_heads), ("v", cfg.key_heads)):
            name = {"q": "query", "k": "key", "v": "value"}[part]
            kernel = sd[f"{hf}self_attn.{part}_proj.weight"].T.reshape(d, heads, hd)
            out[f"{b}attention.{name}.kernel"] = kernel
        o = sd[f"{hf}self_attn.o_proj.weight"].T.reshape(cfg.heads, hd, d)
        out[f"{b}attention.proj.kernel"] = o
        out[f"{b}ln_1.gamma"] = sd[f"{hf}input_layernorm.weight"]
        out[f"{b}ln_2.gamma"] = sd[f"{hf}post_attention_layernorm.weight"]
        for hf_name, name in (("gate_proj", "gate"), ("up_proj", "fc"), ("down_proj", "proj")):
            out[f"{b}mlp.{name}.kernel"] = sd[f"{hf}mlp.{hf_name}.weight"].T
    out["ln_f.gamma"] = sd["model.norm.weight"]
    out["head.kernel"] = padded_rows(sd["lm_head.weight"], TABLE).T
    return out


def gpt2_weights(sd: dict, cfg: recipe.TransformerConfig) -> dict[str, np.ndarray]:
    """dtcli's weights from a GPT2LMHeadModel state dict (the shared spec's mapping)."""
    d, h, hd = cfg.d_model, cfg.heads, cfg.head_dim
    t = "transformer."
    out = {
        "token_embedding.embeddings": padded_rows(sd[f"{t}wte.weight"], TABLE),
        "position_embedding.embeddings": sd[f"{t}wpe.weight"],
    }
    for i in range(cfg.layers):
        hf, b = f"{t}h.{i}.", f"block_{i}."
        kernels = np.split(sd[f"{hf}attn.c_attn.weight"], 3, axis=1)
        biases = np.split(sd[f"{hf}attn.c_attn.bias"], 3)
        for name, kernel, bias in zip(("query", "key", "value"), kernels, biases):
            out[f"{b}attention.{name}.kernel"] = kernel.reshape(d, h, hd)
            out[f"{b}attention.{name}.bias"] = bias.reshape(h, hd)
        out[f"{b}attention.proj.kernel"] = sd[f"{hf}attn.c_proj.weight"].reshape(h, hd, d)
        out[f"{b}attention.proj.bias"] = sd[f"{hf}attn.c_proj.bias"]
        for n in ("ln_1", "ln_2"):
            out[f"{b}{n}.gamma"], out[f"{b}{n}.beta"] = sd[f"{hf}{n}.weight"], sd[f"{hf}{n}.bias"]
        for hf_name, name in (("c_fc", "fc"), ("c_proj", "proj")):
            out[f"{b}mlp.{name}.kernel"] = sd[f"{hf}mlp.{hf_name}.weight"]
            out[f"{b}mlp.{name}.bias"] = sd[f"{hf}mlp.{hf_name}.bias"]
    out["ln_f.gamma"], out["ln_f.beta"] = sd[f"{t}ln_f.weight"], sd[f"{t}ln_f.bias"]
    return out


LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def llama(scaling: bool) -> tuple[recipe.TransformerConfig, dict, np.ndarray]:
    """A Llama-like dtcli config, its weights copied from transformers' model, and that model's
    log probabilities [BATCH, CONTEXT, VOCAB] of random tokens (float64)."""
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    if scaling:  # head_dim 8's wavelengths (6, 167, 4443, 118k) meet each of llama3's cases
        rope = {**rope, **LLAMA3, "rope_type": "llama3", "original_max_position_embeddings": 256}
    hf_cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_parameters=rope,
        tie_word_embeddings=False,
    )
    cfg = small(
        activation="swiglu",
        mlp_hidden=48,
        norm="rmsnorm",
        norm_eps=1e-6,
        positions="rope",
        rope_theta=500000.0,
        rope_scaling=recipe.RopeScalingConfig(**LLAMA3, original_context=256) if scaling else None,
        max_positions=512,
        kv_heads=2,
        tie_embeddings=False,
        vocab_size=VOCAB,
    )
    return cfg, *_reference(transformers.LlamaForCausalLM, hf_cfg, llama_weights, cfg)


def gpt2() -> tuple[recipe.TransformerConfig, dict, np.ndarray]:
    hf_cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=24, layer_norm_epsilon=1e-4
    )
    cfg = small(
        activation="gelu_tanh",
        norm_eps=1e-4,
        bias=True,
        max_positions=24,
        vocab_size=VOCAB,
    )
    return cfg, *_reference(transformers.GPT2LMHeadModel, hf_cfg, gpt2_weights, cfg)


def _reference(cls, hf_cfg, mapping, cfg) -> tuple[dict, np.ndarray]:
    torch.manual_seed(0)
    model = cls._from_config(hf_cfg, attn_implementation="eager").eval()
    weights = mapping(perturbed(model, 1), cfg)
    with torch.no_grad():
        logits = model(torch.tensor(TOKENS, dtype=torch.long)).logits
    return weights, torch.log_softmax(logits.double(), -1).numpy()


TOKENS = np.random.default_rng(0).integers(0, VOCAB, (BATCH, CONTEXT)).astype(np.int32)


def log_probs(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def plain_model(cfg: recipe.TransformerConfig, weights: dict) -> Any:
    """The model on plain variables holding `weights`."""
    from dtcli.models.keras import keras_variables

    model = transformer.build(cfg, TABLE)
    for path, var, _ in keras_variables(model):
        var.assign(weights[path])
    return model


def one_device(cfg: recipe.TransformerConfig, weights: dict) -> np.ndarray:
    """The model's logits of TOKENS on plain variables."""
    import tensorflow as tf

    model = plain_model(cfg, weights)
    return tf.function(lambda x: model(x, training=False))(tf.constant(TOKENS)).numpy()


@dataclass
class OnMesh:
    model: Any  # the tf_keras.Model
    mesh: Any
    plans: list


def mesh_model(cfg: recipe.TransformerConfig, weights: dict, rules: dict, fsdp: bool) -> OnMesh:
    """The model on batch=2,model=2 (4 of the 8 virtual CPUs) with layout rules (and FSDP)."""
    from dtcli import models
    from dtcli.mesh import build_mesh

    axes = {"batch": 2, "model": 2}
    r = recipe.Recipe(
        task="language_model",
        mesh=axes,
        layouts=recipe.LayoutConfig(rules=rules, fsdp=fsdp),
        model=recipe.ModelConfig(transformer=cfg),
        data=recipe.DataConfig(source="text", context=CONTEXT),
    )
    mesh = build_mesh(axes, "CPU", count=4)
    plans, _ = models.weight_plans(r, (CONTEXT,), TABLE, axes, values=False)
    assert fsdp == any("batch" in p.spec for p in plans)
    built = models.build(r, (CONTEXT,), TABLE, mesh, plans, weights)
    return OnMesh(built.module, mesh, plans)


def on_batch_axis(array: np.ndarray, mesh: Any) -> Any:
    """A host array as a DTensor split along its first dim on the batch axis (mesh None: as
    it is)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from dtcli.layout import batch_layout, replicated

    if mesh is None:
        return tf.constant(array)
    whole = dtensor.copy_to_mesh(tf.constant(array), replicated(mesh, array.ndim))
    return dtensor.relayout(whole, batch_layout(mesh, "batch", array.ndim))


def on_host(value: Any, mesh: Any) -> np.ndarray:
    from tensorflow.experimental import dtensor

    from dtcli.layout import replicated

    if mesh is None:
        return value.numpy()
    return dtensor.unpack(dtensor.relayout(value, replicated(mesh, len(value.shape))))[0].numpy()


def on_mesh(cfg: recipe.TransformerConfig, weights: dict, rules: dict, fsdp: bool) -> np.ndarray:
    """The model's logits of TOKENS on batch=2,model=2."""
    import tensorflow as tf

    m = mesh_model(cfg, weights, rules, fsdp)
    forward = tf.function(lambda x: m.model(x, training=False))
    return on_host(forward(on_batch_axis(TOKENS, m.mesh)), m.mesh)


def assert_matches(logits: np.ndarray, reference: np.ndarray) -> None:
    """dtcli's log probabilities of the real ids equal the reference's; the padding ids' are
    -inf."""
    assert logits.shape == (BATCH, CONTEXT, TABLE)
    assert np.all(np.isneginf(logits[..., VOCAB:]))
    ours = log_probs(logits)[..., :VOCAB]
    assert np.max(np.abs(ours - reference)) < 1e-5


@pytest.mark.parametrize("scaling", [False, True], ids=["rope", "llama3-rope"])
def test_a_llama_config_computes_transformers_log_probs(scaling, cpu8):
    cfg, weights, reference = llama(scaling)
    assert_matches(one_device(cfg, weights), reference)


def test_a_gpt2_config_computes_transformers_log_probs(cpu8):
    cfg, weights, reference = gpt2()
    assert_matches(one_device(cfg, weights), reference)


MEGATRON = gpt_tensor_parallel("model")


@pytest.mark.parametrize("fsdp", [False, True], ids=["megatron", "megatron+fsdp"])
def test_llama_on_batch2_model2_equals_one_device(fsdp, cpu8):
    cfg, weights, reference = llama(True)
    rules = {
        **MEGATRON,
        r"block_\d+\.mlp\.gate\.kernel": [U, "model"],
        r"head\.kernel": [U, "model"],
    }
    mesh = on_mesh(cfg, weights, rules, fsdp)
    alone = one_device(cfg, weights)
    gap = log_probs(mesh)[..., :VOCAB] - log_probs(alone)[..., :VOCAB]
    assert np.max(np.abs(gap)) < 1e-5
    assert_matches(mesh, reference)


PROMPT = 5  # tokens prefilled; the rest decoded one at a time


def cached_logits(cfg: recipe.TransformerConfig, model: Any, mesh: Any, plans: list) -> np.ndarray:
    """The logits generation's KV cache gives for TOKENS: the prefill of the first PROMPT tokens
    (the later ones of its window zeroed), then one decode step per position after them."""
    from dtcli.models import decode

    heads = decode.heads_axis(plans, None) if plans else U
    gpt = decode.CachedGPT(model, cfg, mesh, "batch", heads)
    window = np.where(np.arange(CONTEXT) < PROMPT, TOKENS, 0).astype(np.int32)
    last = np.broadcast_to(np.arange(CONTEXT) == PROMPT - 1, (BATCH, CONTEXT))
    refill = np.ones(BATCH, bool)
    put = lambda a: on_batch_axis(np.ascontiguousarray(a), mesh)  # noqa: E731
    logits, caches = gpt.prefill(put(window), put(last), put(refill), gpt.empty(BATCH))
    out = [on_host(logits, mesh)]
    for p in range(PROMPT, CONTEXT):
        at = np.broadcast_to(np.arange(CONTEXT) == p, (BATCH, CONTEXT))
        logits, caches = gpt.decode(put(TOKENS[:, p : p + 1]), put(at), caches)
        out.append(on_host(logits, mesh))
    if mesh is not None:  # the caches keep the key kernel's heads axis
        from tensorflow.experimental import dtensor

        want = ["batch", heads, U, U]
        assert list(dtensor.fetch_layout(caches[0]).sharding_specs) == want
    return np.stack(out, axis=1)  # [BATCH, CONTEXT - PROMPT + 1, TABLE]


def assert_cache_matches(cached: np.ndarray, full: np.ndarray) -> None:
    want = full[:, PROMPT - 1 :]
    assert np.all(np.isneginf(cached[..., VOCAB:]))
    assert np.max(np.abs(cached[..., :VOCAB] - want[..., :VOCAB])) < 1e-5


def test_the_kv_cache_gives_the_full_forward_at_every_position_with_rope_and_gqa(cpu8):
    cfg, weights, _ = llama(True)
    full = one_device(cfg, weights)
    assert_cache_matches(cached_logits(cfg, plain_model(cfg, weights), None, []), full)


@pytest.mark.parametrize("kv", [2, 1], ids=["kv-heads-split", "kv-heads-replicated"])
def test_the_kv_cache_on_batch2_model2_gives_the_full_forward(kv, cpu8):
    """kv_heads 2: key/value split on model like the queries; 1 (multi-query): the queries
    split, key/value (and their caches) replicated."""
    cfg, weights, _ = llama(True)
    cfg = dataclasses.replace(cfg, kv_heads=kv)
    if kv == 1:  # one key/value head: the two of the reference model averaged, say
        for name in list(weights):
            if name.endswith(("key.kernel", "value.kernel")):
                weights[name] = weights[name].mean(axis=1, keepdims=True)
    qkv = r"block_\d+\.attention\.(query|key|value)\.kernel"
    rules = {k: v for k, v in MEGATRON.items() if k != qkv}
    rules[r"block_\d+\.attention\.query\.kernel"] = [U, "model", U]
    if kv == 2:
        rules[r"block_\d+\.attention\.(key|value)\.kernel"] = [U, "model", U]
    m = mesh_model(cfg, weights, rules, False)
    assert decode_heads(m.plans) == ("model" if kv == 2 else U)
    full = one_device(cfg, weights)
    assert_cache_matches(cached_logits(cfg, m.model, m.mesh, m.plans), full)


def decode_heads(plans: list) -> str:
    from dtcli.models import decode

    return decode.heads_axis(plans, None)


# --- the masked vocabulary, plan, training options ---------------------------------------------


def test_ids_past_vocab_size_get_no_probability_in_the_loss_or_sampling(cpu8):
    """The llama model's padded head rows are 0 (logit 0, not -inf, without the mask): the
    training sums' cross-entropy is the one over the real ids alone, and sampling at a high
    temperature, with no tokenizer cap, never draws a padding id."""
    import tensorflow as tf

    from dtcli.infer.decoding import pick
    from dtcli.steps.step import sums

    cfg, weights, _ = llama(False)
    logits = one_device(cfg, weights)
    unmasked = one_device(dataclasses.replace(cfg, vocab_size=None), weights)
    assert np.all(unmasked[..., VOCAB:] == 0) and np.all(np.isneginf(logits[..., VOCAB:]))
    y = np.roll(TOKENS, -1, axis=1)
    mask = np.ones(BATCH, np.float32)
    got = float(sums(tf.constant(logits), tf.constant(y), tf.constant(mask), True)["ce_sum"])
    real = log_probs(logits[..., :VOCAB])
    want = -np.take_along_axis(real, y[..., None], -1).sum()
    assert got == pytest.approx(want, rel=1e-6)
    padded = float(sums(tf.constant(unmasked), tf.constant(y), tf.constant(mask), True)["ce_sum"])
    assert padded > want + 1.0  # the padding would have taken probability
    rng = np.random.default_rng(0)
    drawn = [
        pick(row, 100.0, None, rng) for row in logits.reshape(-1, TABLE)[:8] for _ in range(50)
    ]
    assert max(drawn) < VOCAB and len(set(drawn)) > 50


GQA_SWIGLU = (
    "model.transformer={layers: 2, d_model: 64, heads: 8, kv_heads: 2, activation: swiglu, "
    "mlp_hidden: 96, norm: rmsnorm, positions: rope, context: 16, tie_embeddings: false, "
    "vocab_size: 300}"
)


def test_plan_bytes_and_flops_count_the_built_swiglu_gqa_model(cli):
    import json

    from conftest import RECIPES

    cfg = recipe.load(RECIPES / "tiny_gpt.yaml", recipe.Overrides((GQA_SWIGLU,))).model.transformer
    built = transformer.build(cfg, 320)  # 300 ids rounded up to 64s
    params = built.count_params()
    on8 = ("--devices", "cpu:8", "--mesh", "batch=4,model=2")
    report = cli("plan", RECIPES / "tiny_gpt.yaml", *on8, "--set", GQA_SWIGLU, "--json")
    assert report.code == 0, report.err
    figures = json.loads(report.out.strip().splitlines()[-1])
    assert figures["memory_bytes"]["weights"] == 4 * params
    assert figures["batch"]["logits_per_device_shape"][-1] == 320
    # 6 FLOPs per weight (rope: no position table) + the attention's 12 * layers * d * context
    flops = transformer.flops_per_token(cfg, 320, 16)
    assert flops == 6 * params + 12 * 2 * 64 * 16


def test_rope_swiglu_gqa_trains_the_same_with_remat_and_accumulation_and_near_in_bf16(
    cpu8, tmp_path
):
    """A few AdamW steps on batch=2,model=2 (Megatron rules, key/value split): remat and two
    micro-batches give the plain run's losses (the same math), bf16 matmuls losses near them."""
    import itertools

    from conftest import RECIPES, write_corpus

    from dtcli import session as T
    from dtcli import steps as steps_lib

    corpus = write_corpus(tmp_path / "corpus.txt", 6000)
    model = (
        "model.transformer={layers: 1, d_model: 32, heads: 4, kv_heads: 2, activation: swiglu, "
        "norm: rmsnorm, positions: rope, context: 16, remat: REMAT}"
    )

    def losses(remat: bool, accumulate: int, precision: str) -> np.ndarray:
        sets = (
            f"data.path={corpus}",
            model.replace("REMAT", str(remat).lower()),
            "data.batch_size=8",
            "train.steps_per_call=4",
            f"train.accumulate={accumulate}",
            f"train.precision={precision}",
            "train.compile=dtensor",
            "optimizer.warmup_steps=0",
            "optimizer.learning_rate=1e-2",
        )
        r = recipe.load(
            RECIPES / "tiny_gpt_tensor_parallel.yaml",
            recipe.Overrides(sets, "batch=2,model=2", "cpu:8"),
        )
        s = T.prepare(r, splits=("train",), use_devices=4)
        call, _ = steps_lib.make_steps(s)
        block = list(itertools.islice(s.train_feed.epoch(0, 0, 4), 4))
        return np.asarray(steps_lib.train_block(s, call, block)["loss"])

    plain = losses(False, 1, "float32")
    assert plain[-1] < plain[0]
    np.testing.assert_allclose(losses(True, 2, "float32"), plain, rtol=1e-5)
    np.testing.assert_allclose(losses(True, 2, "bf16"), plain, rtol=2e-2)
