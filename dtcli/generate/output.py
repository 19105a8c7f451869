"""What `dtcli generate` prints: the new text (as it is sampled, or a block per prompt), or one
JSON object per prompt (--json); the tokens/s line on stderr (`Stats`); a heartbeat while the
first step compiles."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from dtcli import progress as progress_lib
from dtcli.generate.settings import Settings, check_options

# How the passes ran, by session.compiler (mesh.step_compiler).
_RUNS_ON = {
    "xla": ", compiled by XLA",
    "graph": ", on TensorFlow's own kernels",
    "dtensor": ", on DTensor",
}


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
    compiler: str = "dtensor"  # what runs the passes: xla, graph (one device) or dtensor
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
        how += _RUNS_ON[self.compiler]
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


def write(generator: Any, prompts: list[Any], settings: Settings, out: TextIO, err: TextIO) -> None:
    """What the command prints: one prompt's text as it is sampled; several prompts' texts as
    blocks with a header line each (`==> prompt 2: 'text' <==`, as `head` heads files); then
    the tokens/s line (Stats) on `err`. `generator`: a Generator; `prompts`: bytes, or --chat's
    Conversations."""
    check_options(settings)
    for line in generator.notes(prompts):
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
            shown = shown_prompt(prompts[i])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            gap = "\n" if i else ""  # a blank line between blocks
            out.write(f"{gap}==> prompt {i + 1}: {shown!r} <==\n{text}\n")
            out.flush()
    _rate(generator, err)


def write_json(
    generator: Any, prompts: list[Any], settings: Settings, out: TextIO, err: TextIO
) -> None:
    """--json: one JSON object a line per prompt, in order: {"prompt": its text (--chat: the
    last user message), "text": the new text, "tokens": the new ids (an end of text or of turn
    included), "stopped": whether it ended there (else it ran --tokens)}; tokens/s on `err`."""
    check_options(settings)
    for line in generator.notes(prompts):
        print(line, file=err, flush=True)
    answers = generator.answers(prompts, settings)
    for i, answer in _first_compiled(answers, err, generator.progress):
        record = {
            "prompt": shown_prompt(prompts[i]),
            "text": answer.text,
            "tokens": answer.tokens,
            "stopped": answer.stopped,
        }
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        out.flush()
    _rate(generator, err)


def shown_prompt(prompt: Any) -> str:
    """A prompt as text: its bytes decoded, or a Conversation's last user message."""
    if isinstance(prompt, bytes):
        return prompt.decode("utf-8", errors="replace")
    return prompt.shown


def _rate(generator: Any, err: TextIO) -> None:
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
