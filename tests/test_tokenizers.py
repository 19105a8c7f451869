"""Tokenizers (dtcli.data.tokenizer): a BPE trained on tiny Shakespeare round-trips the corpus;
a tokenizer.json in GPT-2's format gives the ids `tokenizers` gives; bytes saved as a
tokenizer.json keep the byte values; text in pieces encodes as the whole; the model's
vocabulary is rounded up and generate never picks a padding id. No TensorFlow."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import ROOT, SHAKESPEARE

from dtcli.data import tokenizer as T

# Text whose pre-tokens meet every kind of line boundary: blank lines, trailing spaces,
# indentation, words across lines, characters of 2 to 4 UTF-8 bytes.
MIXED = "".join(
    f"Line {i}: naïve café über  {'∑' * (i % 3)} 😀\n"
    + ("\n" if i % 5 == 0 else "")
    + ("   indented\n" if i % 7 == 0 else "")
    + ("trailing   \n" if i % 4 == 0 else "")
    for i in range(400)
).encode()


@pytest.fixture(scope="module")
def shakespeare() -> bytes:
    if not SHAKESPEARE.is_file():
        pytest.skip(f"tiny Shakespeare not available at {SHAKESPEARE} (a fresh clone has none)")
    return SHAKESPEARE.read_bytes()


@pytest.mark.slow
def test_a_bpe_trained_on_shakespeare_round_trips_the_whole_corpus_byte_for_byte(shakespeare):
    train = shakespeare[: int(len(shakespeare) * 0.9)].decode()
    bpe = T.train_bpe(T.line_pieces([train]), 1024)
    again = T.train_bpe(T.line_pieces([train]), 1024)
    assert bpe.to_json() == again.to_json()  # deterministic: a run can train it again
    assert bpe.vocab_size == 1024 and bpe.eot == bpe.tok.token_to_id(T.EOT_TOKEN) == 0
    ids = bpe.encode(shakespeare)
    assert ids.dtype == np.uint16 and ids.max() < 1024
    assert bpe.decode(ids) == shakespeare
    assert bpe.target_bytes(ids) == len(shakespeare)  # the pieces are the text's bytes
    assert 2.2 < len(shakespeare) / len(ids) < 2.7  # merges learned: ~2.4 bytes a token
    # Encoded in pieces (of 64 KiB), the ids are the whole text's.
    whole = bpe.tok.encode(shakespeare.decode(), add_special_tokens=False).ids
    assert np.array_equal(ids, whole)


def test_text_in_pieces_encodes_as_the_whole(monkeypatch):
    monkeypatch.setattr(T, "PIECE_CHARS", 300)
    monkeypatch.setattr(T, "PIECES", 3)
    text = MIXED.decode()
    pieces = list(T.line_pieces([text[:5000], text[5000:]]))
    assert "".join(pieces) == text and len(pieces) > 20
    assert all(p[-1] == "\n" and not p[-2].isspace() for p in pieces[:-1])
    bpe = T.train_bpe([text], 400)
    assert np.array_equal(bpe.encode(MIXED), bpe.tok.encode(text, add_special_tokens=False).ids)
    assert bpe.decode(bpe.encode(MIXED)) == MIXED


def gpt2_tokenizer_json(folder) -> tuple:
    """A tokenizer.json as `tokenizers` writes it for GPT-2's vocabulary format (vocab.json +
    merges.txt in GPT-2's byte alphabet, 'Ġ' for a space, <|endoftext|> last), on a small
    vocabulary made here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = T.bytes_to_unicode()
    vocab = {chars[b]: i for i, b in enumerate(sorted(chars, key=lambda b: ord(chars[b])))}
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ s", "e r", "o u", "Ġa n", "Ġan d"]
    for merge in merges:
        vocab["".join(merge.split())] = len(vocab)
    vocab[T.EOT_TOKEN] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([T.EOT_TOKEN])
    tok.save(str(folder / "tokenizer.json"))
    return tok, vocab


def test_a_gpt2_format_tokenizer_json_gives_the_ids_tokenizers_gives(tmp_path):
    from dtcli import data as D
    from dtcli import recipe as R

    hf, vocab = gpt2_tokenizer_json(tmp_path)
    tok = T.load(str(tmp_path / "tokenizer.json"), "--tokenizer")
    assert tok.vocab_size == len(vocab) == 267 and tok.eot == vocab[T.EOT_TOKEN]
    ids = tok.encode(MIXED)
    assert list(ids) == hf.encode(MIXED.decode(), add_special_tokens=False).ids
    assert list(tok.encode(b" and the")) == [vocab["Ġand"], vocab["Ġthe"]]  # GPT-2's merges
    assert tok.decode(ids) == MIXED and tok.target_bytes(ids) == len(MIXED)
    # a folder holding it (a hub model's, a run's) is the same tokenizer
    assert T.load(str(tmp_path), "x").to_json() == tok.to_json()
    # as data.tokenizer: the windows are its ids, the model's vocabulary rounded up to 64s
    (tmp_path / "corpus.txt").write_bytes(MIXED)
    cfg = R.DataConfig(
        source="text", path=str(tmp_path / "corpus.txt"), context=8, tokenizer=str(tmp_path)
    )
    ds = D.load(cfg)
    assert ds.num_classes == 320 == D.describe(cfg)[1]
    cut = int(len(MIXED) * 0.9)
    while MIXED[cut] & 0xC0 == 0x80:  # the cut moves to a character's first byte
        cut += 1
    train_ids = hf.encode(MIXED[:cut].decode(), add_special_tokens=False).ids
    assert list(ds.train.tokens) == train_ids
    assert np.array_equal(ds.train.x[3], train_ids[3:11])
    eval_targets = ds.eval.y.reshape(-1)
    assert ds.eval.target_bytes == len(tok.decode(eval_targets)) < len(MIXED) - cut


def test_bytes_save_as_a_tokenizer_json_whose_ids_are_the_byte_values():
    from tokenizers import Tokenizer

    raw = bytes(range(256)) + MIXED[:300]
    saved = T.ByteTokenizer().to_json()
    hf = Tokenizer.from_str(saved)
    text = MIXED[:300].decode()
    assert hf.encode(text).ids == list(text.encode())
    assert isinstance(T.from_json(saved, "x"), T.ByteTokenizer)  # read back as bytes
    byte = T.ByteTokenizer()
    assert byte.decode(byte.encode(raw)) == raw  # any byte, UTF-8 or not
    assert byte.target_bytes(byte.encode(raw)) == len(raw)
    # prepare-text's end-of-document token comes after the 256 bytes
    with_eot = T.with_eot(byte)
    assert (with_eot.vocab_size, with_eot.eot) == (257, 256)
    assert list(with_eot.encode(b"ab\xc3\xa9")) == [97, 98, 0xC3, 0xA9]
    assert with_eot.pieces()[256] == b"" and with_eot.pieces()[0xC3] == b"\xc3"


def test_byte_tokens_with_the_end_of_document_token_stay_bytes():
    """prepare-text's byte tokenizer (bytes and <|endoftext|>, id 256) encodes any bytes one
    token each (it used to read them as UTF-8, U+FFFD for each bad byte), reads back as bytes
    from its tokenizer.json (the file earlier versions wrote too), and decodes exactly."""
    from tokenizers import Tokenizer

    tok = T.with_eot(T.ByteTokenizer())
    raw = b"ab\xff\xfe\xc3" + bytes(range(256))
    assert isinstance(tok, T.ByteTokenizer) and (tok.vocab_size, tok.eot) == (257, 256)
    assert list(tok.encode(raw)) == list(raw)
    assert list(np.concatenate(list(tok.encode_blocks([raw[:3], raw[3:]])))) == list(raw)
    assert tok.decode([*raw, 256, 97]) == raw + b"a" and tok.target_bytes([97, 256]) == 1
    assert tok.description == "byte tokens (256 byte values plus the end-of-document token)"
    earlier = Tokenizer.from_str(T.ByteTokenizer().to_json())
    earlier.add_special_tokens([T.EOT_TOKEN])  # what prepare-text wrote before
    assert json.loads(tok.to_json()) == json.loads(earlier.to_str())
    again = T.from_json(earlier.to_str(), "x")
    assert isinstance(again, T.ByteTokenizer) and again.eot == 256
    assert again.description == tok.description and len(again.pieces()) == 257


def test_a_bpe_reads_bad_utf8_as_u_fffd_and_says_its_real_size():
    """BPEs keep their documented U+FFFD for bad UTF-8 (also across two blocks); a BPE the text
    cannot fill says its real size, and that it is capped (it claimed the size asked)."""
    bpe = T.train_bpe(T.line_pieces([MIXED.decode()]), 70000)
    assert bpe.vocab_size < 2000
    assert bpe.description == (
        f"a byte-level BPE of {bpe.vocab_size:,} tokens trained on the training text (of 70,000 "
        "asked: it has no more merges)"
    )
    ids = np.concatenate(list(bpe.encode_blocks([b"caf\xc3", b"\xa9 \xff!"])))
    assert bpe.decode(ids) == "café \ufffd!".encode()
    assert T.train_bpe(["ab " * 50], 258).description.endswith(
        "of 258 tokens trained on the training text"
    )


def test_tokenizer_specs_bpe_shorthand_and_files_that_are_no_tokenizer(tmp_path):
    from dtcli import recipe as R
    from dtcli.errors import UsageError

    recipe = ROOT / "recipes" / "tiny_gpt.yaml"
    shorthand = R.load(recipe, ["data.tokenizer=bpe:512"])
    assert shorthand.data.tokenizer == R.TrainTokenizerConfig(vocab_size=512)
    assert R.dump(shorthand) == R.dump(
        R.load(recipe, ["data.tokenizer={train: bpe, vocab_size: 512}"])
    )
    expected = (
        "expected bpe:N with N, the vocabulary size, an integer from 257 (the 256 bytes and the "
        "end-of-document token) to 1,048,576, like bpe:4096"
    )
    # --set data.tokenizer=bpe: is the YAML mapping {bpe: null}: read as the text given (issue 43)
    for value, why in (("bpe:9", ""), ("bpe:abc", ""), ("bpe:0", ""), ("bpe:-5", ""),
                       ("bpe:", "; N is missing")):  # fmt: skip
        with pytest.raises(UsageError) as bad:
            R.load(recipe, [f"data.tokenizer={value}"])
        assert str(bad.value) == f"recipe key 'data.tokenizer': {expected}, got {value!r}{why}"
    for content, why in (
        ('{"vocab_size": 8}', "JSON, but without the 'model' every tokenizer.json has; its keys: 'vocab_size'"),
        ("[1, 2]", "JSON, but an array where a tokenizer.json holds an object"),
        ("{", "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ('{"model": 5}', "JSON, but its 'model' is a number where a tokenizer.json holds an object"),
        # binary files were a UnicodeDecodeError (issue 43): a .npy, a gzip, a program
        (b"\x93NUMPY\x01\x00v\x00", "a binary file, not UTF-8 text (byte 0x93 at offset 0)"),
        (b"\x1f\x8b\x08\x00" + bytes(99), "a binary file, not UTF-8 text (byte 0x8b at offset 1)"),
        (b"\x7fELF\x02\x01\x01" + bytes(9) + b"\xfe" * 70000,
         "a binary file, not UTF-8 text (byte 0xfe at offset 16)"),
    ):  # fmt: skip
        path = tmp_path / "t.json"
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        with pytest.raises(UsageError) as bad:
            T.load(str(path), "--tokenizer")
        assert str(bad.value) == (
            f"--tokenizer: {str(path)!r} is not a tokenizer.json (the UTF-8 JSON Hugging Face "
            f"`tokenizers` saves): {why}"
        )
    forms = "bytes | bpe:N | tokenizer.json (a path to one, or to a folder holding one)"
    with pytest.raises(UsageError, match=rf"^x: expected {re.escape(forms)}, got ''$"):
        T.load("", "x")
    # a name that is no tokenizer lists what one may be, as an option and as a recipe key
    with pytest.raises(UsageError) as bad:
        T.from_spec("gpt2", "--tokenizer")
    assert (
        str(bad.value) == f"--tokenizer 'gpt2': expected {forms}; no file or folder 'gpt2' exists"
    )
    with pytest.raises(UsageError) as bad:
        T.from_spec("gpt2", "recipe key 'data.tokenizer'")
    assert str(bad.value) == (
        f"recipe key 'data.tokenizer': expected {forms}, got 'gpt2'; no file or folder 'gpt2' exists"
    )


def test_the_models_vocabulary_is_rounded_up_and_generate_never_picks_past_the_tokenizer():
    from dtcli import generate

    assert [T.model_vocab(n) for n in (256, 257, 1024, 50257)] == [256, 320, 1024, 50304]
    logits = np.zeros(320)
    logits[300:] = 50.0  # the padding ids the most likely: they never came up in training
    rng = np.random.default_rng(0)
    assert generate.pick(logits, 0.0, None, rng, vocab=300) < 300
    draws = {generate.pick(logits, 1.0, None, rng, vocab=300) for _ in range(300)}
    assert max(draws) < 300 and len(draws) > 100
    assert generate.pick(logits, 1.0, 5, rng, vocab=300) < 300
