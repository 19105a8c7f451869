"""`dtcli score`: each token's log probability equals log_softmax of the model's own forward
pass over the text's window (numpy), on one device and on batch=2,model=2; the sliding window
scores every token once (stride = context: the same as each window alone); sum, count,
perplexity and bits per byte agree, the bytes being UTF-8 bytes; the tokens are the tokenizer's
for the whole text in one call (a post-processor's BOS included); --json's keys; its refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import ROOT, run_cli, write_corpus

from dtcli import score
from dtcli.data import tokenizer as tokenizer_lib
from dtcli.data.document import encode_document
from dtcli.score import windows as windows_lib

# Checked: log probabilities equal to numpy's log_softmax of the
# model's own forward pass (1e-5) and to other meshes' and windows'; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

CONTEXT = 16
# recipes/tiny_gpt_tensor_parallel.yaml shrunk (4 heads: split 2 ways on model=2), a byte-level
# BPE of 300 ids (the model's vocabulary 320: ids the tokenizer never makes), a few steps on
# batch=8 (the distribution is no longer near uniform: a shifted target would show).
TRAIN = [
    f"model.transformer={{layers: 1, d_model: 32, heads: 4, mlp_ratio: 2, context: {CONTEXT}}}",
    "data.tokenizer=bpe:300",
    "data.batch_size=16",
    "data.eval_batch_size=8",
    "train.steps_per_call=20",
    "train.steps=40",
    "train.eval_every=40",
    "optimizer.learning_rate=1e-2",
    "optimizer.warmup_steps=5",
]
MULTIBYTE = "Café – ½ € 😀 naïve “quotes”"
LONG = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n"
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cpu8):
    folder = tmp_path_factory.mktemp("score")
    corpus = write_corpus(folder / "corpus.txt", 20_000)
    sets = [x for s in (f"data.path={corpus}", *TRAIN) for x in ("--set", s)]
    recipe = ROOT / "recipes" / "tiny_gpt_tensor_parallel.yaml"
    out = folder / "run"
    r = run_cli("train", recipe, *sets, "--mesh", "batch=8", "--devices", "cpu:8", "--out", out)
    assert r.code == 0, r.err
    return out


# Score's windows run in batches of data.eval_batch_size: 4 here, so a long text takes several
# batches, the last padded.
@pytest.fixture(scope="module")
def one(run_dir):
    sets = ("data.eval_batch_size=4",)
    return score.Scorer.restored(run_dir, "batch=1", "cpu:8", use_devices=1, sets=sets)


@pytest.fixture(scope="module")
def tp(run_dir):
    sets = ("data.eval_batch_size=4",)
    return score.Scorer.restored(run_dir, "batch=2,model=2", "cpu:8", use_devices=4, sets=sets)


def text(value: str) -> score.Text:
    return score.Text(value, "--text")


def model_logprobs(scorer: score.Scorer, ids: np.ndarray) -> np.ndarray:
    """log p(ids[j + 1] | ids[0..j]) for every j: the model's own forward pass over `ids` (at
    most the context + 1 tokens, right-padded), then log_softmax in numpy (float64)."""
    import tensorflow as tf

    assert scorer.session.xla  # plain variables: the model runs eagerly on plain tensors
    window = np.zeros((1, CONTEXT), np.int32)
    window[0, : len(ids) - 1] = ids[:-1]
    logits = scorer.session.model.forward(tf.constant(window), training=False).numpy()[0]
    logits = logits.astype(np.float64)
    top = logits.max(axis=-1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
    return log_softmax[np.arange(len(ids) - 1), ids[1:]]


def test_a_text_within_the_context_is_log_softmax_of_the_models_forward(one):
    got = one.score(text("ROMEO:\nBut soft"))
    assert 2 < len(got.tokens) <= CONTEXT + 1 and got.windows == 1
    expected = model_logprobs(one, got.tokens)
    np.testing.assert_allclose(got.logprobs, expected, atol=1e-5, rtol=0)
    assert np.ptp(expected) > 1.0  # trained: far from uniform, a shifted target would show


def test_a_long_text_every_token_once_from_the_window_the_stride_gives(one):
    """Default stride (context // 2): prediction k comes from the first window (starts 0,
    stride, ... and a last one ending at the last prediction) that holds position k, with
    at least context - stride tokens before it (all of them in the first window)."""
    got = one.score(text(LONG))
    n, stride = len(got.tokens), CONTEXT // 2
    assert got.stride == stride and n > 4 * CONTEXT and got.count == n - 1
    m = n - 1
    starts = sorted({*range(0, m - CONTEXT, stride), m - CONTEXT})
    assert got.windows == len(starts) > 4  # more than one batch of 4 rows
    for k in range(m):
        s = min(s for s in starts if s + CONTEXT > k)
        assert k - s >= min(k, CONTEXT - stride)
        window = got.tokens[s : s + CONTEXT + 1]
        assert got.logprobs[k] == pytest.approx(model_logprobs(one, window)[k - s], abs=1e-5), k


def test_stride_context_scores_each_window_as_a_text_of_its_own(one):
    """A text of 3 contexts + 1 tokens with stride = context: the three windows do not overlap,
    and each scores what that window's tokens (and the next one) give scored alone."""
    ids = encode_document(one.tokenizer, LONG)[0][: 3 * CONTEXT + 1]
    whole = one.logprobs(ids, windows_lib.windows(len(ids), CONTEXT, CONTEXT))
    alone = [model_logprobs(one, ids[i * CONTEXT : (i + 1) * CONTEXT + 1]) for i in range(3)]
    np.testing.assert_allclose(whole, np.concatenate(alone), atol=1e-5, rtol=0)
    assert len(windows_lib.windows(len(ids), CONTEXT, CONTEXT)) == 3


def test_the_same_on_batch2_model2_as_on_one_device(one, tp):
    assert tp.rows_for(7) == 4 and tp.rows_for(3) == 4 and tp.rows_for(1) == 2  # padded
    for value, stride in ((LONG, None), (LONG, 5), ("O Romeo", None)):
        a, b = one.score(text(value), stride), tp.score(text(value), stride)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_sum_count_perplexity_and_bits_per_utf8_byte_agree(one):
    got = one.score(text(MULTIBYTE))
    pieces = one.tokenizer.pieces()  # a byte-level BPE: each token's exact bytes
    covered = sum(len(pieces[t]) for t in got.tokens[1:])
    assert covered == len(MULTIBYTE.encode()) - len(pieces[got.tokens[0]])
    assert got.text_bytes == covered and covered > len(MULTIBYTE) + 10  # bytes, not characters
    assert got.count == len(got.tokens) - 1 == len(got.logprobs)
    assert got.sum == pytest.approx(float(np.sum(got.logprobs, dtype=np.float64)), rel=1e-12)
    assert got.perplexity == pytest.approx(math.exp(-got.sum / got.count), rel=1e-12)
    assert got.bits_per_byte == pytest.approx(-got.sum / math.log(2) / covered, rel=1e-12)


def test_json_is_exactly_its_keys_and_the_summary_its_figures(run_dir, one, monkeypatch):
    """The command on the run's own mesh (batch=8): the library's numbers. Into a pipe its
    heartbeat goes to stderr (here a restore held until it spoke), stdout holds only the JSON."""
    from conftest import StampedStream, run_cli_into

    from dtcli import progress

    monkeypatch.setattr(progress, "BEAT_EVERY", 0.05)
    err, restored = StampedStream(), score.Scorer.restored

    def restored_once_it_spoke(*args, **kwargs):
        assert err.wait_for(1, "score: restoring the checkpoint on the mesh... ")
        return restored(*args, **kwargs)

    monkeypatch.setattr(score.Scorer, "restored", restored_once_it_spoke)
    r = run_cli_into(err, "score", run_dir, "--text", MULTIBYTE, "--json")
    assert r.code == 0, r.err
    assert all(line.startswith("score: ") for line in r.err_lines), r.err
    assert len(r.out.splitlines()) == 1
    found = json.loads(r.out)
    assert list(found) == ["tokens", "logprobs", "sum", "count", "perplexity", "bits_per_byte"]
    mine = one.score(text(MULTIBYTE))
    assert found["tokens"] == mine.tokens.tolist() and found["count"] == mine.count
    np.testing.assert_allclose(found["logprobs"], mine.logprobs, atol=1e-5, rtol=0)
    assert found["sum"] == pytest.approx(sum(found["logprobs"]), rel=1e-9)
    assert found["bits_per_byte"] == pytest.approx(mine.bits_per_byte, rel=1e-6)
    summary = run_cli("score", run_dir, "--text", MULTIBYTE, "--no-progress")
    assert summary.code == 0, summary.err
    shown = " ".join(summary.out.split())
    for figure in (
        f"scored {mine.count}",
        f"perplexity {found['perplexity']:.6f}",
        f"bits_per_byte {found['bits_per_byte']:.6f}",
    ):
        assert figure in shown, summary.out


def test_one_token_and_a_stride_past_the_context_are_refused(run_dir, tmp_path):
    lines = {
        "one token": run_cli("score", run_dir, "--text", "O", "--no-progress"),
        "stride": run_cli("score", run_dir, "--text", LONG, "--stride", "17", "--no-progress"),
    }
    for name, r in lines.items():
        assert r.code == 2 and len(r.err_lines) == 1 and not r.out, (name, r.err)
    assert lines["one token"].err_lines[0].startswith("error: --text: the text is 1 token (")
    assert "nothing to score" in lines["one token"].err_lines[0]
    assert lines["stride"].err_lines[0] == (
        "error: --stride 17: expected at most the model's context, 16 tokens (a larger stride "
        "would leave tokens unscored)"
    )


# --------------------------------------------------------------------------- no model


@pytest.mark.parametrize("tokens", [2, 3, 16, 17, 18, 40, 97])
@pytest.mark.parametrize("stride", [1, 5, 8, 16])
def test_windows_score_every_prediction_once_in_order_in_whole_windows(tokens, stride):
    found = windows_lib.windows(tokens, CONTEXT, stride)
    scored = [k for w in found for k in range(w.scored, w.end)]
    assert scored == list(range(tokens - 1))
    for w in found:
        assert w.end - w.start == min(CONTEXT, tokens - 1) and w.start <= w.scored < w.end
        assert w.scored - w.start >= min(w.scored, CONTEXT - stride)


def test_the_batch_of_windows_is_their_tokens_targets_and_scored_positions():
    ids = np.arange(100, 140)
    found = windows_lib.windows(len(ids), CONTEXT, 8)
    inputs, targets, scored = windows_lib.batch(ids, found[1:3], CONTEXT, 4)
    w = found[1]
    np.testing.assert_array_equal(inputs[0], ids[w.start : w.start + CONTEXT])
    np.testing.assert_array_equal(targets[0], ids[w.start + 1 : w.start + CONTEXT + 1])
    assert scored[0].tolist() == [False] * 8 + [True] * 8
    assert not inputs[2:].any() and not scored[2:].any()  # padding rows


def test_a_tokenizer_json_encodes_the_whole_text_with_its_template_and_byte_ends():
    """The post-processor's BOS is token 0 and covers no text (every byte is scored after
    it); each token's end is counted in UTF-8 bytes from `tokenizers`' character offsets."""
    from tokenizers import processors

    bpe = tokenizer_lib.train_bpe([MULTIBYTE * 20, LONG], 300)
    ids, ends = encode_document(bpe, MULTIBYTE)
    np.testing.assert_array_equal(ids, bpe.encode(MULTIBYTE.encode()))
    np.testing.assert_array_equal(ends, np.cumsum([len(bpe.pieces()[i]) for i in ids]))
    bos = bpe.tok.token_to_id(tokenizer_lib.EOT_TOKEN)
    bpe.tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    with_bos, bos_ends = encode_document(tokenizer_lib.HFTokenizer(bpe.tok, "bpe"), MULTIBYTE)
    assert with_bos[0] == bos and bos_ends[0] == 0
    np.testing.assert_array_equal(with_bos[1:], ids)
    byte_ids, byte_ends = encode_document(tokenizer_lib.ByteTokenizer(), MULTIBYTE)
    assert bytes(byte_ids.astype(np.uint8)) == MULTIBYTE.encode()
    np.testing.assert_array_equal(byte_ends, np.arange(1, len(MULTIBYTE.encode()) + 1))


def test_a_file_that_is_no_text_is_refused_and_text_is_read_whole(tmp_path):
    from dtcli.errors import UsageError

    path = tmp_path / "t.txt"
    path.write_text(MULTIBYTE + "\n\nsecond paragraph\n")
    assert score.read_text(None, str(path)).text == MULTIBYTE + "\n\nsecond paragraph\n"
    path.write_bytes(b"abc\xff")
    with pytest.raises(UsageError, match=r"not UTF-8 text \(byte 0xff at offset 3\)"):
        score.read_text(None, str(path))


# --------------------------------------------------------------------------- against transformers

# LlamaConfig's names -> model.transformer's (the shared mapping of issue 39).
LLAMA = {
    "vocab_size": 300,  # no multiple of 64: the model's vocabulary is 320, ids 300..319 masked
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention: 2 query heads per K/V head
    "rms_norm_eps": 1e-6,
    "rope_theta": 5000.0,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
LLAMA_TRANSFORMER = (
    "{layers: 2, d_model: 64, heads: 4, kv_heads: 2, activation: swiglu, mlp_hidden: 96, "
    "norm: rmsnorm, norm_eps: 1.0e-6, positions: rope, rope_theta: 5000.0, max_positions: 64, "
    "vocab_size: 300, bias: false, tie_embeddings: false, context: 64}"
)


def llama_weights(state: dict, layers: int, heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    """A LlamaForCausalLM's state dict as dtcli's weights, by the shared mapping: [out, in]
    projections transposed, q/k/v split into heads, o_proj into [heads, head_dim, d_model]."""
    t = {k.removeprefix("model."): v.float().numpy() for k, v in state.items()}
    d = t["embed_tokens.weight"].shape[1]
    head_dim = d // heads
    out = {
        "token_embedding.embeddings": t["embed_tokens.weight"],
        "ln_f.gamma": t["norm.weight"],
        "head.kernel": t["lm_head.weight"].T,
    }
    for i in range(layers):
        hf, ours = f"layers.{i}.", f"block_{i}."
        out[ours + "ln_1.gamma"] = t[hf + "input_layernorm.weight"]
        out[ours + "ln_2.gamma"] = t[hf + "post_attention_layernorm.weight"]
        for name, theirs, n in (
            ("query", "q", heads),
            ("key", "k", kv_heads),
            ("value", "v", kv_heads),
        ):
            kernel = t[f"{hf}self_attn.{theirs}_proj.weight"].T
            out[f"{ours}attention.{name}.kernel"] = kernel.reshape(d, n, head_dim)
        proj = t[hf + "self_attn.o_proj.weight"].T
        out[ours + "attention.proj.kernel"] = proj.reshape(heads, head_dim, d)
        for name, theirs in (("gate", "gate"), ("fc", "up"), ("proj", "down")):
            out[f"{ours}mlp.{name}.kernel"] = t[f"{hf}mlp.{theirs}_proj.weight"].T
    return out


def test_a_llama_like_model_scores_as_transformers_llama_does(cpu8):
    """SwiGLU, RMSNorm (weights away from 1, so a swap shows), RoPE of theta 5000, 4 query heads
    on 2 K/V heads, an untied head, vocab_size 300 (the model's 320 rows: the 20 past it take no
    probability): score's log probabilities are LlamaForCausalLM's on the same weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from dtcli import recipe as R
    from dtcli import session as session_lib

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    with torch.no_grad():
        for name, weight in hf.named_parameters():
            if name.endswith("norm.weight"):
                weight.normal_(1.0, 0.3)
    sets = (f"model.transformer={LLAMA_TRANSFORMER}",)
    overrides = R.Overrides(sets, mesh="batch=1", devices="cpu:8")
    recipe = R.load(ROOT / "recipes" / "tiny_gpt.yaml", overrides, command="score")
    session = session_lib.prepare(recipe, splits=(), use_devices=1, command="score")
    weights = llama_weights(hf.state_dict(), 2, 4, 2)
    assert set(weights) == set(session.model.variables)  # every weight, nothing else
    for path, value in weights.items():
        variable = session.model.variables[path]
        padded = np.zeros(variable.shape, np.float32)  # the vocabulary's padding: 0s
        padded[tuple(slice(0, n) for n in value.shape)] = value
        variable.assign(padded)
    got = score.Scorer(session).score(text(MULTIBYTE))  # byte tokens: within the context
    ids = got.tokens.astype(np.int64)
    assert 1 < len(ids) <= 65 and got.windows == 1
    with torch.no_grad():
        logits = hf(torch.tensor(ids[None])).logits[0].double()
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), ids[1:]].numpy()
    np.testing.assert_allclose(got.logprobs, expected, atol=1e-4, rtol=0)
