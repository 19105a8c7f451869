"""`dtcli generate`: text sampled from a language-model checkpoint, on any mesh.

The model is built on the target mesh and the checkpoint restored into it (as `eval` does),
without reading the training text: the run's tokenizer (RUN_DIR/tokenizer.json; bytes for a
run without one), windows of the recipe's context under one windowing policy (loop.py: the
window restarts at the last context // 2 tokens when it is full, for both forward passes).

dtcli's GPT generates with a K/V cache (models/decode.py): each new token costs one position,
not a window; `cache=False` (--no-cache) runs the model's training forward pass over the window
for every token instead, as any other language model (`model.build`) always does. Greedy text
(temperature 0) is the same with and without the cache and on every mesh.

On one device both passes run on plain variables compiled by XLA, each once (their shapes never
change), as `train` and `eval` run there (`train.compile`, mesh.compiles_with_xla); a bigger
mesh runs them on DTensor. (On DTensor a decode step pays the executor's fixed cost on each of
its few hundred small ops, ~4.5 ms a token for tiny_gpt whatever the context; XLA fuses them.)

Several prompts run together, one row each, the rows split along the data axis (padded to a
multiple of its size; at most MAX_ROWS rows at a time); each row has its own window and
position, so a prompt's greedy text is the one it gets alone. A prompt stops at the tokenizer's
end-of-document token, where it has one (an imported model: at the end-of-sequence ids of its
generation_config.json, several for Llama 3, as transformers' generate stops); the others go on.
Only the tokenizer's ids are ever picked (the model's vocabulary is rounded up past them); an
imported model's, all of its config's vocab_size (a tokenizer may have fewer; those ids print
nothing). Sampling draws from a host RNG per
prompt seeded with (--seed, the prompt's index): a seed gives the same text every time.
"""

from __future__ import annotations

import codecs
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from dtcli import devices as devices_lib
from dtcli import progress as progress_lib
from dtcli import rundir, storage
from dtcli.errors import UsageError
from dtcli.generate import ctrl_c, loop
from dtcli.generate.loop import pick, restart_keep, window_start  # noqa: F401 - the API
from dtcli.generate.prompts import DEFAULT_PROMPT, prompt_bytes, read_prompts  # noqa: F401 - the API
from dtcli.recipe import Overrides, Recipe

# One compiled forward pass per token: a million takes hours on a CPU; more is a typo.
MAX_TOKENS = 1_000_000
# Prompts generated together at most (more run in batches of this many): the caches and the
# window passes grow with the rows.
MAX_ROWS = 64


@dataclass(frozen=True)
class Settings:
    tokens: int  # new tokens per prompt
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    cache: bool = True  # the K/V cache (dtcli's GPT); False: the window pass for every token


def check_options(s: Settings) -> None:
    if not 1 <= s.tokens <= MAX_TOKENS:
        raise UsageError(f"--tokens {s.tokens}: expected an integer from 1 to {MAX_TOKENS:,}")
    if not (s.temperature >= 0 and np.isfinite(s.temperature)):
        raise UsageError(f"--temperature {s.temperature}: expected a number >= 0 (0: greedy)")
    if s.top_k is not None and s.top_k < 1:
        raise UsageError(f"--top-k {s.top_k}: expected a positive integer")
    if s.top_p is not None and not 0 < s.top_p <= 1:
        raise UsageError(f"--top-p {s.top_p}: expected a number above 0, at most 1")
    if not 0 <= s.seed < 2**32:
        raise UsageError(f"--seed {s.seed}: expected an integer from 0 to 2**32 - 1")


@dataclass
class Stats:
    """What `tokens/s` counts: new tokens (every prompt's, an end-of-document token included,
    the prompts' own not) over the wall time from the first forward pass to the last token
    (the model's build and restore excluded; tracing and compiling included). `steady` is the
    rate after the first WARM steps: the first runs the prompts' pass and compiles it, the
    second compiles the cache's one-position pass (a window pass is compiled once)."""

    tokens: int
    seconds: float
    cache: bool
    xla: bool = False  # compiled by XLA (one device), else run on DTensor
    steps: int = 0
    warm_seconds: float = 0.0  # the first WARM steps'
    warm_tokens: int = 0

    WARM = 2

    @property
    def per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def steady(self) -> float:
        rest = self.seconds - self.warm_seconds
        return (self.tokens - self.warm_tokens) / rest if rest > 0 else float("nan")

    def add(self, tokens: int, elapsed: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.seconds = elapsed
        if self.steps <= self.WARM:
            self.warm_seconds, self.warm_tokens = elapsed, self.tokens

    def line(self) -> str:
        how = "with the KV cache" if self.cache else "without a cache"
        how += ", compiled by XLA" if self.xla else ", on DTensor"
        # No steady rate when no step followed the first WARM (a short request).
        steady = (
            f"{self.steady:.1f} after the first {self.WARM} steps, which took "
            f"{self.warm_seconds:.2f} s with compiling"
            if self.steps > self.WARM
            else "all of it the first steps, compiling included"
        )
        return (
            f"tokens/s: {self.per_second:.1f} ({self.tokens:,} new tokens in "
            f"{self.seconds:.2f} s, {how}; {steady})"
        )


class Generator:
    """A language-model checkpoint restored on a mesh, ready to generate; the compiled forward
    passes are kept between runs. `use_devices`: the mesh over only the first N devices (see
    session.prepare). `sets`: recipe keys set on the checkpoint's recipe (--set), such as
    train.compile=dtensor (one device on DTensor instead of XLA) or train.precision.
    `progress` False: no heartbeat while it restores and compiles (--no-progress)."""

    def __init__(
        self,
        path: Path | str,
        mesh: str | None = None,
        devices: str | None = None,
        use_devices: int | None = None,
        sets: tuple[str, ...] = (),
        progress: bool = True,
    ):
        self.progress = progress

        def restore(found: Path, held: Path) -> tuple[Recipe, Any]:
            overrides = Overrides(tuple(sets), mesh, devices)
            recipe = rundir.checkpoint_recipe(held, "generate", overrides)
            if recipe.task != "language_model":
                raise UsageError(
                    f"CHECKPOINT {str(path)!r}: generate needs a language model (task "
                    f"language_model); this run's task is {recipe.task}"
                )
            from dtcli.session.restore import restored_session

            key = devices_lib.key_for(devices)
            self.end_of_sequence = _end_of_sequence(rundir.tokenizer_file(found).parent)
            return recipe, restored_session(found, held, recipe, "generate", use_devices, key)

        # Held open from verification to restore: a run in training may remove it (train.keep).
        what = "generate: restoring the checkpoint on the mesh"
        with _heartbeat(sys.stderr, what, progress), ctrl_c.held() as pressed:
            recipe, self.session = rundir.read_checkpoint(storage.as_path(path), restore)
            pressed.raise_if_pressed()
        self.context = int(self.session.data.input_shape[0])
        # text and tokens, the language-model sources, give one
        self.tokenizer = self.session.data.tokenizer
        # The ids a token is picked from: the tokenizer's, or an imported model's vocabulary.
        self.vocab = recipe.model.real_vocab or self.tokenizer.vocab_size
        self.can_cache = recipe.model.transformer is not None
        self._forwards: dict[tuple[bool, int], Any] = {}
        self.stats: Stats | None = None  # the last run's

    def rows_for(self, prompts: int) -> int:
        """Rows of a batch of `prompts`: at most MAX_ROWS, a multiple of the data axis."""
        shards = self.session.packer.shards
        return -(-min(prompts, MAX_ROWS) // shards) * shards

    def steps(self, prompts: list[bytes], settings: Settings) -> Iterator[list[tuple[int, int]]]:
        """Each step's new tokens, (prompt index, token) for every prompt still generating."""
        vocab = self.vocab
        if settings.top_k is not None and settings.top_k > vocab:
            raise UsageError(f"--top-k {settings.top_k}: expected at most the vocabulary, {vocab}")
        ids = [self._encode(p) for p in prompts]
        rows = self.rows_for(len(ids))
        cached = settings.cache and self.can_cache
        forward = self.forward_for(cached, rows)
        picker = _Picker(settings, len(ids), vocab)
        stats = self.stats = Stats(0, 0.0, cached, self.session.xla)
        start = time.perf_counter()
        with ctrl_c.held() as pressed:
            for first in range(0, len(ids), rows):
                if cached:
                    forward.reset()
                batch = ids[first : first + rows]
                for picked in loop.run(
                    batch,
                    forward,
                    self.context,
                    settings.tokens,
                    rows,
                    picker.at(first),
                    self.stop_ids(),
                ):
                    pressed.raise_if_pressed()
                    stats.add(len(picked), time.perf_counter() - start)
                    yield [(first + i, token) for i, token in picked]

    def pieces(self, prompt: bytes, settings: Settings) -> Iterator[str]:
        """One prompt's new text as it is sampled: a piece per token (bytes that end no UTF-8
        character yet, or an end-of-document token, give ""); "".join() gives the whole."""
        text = _Text(self._pieces())
        for picked in self.steps([prompt], settings):
            yield text.add(picked[0][1])
        yield text.end()

    def texts(self, prompts: list[bytes], settings: Settings) -> Iterator[tuple[int, str]]:
        """Each prompt's whole new text, in order, as each batch of rows ends."""
        texts = [_Text(self._pieces()) for _ in prompts]
        rows = self.rows_for(len(prompts))
        done = 0
        for picked in self.steps(prompts, settings):
            for i, token in picked:
                texts[i].add(token)
            batch_start = picked[0][0] // rows * rows
            for i in range(done, batch_start):  # an earlier batch has ended
                yield i, texts[i].whole()
            done = max(done, batch_start)
        for i in range(done, len(prompts)):
            yield i, texts[i].whole()

    def long_prompts(self, prompts: list[bytes]) -> list[str]:
        """A note for each prompt longer than the context: the model sees only its last tokens
        (the windowing policy, loop.py), which would otherwise pass silently."""
        notes = []
        for i, prompt in enumerate(prompts):
            n = len(self._encode(prompt))
            if n > self.context:
                which = "the prompt" if len(prompts) == 1 else f"prompt {i + 1}"
                seen = n - window_start(n, self.context)
                notes.append(
                    f"note: {which}: {n:,} tokens, longer than the context {self.context}: "
                    f"generating from its last {seen:,} (a full window starts again from its "
                    f"last {restart_keep(self.context):,} tokens)"
                )
        return notes

    def stop_ids(self) -> frozenset[int]:
        """The ids that end a prompt's text: an imported model's end-of-sequence ids, else the
        tokenizer's end-of-document id (where it has one)."""
        if self.end_of_sequence is not None:
            return self.end_of_sequence
        eot = self.tokenizer.eot
        return frozenset(() if eot is None else (eot,))

    def _pieces(self) -> list[bytes]:
        """Each id's bytes; the ids past the tokenizer (an imported vocabulary's) have none."""
        pieces = self.tokenizer.pieces()
        return pieces + [b""] * (self.vocab - len(pieces))

    def _encode(self, prompt: bytes) -> np.ndarray:
        ids = self.tokenizer.encode(prompt)
        if not len(ids):
            raise UsageError(f"--prompt {prompt[:40]!r}: it encodes to no token")
        return ids

    def forward_for(self, cached: bool, rows: int) -> Any:
        """The forward pass (loop.Forward) for batches of `rows`, compiled once and kept."""
        from dtcli.generate import forward

        key = (cached, rows)
        if key not in self._forwards:
            self._forwards[key] = (
                forward.CachedForward(self.session, rows)
                if cached
                else forward.WindowForward(self.session)
            )
        return self._forwards[key]


class _Picker:
    """Each prompt's tokens picked with its own RNG, seeded (seed, prompt index): its sample
    does not depend on the other prompts of its batch."""

    def __init__(self, settings: Settings, prompts: int, vocab: int):
        self.s = settings
        self.vocab = vocab
        self.rngs = [np.random.default_rng([settings.seed, i]) for i in range(prompts)]

    def at(self, first: int) -> Any:
        """The loop's pick_row for the batch whose row 0 is prompt `first`."""
        s = self.s

        def pick_row(i: int, logits: np.ndarray) -> int:
            return pick(logits, s.temperature, s.top_k, self.rngs[first + i], self.vocab, s.top_p)

        return pick_row


class _Text:
    """New tokens as text: their bytes decoded as UTF-8 (invalid sequences replaced)."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []

    def add(self, token: int) -> str:
        self.parts.append(self.decoder.decode(self.pieces[token]))
        return self.parts[-1]

    def end(self) -> str:
        self.parts.append(self.decoder.decode(b"", final=True))
        return self.parts[-1]

    def whole(self) -> str:
        self.end()
        return "".join(self.parts)


def stream(
    path: Path | str,
    prompt: str | bytes,
    tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    mesh: str | None = None,
    devices: str | None = None,
    use_devices: int | None = None,
    top_p: float | None = None,
    cache: bool = True,
) -> Iterator[str]:
    """`tokens` new tokens after `prompt` as they are sampled (Generator.pieces), so a caller
    can print them as they come and keep them on Ctrl-C."""
    settings = Settings(tokens, temperature, top_k, top_p, seed, cache)
    check_options(settings)
    if isinstance(prompt, bytes) and not prompt:
        raise UsageError("--prompt: expected at least one character")
    data = prompt if isinstance(prompt, bytes) else read_prompts([prompt], None)[0]
    yield from Generator(path, mesh, devices, use_devices).pieces(data, settings)


def write(
    generator: Generator, prompts: list[bytes], settings: Settings, out: TextIO, err: TextIO
) -> None:
    """What the command prints: one prompt's text as it is sampled; several prompts' texts as
    blocks with a header line each (`==> prompt 2: 'text' <==`, as `head` heads files); then
    the tokens/s line (Stats) on `err`."""
    check_options(settings)
    for line in generator.long_prompts(prompts):
        print(line, file=err, flush=True)
    if len(prompts) == 1:
        pieces = generator.pieces(prompts[0], settings)
        for piece in _first_compiled(pieces, err, generator.progress):
            out.write(piece)
            out.flush()  # a long generation shows progress, and Ctrl-C keeps what came
        out.write("\n")
        out.flush()  # before the tokens/s line on `err`
    else:
        texts = generator.texts(prompts, settings)
        for i, text in _first_compiled(texts, err, generator.progress):
            shown = prompts[i].decode("utf-8", errors="replace")
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            gap = "\n" if i else ""  # a blank line between blocks
            out.write(f"{gap}==> prompt {i + 1}: {shown!r} <==\n{text}\n")
            out.flush()
    if generator.stats is not None:
        print(generator.stats.line(), file=err, flush=True)


def _heartbeat(err: TextIO, what: str, on: bool = True) -> progress_lib.Heartbeat:
    """`what` generate is doing, said on `err` every BEAT_EVERY seconds it blocks, where `err` is
    no terminal (and `on`)."""
    return progress_lib.Heartbeat(progress_lib.stderr_console(err), what, on=on)


def _first_compiled(items: Iterator[Any], err: TextIO, on: bool = True) -> Iterator[Any]:
    """`items`, the first awaited under a heartbeat (its step compiles the forward pass). Not
    the others: the text flowing shows the process is alive, and on a shared pipe (2>&1) a
    line of the heartbeat would land inside it."""
    with _heartbeat(err, "generate: compiling the forward pass", on):
        first = next(items, _NONE)
    if first is not _NONE:
        yield first
    yield from items


_NONE = object()


def _end_of_sequence(run: Path) -> frozenset[int] | None:
    """An imported run's end-of-sequence ids (None: the tokenizer's end-of-document token)."""
    from dtcli.hf import tokenizer_files

    ids = tokenizer_files.end_of_sequence_ids(run)
    return None if ids is None else frozenset(ids)
