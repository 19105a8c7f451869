"""Tokenizers behind one small interface: dtcli's byte tokens (one token per byte, the default)
or a Hugging Face `tokenizers` tokenizer: a tokenizer.json as GPT-2, Llama and most hub models
ship it, or a byte-level BPE trained on a run's training text (`train_bpe`).

`encode` and `decode` take and give bytes; `vocab_size` counts the ids the tokenizer makes (the
model's vocabulary is that rounded up, `model_vocab`); `eot` is the end-of-document id (None:
none); `pieces` are the text bytes each id stands for (bits per byte, streamed decoding);
`to_json` is a tokenizer.json any `tokenizers` user can load (bytes too: a BPE with no merges
whose ids are the byte values). A run keeps the tokenizer it used in its directory, so eval,
generate, resume and export never read the recipe's path again nor train it again.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from dtcli import storage
from dtcli.data import tokenizer_json
from dtcli.errors import UsageError, one_line
from dtcli.recipe.data_checks import TOKENIZER_FORMS, bpe_size, spec_error

# The model's vocabulary is the tokenizer's rounded up to a multiple of 64: a fixed multiple
# keeps the model's shape independent of the mesh (a checkpoint restores onto any mesh), every
# `model` axis of up to 64 devices that is a power of two divides it, and matmuls of such
# widths run faster (nanoGPT's 50,257 -> 50,304). The extra ids are never targets, and
# generate never samples them.
VOCAB_MULTIPLE = 64
EOT_TOKEN = "<|endoftext|>"
BYTE_VALUES = 256
# End-of-document tokens of common tokenizers (GPT-2, Llama 3, Llama 2/Mistral, Gemma).
EOT_NAMES = (EOT_TOKEN, "<|end_of_text|>", "</s>", "<eos>")
# Text is encoded in pieces of about this many characters (the Encodings of a piece take about
# 80 bytes a token; pieces keep that bounded whatever the text's size), PIECES at a time.
PIECE_CHARS = 1 << 16
PIECES = 16


def model_vocab(size: int) -> int:
    """The model's vocabulary for a tokenizer of `size` ids (see VOCAB_MULTIPLE)."""
    return -(-size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def vocab_for(tokenizer: Tokenizer, vocab_size: int | None) -> int:
    """The model's vocabulary: model_vocab(vocab_size) where the model names its real one
    (model.transformer.vocab_size, an imported model's), refusing a tokenizer with more ids
    than that; else the tokenizer's rounded up."""
    if vocab_size is None:
        return model_vocab(tokenizer.vocab_size)
    if tokenizer.vocab_size > vocab_size:
        raise UsageError(
            f"recipe key 'model.transformer.vocab_size': the tokenizer ({tokenizer.description}) "
            f"makes {tokenizer.vocab_size:,} ids, more than the model's {vocab_size:,}"
        )
    return model_vocab(vocab_size)


def token_dtype(vocab_size: int) -> np.dtype:
    """Token ids in memory and in shards: 16 bits while they fit, else 32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters: byte-level BPE vocabularies (GPT-2's,
    Llama 3's, dtcli's) are written in it. Printable Latin-1 bytes stand for themselves, the
    others take the characters from U+0100 on, in byte order."""
    table = {b: chr(b) for b in (*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100))}
    extra = iter(range(0x100, 0x200))
    for b in range(256):
        if b not in table:
            table[b] = chr(next(extra))
    return dict(sorted(table.items()))


class Tokenizer:
    """The interface; ByteTokenizer and HFTokenizer are the two kinds."""

    vocab_size: int
    eot: int | None
    description: str

    def encode(self, text: bytes) -> np.ndarray:
        raise NotImplementedError

    def encode_blocks(self, blocks: Iterable[bytes]) -> Iterator[np.ndarray]:
        """The ids of a text given in consecutive blocks of bytes, a part at a time."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
        raise NotImplementedError

    def pieces(self) -> list[bytes]:
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    @cached_property
    def token_bytes(self) -> np.ndarray:
        """The text bytes each id stands for (0 for special tokens such as end of document)."""
        return np.array([len(p) for p in self.pieces()], np.int64)

    def target_bytes(self, ids: np.ndarray) -> int:
        """UTF-8 bytes of the text the tokens `ids` cover (bits per byte's denominator)."""
        return int(self.token_bytes[np.asarray(ids, np.int64)].sum())


class ByteTokenizer(Tokenizer):
    """One token per byte, its value: any bytes, UTF-8 or not, round-trip. `eot`: 256 where the
    end-of-document token follows the bytes (prepare-text's shards), else None."""

    def __init__(self, eot: int | None = None):
        self.eot = eot
        self.vocab_size = BYTE_VALUES if eot is None else BYTE_VALUES + 1
        self.description = (
            "byte tokens"
            if eot is None
            else "byte tokens (256 byte values plus the end-of-document token)"
        )

    def encode(self, text: bytes) -> np.ndarray:
        return np.frombuffer(bytes(text), np.uint8)

    def encode_blocks(self, blocks: Iterable[bytes]) -> Iterator[np.ndarray]:
        return (np.frombuffer(block, np.uint8) for block in blocks)

    def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
        ids = np.asarray(ids)
        return ids[ids < BYTE_VALUES].astype(np.uint8).tobytes()  # the end of document: none

    def pieces(self) -> list[bytes]:
        return [bytes([i]) for i in range(BYTE_VALUES)] + [b""] * (self.vocab_size - BYTE_VALUES)

    def to_json(self) -> str:
        tok = byte_identity()
        if self.eot is not None:
            tok.add_special_tokens([EOT_TOKEN])
        return tok.to_str()

    def target_bytes(self, ids: np.ndarray) -> int:
        return int(np.count_nonzero(np.asarray(ids) < BYTE_VALUES))


def byte_identity() -> Any:
    """A `tokenizers` tokenizer whose ids are the byte values: ByteTokenizer as a tokenizer.json."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {char: b for b, char in bytes_to_unicode().items()}
    tok = HF(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_identity(spec: dict[str, Any]) -> tuple[bool, int | None]:
    """Whether `spec` is ByteTokenizer's tokenizer.json, and its end-of-document id (None: none;
    prepare-text's shards: EOT_TOKEN as id 256)."""
    model = spec.get("model") or {}
    added = spec.get("added_tokens") or []
    eot = [t for t in added if t.get("content") == EOT_TOKEN and t.get("id") == BYTE_VALUES]
    same = (
        model.get("type") == "BPE"
        and not model.get("merges")
        and len(added) == len(eot)
        and model.get("vocab") == {char: b for b, char in bytes_to_unicode().items()}
    )
    return same, (BYTE_VALUES if eot else None)


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer. Text that is not UTF-8 is read with U+FFFD in place
    of each bad sequence (`tokenizers` takes Unicode strings); ids never include special tokens
    the tokenizer's template would add (a BOS per piece of text)."""

    def __init__(self, tok: Any, description: str):
        self.tok = tok
        self.description = description
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        found = (tok.token_to_id(name) for name in EOT_NAMES)
        self.eot = next((i for i in found if i is not None), None)

    def encode(self, text: bytes) -> np.ndarray:
        parts = list(self.encode_blocks([text]))
        return np.concatenate(parts) if parts else np.zeros(0, token_dtype(self.vocab_size))

    def encode_blocks(self, blocks: Iterable[bytes]) -> Iterator[np.ndarray]:
        return self.encode_pieces(text_pieces(blocks))

    def encode_pieces(self, pieces: Iterable[str]) -> Iterator[np.ndarray]:
        """The ids of each group of PIECES pieces of text, in order (`tokenizers` encodes a
        group on all cores)."""
        dtype = token_dtype(self.vocab_size)
        group: list[str] = []
        for piece in pieces:
            group.append(piece)
            if len(group) == PIECES:
                yield self._encode_group(group, dtype)
                group = []
        if group:
            yield self._encode_group(group, dtype)

    def _encode_group(self, group: list[str], dtype: np.dtype) -> np.ndarray:
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # no offsets
        ids = [np.asarray(e.ids, dtype) for e in encode(group, add_special_tokens=False)]
        return np.concatenate(ids)

    def decode(self, ids: Sequence[int] | np.ndarray) -> bytes:
        if self._byte_level:  # exact, even for ids that end inside a UTF-8 character
            return b"".join(self._pieces[int(i)] for i in ids)
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True).encode()

    def pieces(self) -> list[bytes]:
        return self._pieces

    def to_json(self) -> str:
        return self.tok.to_str()

    @cached_property
    def _byte_level(self) -> bool:
        decoder = json.loads(self.tok.to_str()).get("decoder") or {}
        return decoder.get("type") == "ByteLevel"

    @cached_property
    def _pieces(self) -> list[bytes]:
        """Exact for byte-level tokenizers (GPT-2's, Llama 3's, dtcli's BPE); for others the
        token's text with SentencePiece's '▁' as a space and byte-fallback '<0xNN>' as its
        byte (their decoders drop a text's first space: close, not exact)."""
        special = {t.content for t in self.tok.get_added_tokens_decoder().values() if t.special}
        byte_of = {char: b for b, char in bytes_to_unicode().items()}
        out = [b""] * self.vocab_size
        for token, i in self.tok.get_vocab(with_added_tokens=True).items():
            if token in special or i >= self.vocab_size:
                continue
            if self._byte_level and all(c in byte_of for c in token):
                out[i] = bytes(byte_of[c] for c in token)
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
                out[i] = bytes([int(token[3:5], 16)])
            else:
                out[i] = token.replace("\u2581", " ").removeprefix("##").encode()
        return out


def with_eot(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer` with an end-of-document token: its own, or EOT_TOKEN added as a special token
    after its last id (bytes: id 256)."""
    if tokenizer.eot is not None:
        return tokenizer
    if isinstance(tokenizer, ByteTokenizer):
        return ByteTokenizer(eot=BYTE_VALUES)
    from tokenizers import Tokenizer as HF

    tok = HF.from_str(tokenizer.to_json())
    tok.add_special_tokens([EOT_TOKEN])
    return HFTokenizer(tok, f"{tokenizer.description} and {EOT_TOKEN}")


def from_json(text: str, description: str) -> Tokenizer:
    """A tokenizer from tokenizer.json's text (ByteTokenizer where it is the byte identity)."""
    from tokenizers import Tokenizer as HF

    spec = tokenizer_json.parsed(text)
    same, eot = _byte_identity(spec)
    if same:
        return ByteTokenizer(eot)
    tok = HF.from_str(text)
    kind = (spec.get("model") or {}).get("type", "a")
    size = tok.get_vocab_size(with_added_tokens=True)
    return HFTokenizer(tok, f"{kind} tokenizer of {size:,} ids ({description})")


def from_spec(spec: str, named: str) -> Tokenizer | None:
    """The tokenizer a spec names before any text is read: bytes, or a tokenizer.json (or a
    folder holding one); None for bpe:N (its size checked: trained once its text is read).
    Anything else is refused listing what a spec may be; `named` as for `load`."""
    if spec == "bytes":
        return ByteTokenizer()
    if bpe_size(spec, named) is not None:
        return None
    if not spec.strip():
        raise spec_error(named, spec, TOKENIZER_FORMS)
    try:
        missing = not storage.as_path(spec).exists()
    except OSError:  # a file system that cannot be reached: `load` says why
        missing = False
    if missing:
        raise spec_error(named, spec, TOKENIZER_FORMS, f"no file or folder {spec!r} exists")
    return load(spec, named)


def load(path: str, named: str) -> Tokenizer:
    """A tokenizer.json at `path` (or in the folder `path`: a hub model's or a run's); `named`:
    how errors name it ("recipe key 'data.tokenizer'", "--tokenizer")."""
    if not path.strip():
        raise spec_error(named, path, TOKENIZER_FORMS)
    where = storage.as_path(path)
    try:
        if where.is_dir():
            where = where / "tokenizer.json"
        return from_json(tokenizer_json.read_text(where), str(where))
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{named}: cannot read {str(where)!r} ({reason})") from None
    except tokenizer_json.NotATokenizer as exc:
        why = str(exc)
    except Exception as exc:  # noqa: BLE001 - `tokenizers`' own errors
        why = one_line(exc)
    raise UsageError(
        f"{named}: {str(where)!r} is not a tokenizer.json (the UTF-8 JSON Hugging Face "
        f"`tokenizers` saves): {why}"
    )


def read_saved(saved: Any) -> Tokenizer | None:
    """The tokenizer a run saved at `saved` (rundir.TOKENIZER), or None where there is none."""
    if saved is None:
        return None
    saved = storage.as_path(saved)
    if not saved.exists():
        return None
    try:
        return from_json(saved.read_text(), f"the run's {saved.name}")
    except Exception as exc:  # noqa: BLE001 - a damaged file, whatever the parser says
        raise UsageError(
            f"{str(saved)!r}: the run's tokenizer cannot be read ({one_line(exc)})"
        ) from None


def train_bpe(texts: Iterable[str], vocab_size: int, what: str = "the training text") -> Tokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer and byte alphabet) of at most `vocab_size` ids:
    EOT_TOKEN (id 0), the 256 bytes, then merges learned from `texts` (fewer where the text
    has no more pairs to merge: its description says so). Training is deterministic: the same
    text gives the same tokenizer."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    size = tok.get_vocab_size(with_added_tokens=True)
    capped = f" (of {vocab_size:,} asked: it has no more merges)" if size < vocab_size else ""
    return HFTokenizer(tok, f"a byte-level BPE of {size:,} tokens trained on {what}{capped}")


# A cut between two lines "X\nY" (X and Y not spaces): GPT-2's pre-tokenizer splits there
# whatever comes before or after, so a byte-level BPE gives pieces cut there the ids of the whole.
_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def line_pieces(blocks: Iterable[str], size: int | None = None) -> Iterator[str]:
    """The text of `blocks` (consecutive parts of one document) again, in pieces of `size` to
    2 x `size` characters cut at line boundaries (_CUT); a stretch with no such boundary is cut
    at 2 x `size` (its ids then differ a little from the whole's; the text round-trips all the
    same). `size` defaults to PIECE_CHARS."""
    size = size or PIECE_CHARS
    carry = ""
    for block in blocks:
        carry = carry + block if carry else block
        start = 0
        while len(carry) - start >= 2 * size:
            found = _CUT.search(carry, start + size, start + 2 * size)
            cut = found.start() if found else start + 2 * size
            yield carry[start:cut]
            start = cut
        carry = carry[start:]
    if carry:
        yield carry


def text_pieces(blocks: Iterable[bytes]) -> Iterator[str]:
    """Consecutive blocks of a document's bytes as its text in line_pieces (bad UTF-8 read as
    U+FFFD, a character cut between two blocks read whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decoded() -> Iterator[str]:
        for block in blocks:
            yield decoder.decode(block)
        yield decoder.decode(b"", final=True)

    return line_pieces(decoded())
