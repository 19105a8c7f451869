"""A text encoded whole, as one document: the tokens a tokenizer makes of it in one call (the
special tokens its post-processor adds included, such as a Llama tokenizer's BOS), and where
each token's text ends in the text's UTF-8 bytes (bits per byte's denominator). `dtcli score`
scores exactly these tokens."""

from __future__ import annotations

import numpy as np

from dtcli.data.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, token_dtype


def encode_document(tokenizer: Tokenizer, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, ends): `text`'s tokens, and the UTF-8 byte offset where each token's text ends (a
    special token's: where it stands). Byte tokens: one byte each."""
    if isinstance(tokenizer, ByteTokenizer):
        ids = tokenizer.encode(text.encode("utf-8"))
        return ids, np.arange(1, len(ids) + 1)
    if not isinstance(tokenizer, HFTokenizer):
        raise TypeError(f"no document encoding for {type(tokenizer).__name__}")
    found = tokenizer.tok.encode(text)  # add_special_tokens: the post-processor's template
    ids = np.asarray(found.ids, token_dtype(tokenizer.vocab_size))
    # `tokenizers` gives offsets in characters: made UTF-8 bytes, 1 to 4 a character by its
    # code point.
    points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    widths = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    byte_at = np.concatenate([[0], np.cumsum(widths)])
    ends = np.asarray([end for _, end in found.offsets], np.int64)
    return ids, byte_at[ends]
