"""source jsonl: instruction data, one example a line of a JSON Lines file (data.path; the
evaluation examples: data.eval_path, else a fixed data.eval_fraction of data.path's lines),
rendered with a chat template (dtcli.data.chat) and laid out in windows of data.context tokens
(dtcli.data.instructions), streamed from the file as it trains.

Loading reads each file once: every line is checked (JSON, its fields, the template) and
tokenized to learn its length, so that a bad line is refused before any step and the windows
(one example each, or packed) are known; only each example's line offset and length are
kept. An epoch then reads and tokenizes its windows' lines again as it goes, in an order that
is a pure function of (seed, epoch) (a permutation of the windows), each client group every
n-th window of it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtcli import storage
from dtcli.data import chat, instructions, streams
from dtcli.data import tokenizer as tokenizer_lib
from dtcli.data.base import Dataset, Stream, empty_like
from dtcli.data.instructions import Example, TextEncoder
from dtcli.data.tokenizer import ByteTokenizer, Tokenizer
from dtcli.errors import UsageError
from dtcli.recipe import DataConfig

TOKENIZER_KEY = "recipe key 'data.tokenizer'"
# The selection of data.eval_fraction's lines: fixed, whatever the recipe's seed.
EVAL_SEED = 0


def describe(cfg: DataConfig, saved: Path | None = None) -> tuple[tuple[int, ...], int]:
    """One window's shape ([context], packed [3, context]) and the model's vocabulary; a new
    run's chat template checked against the tokenizer (a trained run's was: generate and
    score read no template). No data file is read."""
    tok = tokenizer(cfg, saved)
    if saved is None or not storage.as_path(saved).exists():
        _reader(cfg, saved, tok, "data.path")
    return _window_shape(cfg), tokenizer_lib.model_vocab(tok.vocab_size)


def _window_shape(cfg: DataConfig) -> tuple[int, ...]:
    context = int(cfg.context or 1)
    return (3, context) if cfg.packing else (context,)


def _config_folders(cfg: DataConfig, saved: Path | None) -> list[Path]:
    """Where a tokenizer_config.json (chat template, BOS and EOS) may lie beside the tokenizer:
    the run's kept Hugging Face files (RUN_DIR/hf/), then data.tokenizer's folder."""
    folders = [] if saved is None else [Path(saved).parent / "hf"]
    if isinstance(cfg.tokenizer, str) and cfg.tokenizer != "bytes":
        path = Path(cfg.tokenizer)
        folders.append(path if path.is_dir() else path.parent)
    return folders


def tokenizer_config(cfg: DataConfig) -> Path | None:
    """The tokenizer_config.json beside data.tokenizer, if there is one (a new run keeps it)."""
    found = [f / chat.CONFIG for f in _config_folders(cfg, None)]
    return next((p for p in found if p.is_file()), None)


def tokenizer(cfg: DataConfig, saved: Path | None = None) -> Tokenizer:
    """The run's saved tokenizer, else the recipe's (bytes, or a tokenizer.json) with an
    end-of-text token: its own, its tokenizer_config.json's EOS, else EOT_TOKEN added after
    its ids (bytes: id 256; data.tokenizer.with_eot)."""
    found = tokenizer_lib.read_saved(saved)
    if found is not None:
        return found
    spec = cfg.tokenizer
    tok = ByteTokenizer() if spec is None else tokenizer_lib.from_spec(str(spec), TOKENIZER_KEY)
    if tok.eot is not None:
        return tok
    eos = chat.load("plain", _config_folders(cfg, saved)).eos_token
    if eos and TextEncoder(tok).single_id(eos) is not None:
        return tok
    return tokenizer_lib.with_eot(tok)


@dataclass(frozen=True)
class Reader:
    """One line of a file -> its example, tokenized and cut to the context."""

    template: chat.Template
    encoder: TextEncoder
    cfg: DataConfig
    key: str  # the recipe key the file came from: data.path or data.eval_path

    def example(self, line: bytes, where: str) -> Example:
        try:
            record = json.loads(line)
        except ValueError as exc:  # UnicodeDecodeError too
            raise UsageError(
                f"recipe key '{self.key}': {where}: not a JSON object ({exc})"
            ) from None
        messages = chat.conversation(record, where, self.key)
        text, spans = self.template.spans(messages, where)
        example = instructions.encoded(self.encoder, text, spans)
        if not example.response.any():
            # Else a step of such lines has no loss to learn from (a 0 loss, nothing applied).
            raise UsageError(
                f"{chat.KEY}: {where}: {self.template.name} renders none of the line's "
                "assistant text, so it has nothing in the loss"
            )
        keep = len(self.encoder.bos_ids)
        return instructions.fit(example, int(self.cfg.context or 1), self.cfg.truncate, keep, where)

    @property
    def pad_id(self) -> int:
        """The id padding holds (never a target): the end-of-text id."""
        eot = self.encoder.tok.eot
        return 0 if eot is None else int(eot)


def _reader(cfg: DataConfig, saved: Path | None, tok: Tokenizer, key: str) -> Reader:
    """The reader of a file of `key`: the run's chat template (`template`)."""
    return Reader(template(cfg, saved, tok), TextEncoder(tok), cfg, key)


def template(
    cfg: DataConfig, saved: Path | None, tok: Tokenizer, key: str = chat.KEY
) -> chat.Template:
    """The chat template data.chat_template names (or the tokenizer_config.json's beside the
    tokenizer), with the tokenizer's BOS and EOS texts where it names none; refused where it
    writes special tokens the tokenizer does not have. What training renders with, and
    generate --chat (`key`: what a refusal names)."""
    encoder = TextEncoder(tok)
    found = chat.load(cfg.chat_template, _config_folders(cfg, saved), key)
    eos = found.eos_token or _token_text(tok, tok.eot)
    bos = found.bos_token or (
        _token_text(tok, encoder.bos_ids[0]) if len(encoder.bos_ids) == 1 else ""
    )
    found = dataclasses.replace(found, bos_token=bos, eos_token=eos)
    missing = [t for t in found.special_tokens() if encoder.single_id(t) is None]
    if missing:
        raise UsageError(
            f"{key}: {found.name} writes {', '.join(missing)}, which the tokenizer "
            f"({tok.description}) does not have as tokens (dtcli adds no embedding rows); "
            "use a template of the tokenizer's own tokens, such as plain"
        )
    return found


def _token_text(tok: Tokenizer, token: int | None) -> str:
    if token is None:
        return ""
    if isinstance(tok, ByteTokenizer):
        return tokenizer_lib.EOT_TOKEN if token == tok.eot else chr(token)
    return tok.tok.id_to_token(int(token)) or ""


@dataclass(frozen=True)
class Lines:
    """A split's examples: where each lies in its file, its length, and the windows they fill
    (window i holds examples starts[i]:starts[i+1])."""

    path: str
    offsets: np.ndarray  # int64: the byte offset of each example's line
    numbers: np.ndarray  # int64: its line number (from 1), for errors
    lengths: np.ndarray  # int64: its ids, cut to the context
    starts: np.ndarray  # int64 [windows + 1]
    reader: Reader

    @property
    def windows(self) -> int:
        return len(self.starts) - 1

    def subset(self, take: np.ndarray) -> Lines:
        """The examples `take` (in file order), in windows of their own."""
        lengths = self.lengths[take]
        context = int(self.reader.cfg.context or 1)
        starts = instructions.pack(lengths, context, self.reader.cfg.packing)
        offsets, numbers = self.offsets[take], self.numbers[take]
        return Lines(self.path, offsets, numbers, lengths, starts, self.reader)


def _scan(path: str, reader: Reader) -> tuple[Lines, np.ndarray]:
    """Every example of the file at `path`, read and checked once -> its Lines, and the text
    bytes of each example's targets (bits per byte's denominator)."""
    key = f"recipe key '{reader.key}'"
    file = Path(path)
    if file.is_dir():
        raise UsageError(f"{key}: source jsonl reads one JSON Lines file, {path!r} is a folder")
    offsets, numbers, lengths, target_bytes = [], [], [], []
    tok = reader.encoder.tok
    try:
        with file.open("rb") as f:
            offset = 0
            for number, line in enumerate(f, start=1):
                if line.strip():  # blank lines are skipped
                    example = reader.example(line, f"{path}:{number}")
                    y = instructions.targets(example, reader.cfg.mask_prompt)
                    offsets.append(offset)
                    numbers.append(number)
                    lengths.append(len(example.ids))
                    target_bytes.append(tok.target_bytes(y[y >= 0]))
                offset += len(line)
    except OSError as exc:
        raise UsageError(f"{key}: cannot read {path!r} ({exc.strerror or exc})") from None
    if not offsets:
        raise UsageError(f"{key}: {path!r} holds no examples (expected one JSON object a line)")
    lengths_array = np.asarray(lengths, np.int64)
    context = int(reader.cfg.context or 1)
    lines = Lines(
        path,
        np.asarray(offsets, np.int64),
        np.asarray(numbers, np.int64),
        lengths_array,
        instructions.pack(lengths_array, context, reader.cfg.packing),
        reader,
    )
    return lines, np.asarray(target_bytes, np.int64)


def eval_lines(n: int, fraction: float) -> np.ndarray:
    """Which of `n` examples evaluate (data.eval_fraction without data.eval_path): a fixed
    pseudo-random choice of round(n * fraction) of them, at least one, the same for every
    seed."""
    k = min(max(int(round(n * fraction)), 1), n)
    held = np.zeros(n, bool)
    held[np.random.default_rng(EVAL_SEED).permutation(n)[:k]] = True
    return held


def load(cfg: DataConfig, split_names: tuple[str, ...], saved: Path | None = None) -> Dataset:
    tok = tokenizer(cfg, saved)
    vocab = tokenizer_lib.model_vocab(tok.vocab_size)
    train: Lines | None = None
    if cfg.eval_path is not None:
        evaluate, eval_bytes = _scan(cfg.eval_path, _reader(cfg, saved, tok, "data.eval_path"))
        if "train" in split_names:
            train = _scan(cfg.path, _reader(cfg, saved, tok, "data.path"))[0]
    else:
        whole, target_bytes = _scan(cfg.path, _reader(cfg, saved, tok, "data.path"))
        held = eval_lines(len(whole.lengths), cfg.eval_fraction)
        if held.all():
            raise UsageError(
                f"recipe key 'data.path': {cfg.path!r} holds {len(held)} example, none left to "
                "train on once data.eval_fraction holds one out; give more, or data.eval_path"
            )
        evaluate, eval_bytes = whole.subset(np.flatnonzero(held)), target_bytes[held]
        train = whole.subset(np.flatnonzero(~held))
    eval_stream = _stream(cfg, evaluate, vocab, int(eval_bytes.sum()))
    train_stream = empty_like(eval_stream) if train is None else _stream(cfg, train, vocab, None)
    what = (
        f"instructions {cfg.path} ({len(train.lengths) if train else 0:,} train / "
        f"{len(evaluate.lengths):,} eval examples in {len(train_stream):,} + "
        f"{len(eval_stream):,} windows of {cfg.context}{' packed' if cfg.packing else ''}, "
        f"{tok.description}, chat template {evaluate.reader.template.name})"
    )
    return Dataset(train_stream, eval_stream, vocab, what, tok)


def _stream(cfg: DataConfig, lines: Lines, vocab: int, target_bytes: int | None) -> Stream:
    return Stream(
        "jsonl",
        (lines.path,),
        (lines.windows,),
        (),
        _window_shape(cfg),
        cfg,
        vocab,
        where=lines.reader.key,
        x_dtype="int32",
        y_shape=(int(cfg.context or 1),),
        target_bytes=target_bytes,
        lines=lines,
    )


def share_counts(stream: Stream, groups: int) -> list[int]:
    return streams.example_shares(stream, groups)


def windows(
    stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(x, y) of this group's windows of one epoch: the windows permuted by (seed, epoch)
    (unshuffled: in file order), every `groups`-th from `group`, each example's line read and
    tokenized again."""
    lines: Lines | None = stream.lines
    if lines is None or not lines.windows:
        return
    order = np.arange(lines.windows)
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(lines.windows)
    cfg, reader = lines.reader.cfg, lines.reader
    with open(lines.path, "rb") as f:
        for w in order[group::groups]:
            examples = [_read(f, lines, i) for i in range(lines.starts[w], lines.starts[w + 1])]
            yield instructions.window(
                examples, int(cfg.context or 1), reader.pad_id, cfg.packing, cfg.mask_prompt
            )


def _read(f: Any, lines: Lines, i: int) -> Example:
    f.seek(int(lines.offsets[i]))
    where = f"{lines.path}:{lines.numbers[i]}"
    example = lines.reader.example(f.readline(), where)
    if len(example.ids) != lines.lengths[i]:
        raise UsageError(
            f"recipe key '{lines.reader.key}': {where}: the file changed since it was loaded "
            f"(the example is {len(example.ids)} tokens, it was {lines.lengths[i]})"
        )
    return example


def examples(stream: Stream, seed: int, epoch: int, shuffle: bool, group: int, groups: int) -> Any:
    """`windows` as a tf.data.Dataset of (x, y) int32."""
    import tensorflow as tf

    signature = (
        tf.TensorSpec(stream.example_shape, tf.int32),
        tf.TensorSpec(stream.y_shape, tf.int32),
    )
    return tf.data.Dataset.from_generator(
        lambda: windows(stream, seed, epoch, shuffle, group, groups),
        output_signature=signature,
    )


def read_error(stream: Stream, text: str) -> str:
    return streams.failed(stream, text)
