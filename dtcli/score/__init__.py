"""`dtcli score`: the log probability a language-model checkpoint gives each token of a text,
on any mesh; their sum, the perplexity and the bits per byte.

The text is encoded in one call by the run's tokenizer (its post-processor included: the BOS a
Llama tokenizer adds is token 0), so the tokens are exactly what the model would see of the
whole document. logprobs[i] is log p(tokens[i + 1] | tokens[0..i]): `count` = len(tokens) - 1,
perplexity = exp(-sum / count), bits per byte = -sum / ln 2 / the UTF-8 bytes of the text the
scored tokens cover (tokens[1..]: the text after the first token's end; all of it after a BOS).
A text longer than the context is scored by a sliding window (windows.py says how; --stride).

The checkpoint is restored on the target mesh as generate restores it (no training text is
read); the windows run as batches of the recipe's evaluation batch (data.eval_batch_size, else
data.batch_size), padded to a multiple of the data axis (padding rows are never scored).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtcli import devices as devices_lib
from dtcli import progress as progress_lib
from dtcli import rundir, storage
from dtcli.data.document import encode_document
from dtcli.errors import UsageError
from dtcli.recipe import NO_OVERRIDES, Overrides, Recipe
from dtcli.score import windows as windows_lib
from dtcli.score.windows import check_stride, default_stride
from dtcli.tables import Column, print_table

__all__ = [
    "Score",
    "Scorer",
    "Text",
    "as_json",
    "check_stride",
    "default_stride",
    "read_text",
    "render",
    "score_path",
]


@dataclass(frozen=True)
class Text:
    text: str
    named: str  # how errors name where it came from: "--text", "--file 'notes.txt'"


@dataclass(frozen=True)
class Score:
    tokens: np.ndarray  # every token of the text
    logprobs: np.ndarray  # [len(tokens) - 1] float32: log p(tokens[i + 1] | tokens[0..i])
    text_bytes: int  # UTF-8 bytes of the text tokens[1..] cover
    windows: int
    stride: int
    checkpoint: str = ""
    mesh: str = ""

    @property
    def count(self) -> int:
        return len(self.logprobs)

    @property
    def sum(self) -> float:
        return float(np.sum(self.logprobs, dtype=np.float64))

    @property
    def perplexity(self) -> float:
        mean = -self.sum / self.count
        return math.exp(mean) if mean < 709 else math.inf  # past exp's range

    @property
    def bits_per_byte(self) -> float | None:
        """None where the scored tokens cover no text (special tokens only)."""
        return -self.sum / math.log(2) / self.text_bytes if self.text_bytes else None

    def as_json(self) -> dict[str, Any]:
        return {
            "tokens": [int(t) for t in self.tokens],
            "logprobs": [float(x) for x in self.logprobs],
            "sum": self.sum,
            "count": self.count,
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
        }


def read_text(text: str | None, file: str | None) -> Text:
    """--text's string or --file's UTF-8 text, checked before any checkpoint is read."""
    if (text is None) == (file is None):
        raise UsageError("--text, --file: give the text to score with exactly one of them")
    if text is not None:
        if not text:
            raise UsageError("--text: expected at least one character")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # bytes a command line passed as surrogate escapes
            raise UsageError(
                f"--text: not UTF-8 text ({exc.reason} at character {exc.start + 1})"
            ) from None
        return Text(text, "--text")
    named = f"--file {file!r}"
    try:
        data = storage.as_path(file).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{named}: cannot read it ({reason})") from None
    if not data:
        raise UsageError(f"{named}: the file is empty; expected text to score")
    bad = _first_bad_byte(data)
    if bad is not None:
        raise UsageError(
            f"{named}: not UTF-8 text (byte 0x{data[bad]:02x} at offset {bad}); "
            "expected a text file"
        )
    return Text(data.decode("utf-8"), named)


def _first_bad_byte(data: bytes) -> int | None:
    """Where `data` stops being text: its first byte that is no UTF-8 or a NUL (a binary file
    given by mistake: an image, a checkpoint's shard), or None."""
    nul = data.find(b"\0")
    try:
        data.decode("utf-8")
        bad = None
    except UnicodeDecodeError as exc:
        bad = exc.start
    found = [at for at in (bad, nul if nul >= 0 else None) if at is not None]
    return min(found, default=None)


class Scorer:
    """A language model's session (on its mesh, its weights in place), ready to score texts;
    the compiled forward pass is kept between texts. `checkpoint`: where its weights came from
    (the summary's first line). `stride`: the sliding window's (None: the default)."""

    def __init__(self, session: Any, checkpoint: str = "", stride: int | None = None):
        self.session = session
        self.checkpoint = checkpoint
        self.context = int(session.data.input_shape[0])
        self.tokenizer = session.data.tokenizer  # the language-model sources give one
        data = session.recipe.data
        self.batch = data.eval_batch_size or data.batch_size
        self.stride = stride
        self._forward: Any = None

    @classmethod
    def restored(
        cls,
        path: Path | str,
        mesh: str | None = None,
        devices: str | None = None,
        use_devices: int | None = None,
        sets: tuple[str, ...] = (),
        stride: int | None = None,
    ) -> Scorer:
        """A checkpoint folder, or a run directory's newest intact checkpoint, restored on the
        mesh it was trained on or another one (`use_devices`: over only the first N devices,
        session.prepare; `sets`: recipe keys set on the checkpoint's recipe, --set); `stride`
        is checked against the context before the model is built."""

        def restore(found: Path, held: Path) -> Any:
            from dtcli.session.restore import restored_session

            recipe = rundir.checkpoint_recipe(held, "score", Overrides(sets, mesh, devices))
            _check_language_model(path, recipe)
            if recipe.data.context is not None:  # a language model's, once the recipe loads
                check_stride(stride, recipe.data.context)
            key = devices_lib.key_for(devices)
            return restored_session(found, held, recipe, "score", use_devices, key)

        # Held open from verification to restore: a run in training may remove it (train.keep).
        session = rundir.read_checkpoint(storage.as_path(path), restore)
        return cls(session, str(path), stride)

    def rows_for(self, windows: int) -> int:
        """Rows of a batch of `windows`: at most the evaluation batch, a multiple of the data
        axis."""
        shards = self.session.packer.shards
        return -(-min(windows, self.batch) // shards) * shards

    def score(self, text: Text, stride: int | None = None) -> Score:
        """`text`'s tokens scored, through windows advancing by `stride` (None: the Scorer's)."""
        from dtcli.mesh import mesh_text

        stride = check_stride(self.stride if stride is None else stride, self.context)
        ids, ends = encode_document(self.tokenizer, text.text)
        if len(ids) < 2:
            raise UsageError(
                f"{text.named}: the text is {len(ids)} token{'s' * (len(ids) != 1)} "
                f"({[int(i) for i in ids]}): nothing to score; a token is scored given the "
                "tokens before it, so give a text of at least two tokens"
            )
        found = windows_lib.windows(len(ids), self.context, stride)
        covered = len(text.text.encode("utf-8")) - int(ends[0])
        return Score(
            ids,
            self.logprobs(ids, found),
            covered,
            len(found),
            stride,
            self.checkpoint,
            mesh_text(self.session.axes),
        )

    def logprobs(self, ids: np.ndarray, windows: list[windows_lib.Window]) -> np.ndarray:
        """Every prediction the `windows` score, in order."""
        from dtcli.infer.logprobs import TargetLogprobs

        if self._forward is None:
            self._forward = TargetLogprobs(self.session)
        rows = self.rows_for(len(windows))
        out = []
        for first in range(0, len(windows), rows):
            group = windows[first : first + rows]
            inputs, targets, scored = windows_lib.batch(ids, group, self.context, rows)
            logprobs, _ = self._forward(inputs, targets)
            out.append(logprobs[scored])  # row by row: in text order
        return np.concatenate(out)


def _check_language_model(path: Path | str, recipe: Recipe) -> None:
    if recipe.task != "language_model":
        raise UsageError(
            f"CHECKPOINT {str(path)!r}: score needs a language model (task language_model); "
            f"this run's task is {recipe.task}"
        )


def score_path(
    path: Path | str,
    text: Text,
    stride: int | None = None,
    overrides: Overrides | None = None,
    progress: bool = True,
) -> Score:
    """`dtcli score`: `text` scored by a checkpoint folder or a run directory's newest intact
    checkpoint, on the mesh it was trained on or another one. `progress`: where stderr is no
    terminal, a line every BEAT_EVERY seconds of the work (--no-progress: none)."""
    check_stride(stride)  # a stride below 1 before anything is read
    o = overrides or NO_OVERRIDES
    beat = progress_lib.Heartbeat(
        progress_lib.stderr_console(), "score: restoring the checkpoint on the mesh", on=progress
    )
    with beat:
        scorer = Scorer.restored(path, o.mesh, o.devices, sets=o.sets, stride=stride)
        beat.now("score: compiling the forward pass, scoring the text")
        return scorer.score(text)


def as_json(score: Score) -> str:
    """--json: one object, exactly the keys of Score.as_json."""
    return json.dumps(score.as_json())


def render(score: Score, console: Any) -> None:
    """The checkpoint's path on a line of its own, then one row per figure (dtcli.tables)."""
    console.print(score.checkpoint, markup=False, highlight=False, soft_wrap=True)
    bpb = score.bits_per_byte
    rows = [
        ("tokens", f"{len(score.tokens):,}"),
        ("scored", f"{score.count:,}"),
        ("sum", f"{score.sum:.6f}"),
        ("perplexity", f"{score.perplexity:.6f}"),
        ("bits_per_byte", "-" if bpb is None else f"{bpb:.6f}"),
        ("text_bytes", f"{score.text_bytes:,}"),
        ("windows", f"{score.windows:,} (stride {score.stride})"),
        ("mesh", score.mesh),
    ]
    print_table(console, (Column("figure", kind="name"), Column("value")), rows)
