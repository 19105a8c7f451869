"""`dtcli generate`: text sampled from a language-model checkpoint, on any mesh.

The model is built on the target mesh and the checkpoint restored into it (as `eval` does),
without reading the training text: the run's tokenizer (RUN_DIR/tokenizer.json; bytes for a
run without one), windows of the recipe's context under one windowing policy (infer/decoding.py: the
window restarts at the last context // 2 tokens when it is full, for both forward passes).

dtcli's GPT generates with a K/V cache (models/decode.py): each new token costs one position,
not a window; `cache=False` (--no-cache) runs the model's training forward pass over the window
for every token instead, as any other language model (`model.build`) always does. Greedy text
(temperature 0) is the same with and without the cache and on every mesh.

On one device both passes run on plain variables compiled by XLA, each once (their shapes never
change), as `train` and `eval` run there (`train.compile`, mesh.step_compiler); a bigger
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

With --chat (chat.py) a prompt is a conversation rendered with the run's chat template, and it
also stops at the template's end of turn, which is not printed. What the command prints, and
--json: output.py; the settings and their checks: settings.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtcli import devices as devices_lib
from dtcli import rundir, storage
from dtcli.errors import UsageError
from dtcli.generate import chat as chat_lib
from dtcli.generate import ctrl_c
from dtcli.generate.chat import Conversation, check_template_option, read_conversations
from dtcli.generate.output import Stats, _first_compiled, _heartbeat, write, write_json
from dtcli.generate.prompts import DEFAULT_PROMPT, prompt_bytes, read_prompts
from dtcli.generate.settings import MAX_TOKENS, Settings, check_options
from dtcli.hf import tokenizer_files
from dtcli.infer import decoding
from dtcli.infer.decoding import pick, restart_keep, window_start
from dtcli.recipe import Overrides, Recipe

__all__ = [  # the API, beside Generator: what the command and the tests call
    "DEFAULT_PROMPT", "MAX_TOKENS", "Answer", "Conversation", "Generator", "Settings", "Stats",
    "check_options", "check_template_option", "command_prompts", "pick", "prompt_bytes",
    "read_conversations", "read_prompts", "restart_keep", "stream", "window_start", "write",
    "write_json", "_first_compiled",
]  # fmt: skip

# A prompt: its bytes, or --chat's conversation.
Prompt = bytes | Conversation

# Prompts generated together at most (more run in batches of this many): the caches and the
# window passes grow with the rows.
MAX_ROWS = 64


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
        chat: bool = False,
        chat_template: str | None = None,
    ):
        """`chat`: prompts are rendered with the run's chat template (or `chat_template`, a
        built-in or a file) and end at its end of turn (generate/chat.py)."""
        self.progress = progress
        self.chat: chat_lib.ChatFormat | None = None

        def restore(found: Path, held: Path) -> tuple[Recipe, Any]:
            overrides = Overrides(tuple(sets), mesh, devices)
            recipe = rundir.checkpoint_recipe(held, "generate", overrides)
            if recipe.task != "language_model":
                raise UsageError(
                    f"CHECKPOINT {str(path)!r}: generate needs a language model (task "
                    f"language_model); this run's task is {recipe.task}"
                )
            saved = rundir.tokenizer_file(found)
            if chat:
                chat_lib.check_run(recipe, saved, chat_template, str(path))
            from dtcli.session.restore import restored_session

            key = devices_lib.key_for(devices)
            self.end_of_sequence = tokenizer_files.end_of_sequence_ids(saved.parent)
            session = restored_session(found, held, recipe, "generate", use_devices, key)
            if chat:
                tok = session.data.tokenizer
                self.chat = chat_lib.run_format(recipe, tok, saved, chat_template, str(path))
            return recipe, session

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

    def steps(self, prompts: list[Prompt], settings: Settings) -> Iterator[list[tuple[int, int]]]:
        """Each step's new tokens, (prompt index, token) for every prompt still generating."""
        vocab = self.vocab
        if settings.top_k is not None and settings.top_k > vocab:
            raise UsageError(f"--top-k {settings.top_k}: expected at most the vocabulary, {vocab}")
        ids = [self._encode(p) for p in prompts]
        rows = self.rows_for(len(ids))
        cached = settings.cache and self.can_cache
        forward = self.forward_for(cached, rows)
        picker = _Picker(settings, len(ids), vocab)
        stats = self.stats = Stats(0, 0.0, cached, self.session.compiler)
        start = time.perf_counter()
        with ctrl_c.held() as pressed:
            for first in range(0, len(ids), rows):
                if cached:
                    forward.reset()
                batch = ids[first : first + rows]
                for picked in decoding.run(
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

    def pieces(self, prompt: Prompt, settings: Settings) -> Iterator[str]:
        """One prompt's new text as it is sampled: a piece per token (bytes that end no UTF-8
        character yet, or an end-of-document token, give ""); "".join() gives the whole."""
        text = self._text()
        for picked in self.steps([prompt], settings):
            yield text.add(picked[0][1])
        yield text.end()

    def texts(self, prompts: list[Prompt], settings: Settings) -> Iterator[tuple[int, str]]:
        """Each prompt's whole new text, in order, as each batch of rows ends."""
        for i, answer in self.answers(prompts, settings):
            yield i, answer.text

    def answers(self, prompts: list[Prompt], settings: Settings) -> Iterator[tuple[int, Answer]]:
        """Each prompt's answer (its text, new ids, whether it stopped), in order, as each batch
        of rows ends."""
        texts = [self._text() for _ in prompts]
        tokens: list[list[int]] = [[] for _ in prompts]
        stops = self.stop_ids()

        def answer(i: int) -> Answer:
            return Answer(texts[i].whole(), tokens[i], bool(tokens[i]) and tokens[i][-1] in stops)

        rows = self.rows_for(len(prompts))
        done = 0
        for picked in self.steps(prompts, settings):
            for i, token in picked:
                texts[i].add(token)
                tokens[i].append(token)
            batch_start = picked[0][0] // rows * rows
            for i in range(done, batch_start):  # an earlier batch has ended
                yield i, answer(i)
            done = max(done, batch_start)
        for i in range(done, len(prompts)):
            yield i, answer(i)

    def notes(self, prompts: list[Prompt]) -> list[str]:
        """What stderr says before the text: long prompts, a chat template with no end."""
        note = None if self.chat is None else self.chat.note()
        return self.long_prompts(prompts) + ([note] if note else [])

    def long_prompts(self, prompts: list[Prompt]) -> list[str]:
        """A note for each prompt longer than the context: the model sees only its last tokens
        (the windowing policy, infer/decoding.py), which would otherwise pass silently."""
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
        """The ids that end a prompt's text (decoding.stop_ids: an imported model's
        end-of-sequence ids, else the tokenizer's end of text); with --chat, its end of turn."""
        found = decoding.stop_ids(self.tokenizer.eot, self.end_of_sequence)
        if self.chat is not None and self.chat.end_of_turn is not None:
            found |= {self.chat.end_of_turn}
        return found

    def _text(self) -> decoding.NewText:
        """A prompt's new text; with --chat, the answer only (its end of turn not printed). An
        imported vocabulary's ids past the tokenizer's print nothing."""
        hidden = self.stop_ids() if self.chat is not None else frozenset()
        return decoding.NewText(self.tokenizer.pieces(), hidden)

    def _encode(self, prompt: Prompt) -> np.ndarray:
        if isinstance(prompt, Conversation):
            if self.chat is None:
                raise UsageError("a conversation is a prompt of --chat (Generator(chat=True))")
            return self.chat.ids(prompt, f"the prompt {prompt.shown[:40]!r}")
        ids = self.tokenizer.encode(prompt)
        if not len(ids):
            raise UsageError(f"--prompt {prompt[:40]!r}: it encodes to no token")
        return ids

    def forward_for(self, cached: bool, rows: int) -> Any:
        """The forward pass (decoding.Forward) for batches of `rows`, compiled once and kept."""
        from dtcli.infer import forward

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


@dataclass(frozen=True)
class Answer:
    """A prompt's new text, its new ids, and whether it ended at a stop id (else it ran the
    tokens asked)."""

    text: str
    tokens: list[int]
    stopped: bool


def command_prompts(
    prompts: list[str] | None, prompts_file: str | None, chat: bool, chat_template: str | None
) -> list[Prompt]:
    """The command's prompts, checked before any checkpoint is read: --chat's conversations
    (and its --chat-template), else bytes."""
    check_template_option(chat_template, chat)
    if chat:
        return read_conversations(prompts, prompts_file)
    return read_prompts(prompts, prompts_file)


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
