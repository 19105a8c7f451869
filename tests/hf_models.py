"""Small Hugging Face model folders for the tests: a tokenizer.json trained by `tokenizers` on a
few lines, and config.json + model.safetensors either written here with NumPy (`numpy_gpt2`:
no torch, for the bad-input table) or made by transformers (`gpt2`, `llama`: random models
from `from_config`, their norm weights moved away from 1 and 0 so that a swap shows)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

LINES = [
    "First Citizen: Before we proceed any further, hear me speak.",
    "All: Speak, speak. You are all resolved rather to die than to famish?",
    "We are accounted poor citizens, the patricians good.",
    "What authority surfeits on would relieve us: if they would yield us but the superfluity.",
] * 4


def tokenizer_json(folder: Path, vocab_size: int = 100) -> int:
    """A byte-level BPE of at most `vocab_size` ids saved as folder/tokenizer.json; its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet())[:60],
        show_progress=False,
    )
    tok.train_from_iterator(LINES, trainer)
    tok.save(str(Path(folder) / "tokenizer.json"))
    return tok.get_vocab_size()


GPT2_CONFIG = {
    "model_type": "gpt2",
    "n_layer": 1,
    "n_embd": 16,
    "n_head": 2,
    "n_positions": 16,
    "vocab_size": 131,
    "activation_function": "gelu_new",
}


def numpy_gpt2(folder: Path, config: dict | None = None, tokenizer: int = 100) -> Path:
    """A tiny GPT-2 folder written without torch (random weights)."""
    from dtcli.hf import config as hf_config
    from dtcli.hf import names, safetensors_io

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = config or GPT2_CONFIG
    (folder / "config.json").write_text(json.dumps(config))
    keys = hf_config.transformer_keys(GPT2_CONFIG)  # the shapes; `config` may be a bad one
    rng = np.random.default_rng(0)
    maps = names.mappings("gpt2", keys)
    order = [(m.hf, m.hf_shape) for m in maps]
    safetensors_io.write_model(
        folder, order, lambda n: rng.normal(size=dict(order)[n]).astype(np.float32)
    )
    tokenizer_json(folder, tokenizer)
    return folder


def _perturb_norms(model, torch) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "norm" in name or "layernorm" in name:
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))


def gpt2(folder: Path, vocab_size: int = 131, positions: int = 64, dtype: str = "float32"):
    """A random transformers GPT-2 (2 layers, 32 wide, 4 heads) saved with its tokenizer."""
    import torch
    from transformers import GPT2Config

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        n_positions=positions,
        vocab_size=vocab_size,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.2,
    )
    return _saved(cfg, folder, dtype)


def llama(folder: Path, vocab_size: int = 203, positions: int = 64, dtype: str = "float32"):
    """A random transformers Llama: 2 layers, 64 wide, 4 heads over 2 K/V heads, untied,
    rope_theta 500000, rms_norm_eps 1e-6."""
    import torch
    from transformers import LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=vocab_size,
        max_position_embeddings=positions,
        rope_theta=500000.0,
        rms_norm_eps=1e-6,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    return _saved(cfg, folder, dtype)


def _saved(cfg, folder: Path, dtype: str):
    """A random model of `cfg`, its norms perturbed, saved in `dtype` with a tokenizer.json
    beside it; returned in float32 for comparisons."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(cfg)
    _perturb_norms(model, torch)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder)
    tokenizer_json(folder)
    return model.float().eval()


# ------------------------------------------------------------------ trained on real text


def text_slice(size: int = 100_000) -> str:
    """`size` bytes of text: conftest.write_corpus's (tiny Shakespeare's start where ../shared
    has it)."""
    import tempfile

    from conftest import write_corpus

    with tempfile.TemporaryDirectory() as tmp:
        return write_corpus(Path(tmp) / "text.txt", size).read_text()


# The special tokens of each kind, as its Hugging Face tokenizer names them: GPT-2 one token for
# both ends and no template; Llama <s> added before each text by the post-processor (what
# `add_special_tokens=True`, transformers' default, applies).
SPECIALS = {
    "gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "llama": {"bos_token": "<s>", "eos_token": "</s>"},
}


def shakespeare_tokenizer(folder: Path, kind: str, text: str, vocab_size: int = 300) -> int:
    """A byte-level BPE of `vocab_size` ids trained on `text`, saved as folder/tokenizer.json with
    a tokenizer_config.json that transformers' PreTrainedTokenizerFast (lm-eval's hf model)
    loads; its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = SPECIALS[kind]
    names = list(dict.fromkeys(specials.values()))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=names,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    if kind == "llama":
        bos = specials["bos_token"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A",
            pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))],
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 10**6, **specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tok.get_vocab_size()


def trained(folder: Path, kind: str, steps: int = 200, positions: int = 64):
    """A transformers GPT-2 or Llama (2 layers, 64 wide) with a 300-id BPE of tiny Shakespeare,
    trained `steps` AdamW steps on windows of that text (not random weights: a trained model's
    logits are peaked, so near ties, which flip an argmax on float noise, are rare), saved with
    save_pretrained and its tokenizer files; -> (the model in eval mode, its final loss, its
    first)."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    text = text_slice()
    vocab = shakespeare_tokenizer(folder, kind, text)
    tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    ids = torch.tensor(tok.encode(text, add_special_tokens=False).ids)
    eot = tok.token_to_id(SPECIALS[kind]["eos_token"])
    bos = tok.token_to_id(SPECIALS[kind]["bos_token"])
    if kind == "gpt2":
        cfg = GPT2Config(
            n_layer=2, n_embd=64, n_head=4, n_positions=positions, vocab_size=vocab,
            bos_token_id=bos, eos_token_id=eot,
        )  # fmt: skip
    else:
        cfg = LlamaConfig(
            num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=vocab, max_position_embeddings=positions,
            tie_word_embeddings=False, bos_token_id=bos, eos_token_id=eot,
        )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steps this small: two threads on 2 busy cores ran 10x slower
    try:
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - positions - 1, (16,), generator=g)
            x = torch.stack([ids[s : s + positions] for s in starts])
            loss = model(x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(folder)
    return model, losses[-1], losses[0]
