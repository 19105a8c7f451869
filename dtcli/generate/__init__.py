"""`dtcli generate`: text sampled from a language-model checkpoint, on any mesh.

The model is built on the target mesh and the checkpoint restored into it (as `eval` does),
without reading the training text: the run's tokenizer (RUN_DIR/tokenizer.json; bytes for a
run without one), windows of the recipe's context. Each new token comes from one compiled
forward pass over the last `context` tokens (a shorter prompt is padded on the right: a causal
model's logits at the last real position do not see the padding), the input replicated on the
mesh. Only the tokenizer's ids are ever picked (the model's vocabulary is rounded up past
them). Greedy decoding (temperature 0) takes the most likely token; sampling draws from a host
RNG seeded with --seed, so a seed gives the same text every time.
"""

from __future__ import annotations

import codecs
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dtcli import checkpoint as ckpt_lib
from dtcli import devices as devices_lib
from dtcli import rundir, storage
from dtcli.errors import UsageError
from dtcli.recipe import Overrides, Recipe

# One compiled forward pass per token: a million takes hours on a CPU; more is a typo.
MAX_TOKENS = 1_000_000


def check_options(
    tokens: int, temperature: float, top_k: int | None, prompt: str | bytes, seed: int = 0
) -> None:
    if not 1 <= tokens <= MAX_TOKENS:
        raise UsageError(f"--tokens {tokens}: expected an integer from 1 to {MAX_TOKENS:,}")
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise UsageError(f"--temperature {temperature}: expected a number >= 0 (0: greedy)")
    if top_k is not None and top_k < 1:
        raise UsageError(f"--top-k {top_k}: expected a positive integer")
    if not prompt:
        raise UsageError("--prompt: expected at least one character")
    if not 0 <= seed < 2**32:
        raise UsageError(f"--seed {seed}: expected an integer from 0 to 2**32 - 1")


def prompt_bytes(prompt: str | bytes) -> bytes:
    """The prompt's bytes: bytes that are not UTF-8 (a command line passes them to Python as
    surrogate escapes, like os.fsencode) stay as given (the byte vocabulary covers any byte)."""
    if isinstance(prompt, bytes):
        return prompt
    try:
        return prompt.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError as exc:
        raise UsageError(f"--prompt: {exc.reason} at character {exc.start + 1}") from None


def stream(
    path: Path,
    prompt: str | bytes,
    tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    mesh: str | None = None,
    devices: str | None = None,
    use_devices: int | None = None,
) -> Iterator[str]:
    """`tokens` new tokens after `prompt`, their bytes decoded as UTF-8 (invalid sequences
    replaced), as they are sampled: a piece per token (bytes that end no UTF-8 character yet,
    or an end-of-document token, give ""), so a caller can print it as it comes and keep it
    on Ctrl-C; "".join() gives the whole text.
    `use_devices`: the mesh over only the first N devices (see session.prepare)."""
    check_options(tokens, temperature, top_k, prompt, seed)
    prompt_bytes(prompt)  # before any work
    found = rundir.find_checkpoint(storage.as_path(path))
    recipe = rundir.checkpoint_recipe(found, Overrides(mesh=mesh, devices=devices))
    if recipe.task != "language_model":
        raise UsageError(
            f"CHECKPOINT {str(path)!r}: generate needs a language model (task language_model); "
            f"this run's task is {recipe.task}"
        )
    session = _restored_session(found, recipe, use_devices, devices_lib.key_for(devices))
    context = session.data.input_shape[0]
    tokenizer = session.data.tokenizer  # text and tokens, the language-model sources, give one
    vocab = tokenizer.vocab_size
    if top_k is not None and top_k > vocab:
        raise UsageError(f"--top-k {top_k}: expected at most the vocabulary, {vocab}")
    logits_at = _next_logits(session)
    from tensorflow.experimental import dtensor

    from dtcli.layout import replicated

    mesh_ = session.mesh
    rng = np.random.default_rng(seed)
    sequence = [int(i) for i in _encode(tokenizer, prompt_bytes(prompt))]
    pieces = tokenizer.pieces()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for _ in range(tokens):
        window = sequence[-context:]
        padded = np.zeros((1, context), np.int32)
        padded[0, : len(window)] = window
        x = dtensor.copy_to_mesh(padded, replicated(mesh_, 2))
        at = dtensor.copy_to_mesh(np.arange(context) == len(window) - 1, replicated(mesh_, 1))
        row = dtensor.unpack(logits_at(x, at))[0].numpy().astype(np.float64)
        token = pick(row, temperature, top_k, rng, vocab)
        sequence.append(token)
        yield decoder.decode(pieces[token])
    yield decoder.decode(b"", final=True)


def _encode(tokenizer: Any, prompt: bytes) -> np.ndarray:
    ids = tokenizer.encode(prompt)
    if not len(ids):
        raise UsageError("--prompt: it encodes to no token")
    return ids


def _restored_session(
    found: Path, recipe: Recipe, use_devices: int | None, devices_key: str
) -> Any:
    """A session on the target mesh, without data, with the checkpoint restored into it."""
    from dtcli import tfruntime

    tfruntime.import_tensorflow()  # without its native start-up notices
    from dtcli import session as session_lib
    from dtcli.layout import layout_warnings

    session = session_lib.prepare(
        recipe,
        splits=(),
        use_devices=use_devices,
        devices_key=devices_key,
        tokenizer_file=rundir.tokenizer_file(found),
    )
    rules = recipe.layouts.rules
    # As `train` and `plan` say it: a --mesh axis no rule splits along only copies the work.
    for warning in layout_warnings(rules, session.plans, session.axes, recipe.layouts.data_axis):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    ckpt = ckpt_lib.Checkpointer(found.parent, {"model": session.model.module}, keep=1)
    ckpt.restore(found, session.model.weights, partial=True)
    return session


def _next_logits(session: Any) -> Any:
    """The compiled forward pass: a window of tokens in, the logits at one position out."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from dtcli.layout import replicated

    model = session.model
    mesh_ = session.mesh

    @tf.function(autograph=model.needs_autograph)
    def logits_at(window: tf.Tensor, at: tf.Tensor) -> tf.Tensor:
        """`at`: [context] bool, true at the last prompt position (a position as an int
        would be folded into the program by DTensor and lowered again: Packer.flags)."""
        out = model.forward(window, training=False)  # [1, context, vocab]
        row = tf.reduce_sum(out[0] * tf.cast(at, out.dtype)[:, None], axis=0)
        return dtensor.relayout(row, replicated(mesh_, 1))

    return logits_at


def pick(
    logits: np.ndarray,
    temperature: float,
    top_k: int | None,
    rng: np.random.Generator,
    vocab: int | None = None,
) -> int:
    """The next token: the most likely (temperature 0), or a draw from the softmax of
    logits / temperature over the top_k most likely; only ids below `vocab` (the tokenizer's:
    the model's vocabulary is rounded up past it, and those ids are never a token)."""
    if vocab is not None and vocab < len(logits):
        logits = np.concatenate([logits[:vocab], np.full(len(logits) - vocab, -np.inf)])
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = logits / temperature
    if top_k is not None and top_k < len(scaled):
        cut = np.sort(scaled)[-top_k]
        scaled = np.where(scaled < cut, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    return int(rng.choice(len(probs), p=probs))
