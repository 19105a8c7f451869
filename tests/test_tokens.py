"""Token shards: `prepare-text` writes fixed-size shards of token ids, an index and the
end-of-document token between documents; source tokens streams windows of them in an order
that is a pure function of (seed, epoch), client groups read disjoint shards, a run resumed
mid-epoch ends equal, and a run keeps the shards' tokenizer (generate needs no shards)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
from conftest import RECIPES, ROOT, dtcli, env

from dtcli import data as D
from dtcli import recipe as R
from dtcli import tfruntime
from dtcli.data import prepare, tokens
from dtcli.data import tokenizer as T
from dtcli.errors import UsageError

CONTEXT = 16
WORDS = "the of and to in is was that for on with as by at from his her they thou art".split()
# 1 block 16 wide: the GPT compiles in seconds.
TINY = [
    "model.transformer={layers: 1, d_model: 16, heads: 2, mlp_ratio: 2, context: 16}",
    "data.batch_size=8",
    "data.eval_batch_size=8",
    "train.steps_per_call=4",
    "optimizer.warmup_steps=2",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3 files (3 documents) of seeded random lines, 44 KB."""
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for name in ("a.txt", "b.txt", "c.txt"):
        lines = (" ".join(rng.choice(WORDS, rng.integers(3, 12))) for _ in range(600))
        (folder / name).write_text("\n".join(lines).capitalize() + "\n")
    return folder


@pytest.fixture(scope="module")
def shards(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "tok"
    index = prepare.prepare_text(str(corpus / "*.txt"), "bpe:300", out, shard_tokens=1000)
    return out, index


def ids_of(folder, split, index) -> list[np.ndarray]:
    return [
        np.fromfile(folder / name, index["dtype"]) for name, _ in index["splits"][split]["shards"]
    ]


def test_prepare_text_writes_fixed_size_shards_and_ends_documents(corpus, shards):
    out, index = shards
    tok = tokens.shards_tokenizer(str(out))
    assert index["dtype"] == "uint16" and index["eot"] == tok.eot == 0
    texts = [(corpus / n).read_bytes() for n in ("a.txt", "b.txt", "c.txt")]
    for split in ("train", "eval"):
        sizes = [n for _, n in index["splits"][split]["shards"]]
        assert all(n == 1000 for n in sizes[:-1]) and 0 < sizes[-1] <= 1000
        for (name, n), ids in zip(index["splits"][split]["shards"], ids_of(out, split, index)):
            assert len(ids) == n and (out / name).stat().st_size == 2 * n
    train = np.concatenate(ids_of(out, "train", index))
    evaluate = np.concatenate(ids_of(out, "eval", index))
    # a.txt, EOT, b.txt, EOT, c.txt's head | c.txt's tail, cut at a line's end
    na, nb = len(tok.encode(texts[0])), len(tok.encode(texts[1]))
    assert list(np.flatnonzero(train == tok.eot)) == [na, na + 1 + nb]
    np.testing.assert_array_equal(train[:na], tok.encode(texts[0]))
    head = tok.decode(train)
    assert head.startswith(texts[0] + texts[1]) and head.endswith(b"\n")
    assert head + tok.decode(evaluate) == b"".join(texts)
    assert not (evaluate == 0).any()
    total = sum(map(len, texts))
    info = index["splits"]
    assert info["train"]["bytes"] + info["eval"]["bytes"] == total
    assert info["eval"]["bytes"] == pytest.approx(total * 0.1, abs=200)
    assert info["train"]["documents"] == 3 and info["eval"]["documents"] == 1


def test_bytes_shards_hold_every_byte_of_the_input_utf8_or_not(tmp_path, capsys):
    """Bytes that are not UTF-8 (a binary file) are tokens as they are, one each: the shards
    are the files' bytes with the end-of-document id 256 between them, and index.json's
    figures agree (U+FFFD used to take 3 tokens in place of each bad byte)."""
    from dtcli import cli
    from dtcli import data as D

    rng = np.random.default_rng(0)
    raw = [rng.integers(0, 256, 3000, dtype=np.uint8).tobytes() + b"\n" for _ in range(2)]
    raw[1] += b"\xff\xfe\xc3\n" * 400  # the evaluation split: bad UTF-8 too
    for i, data in enumerate(raw):
        (tmp_path / f"{i}.bin").write_bytes(data)
    out = tmp_path / "tok"
    assert cli.run(["prepare-text", str(tmp_path / "*.bin"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "byte tokens (256 byte values plus the end-of-document token)" in printed
    index = json.loads((out / "index.json").read_text())
    assert (index["vocab_size"], index["eot"]) == (257, 256)
    ids = [np.concatenate(ids_of(out, split, index)) for split in ("train", "eval")]
    text = [ids[0][ids[0] != 256].astype(np.uint8).tobytes(), ids[1].astype(np.uint8).tobytes()]
    assert text[0] + text[1] == b"".join(raw) and (ids[0] == 256).sum() == 1
    for split, part in zip(("train", "eval"), ids):
        info = index["splits"][split]
        assert info["tokens"] == len(part) == info["bytes"] + info["documents"] - 1
    tok = tokens.shards_tokenizer(str(out))  # read back: bytes, exact
    assert isinstance(tok, T.ByteTokenizer) and tok.eot == 256 and tok.vocab_size == 257
    assert tok.decode(ids[1]) == text[1] and tok.target_bytes(ids[0]) == len(text[0])
    # as data.tokenizer of source text, the same tokens: every byte
    cfg = R.DataConfig(source="text", path=str(tmp_path / "1.bin"), context=8, tokenizer=str(out))
    ds = D.load(cfg)
    assert ds.train.tokens.tobytes() + ds.eval.tokens.tobytes() == raw[1]
    assert ds.num_classes == 320


def test_sigterm_during_prepare_text_removes_its_output_and_exits_143(tmp_path):
    """SIGTERM (a scheduler's stop) as Ctrl-C: what the run wrote is removed, one line, exit
    143 (dtcli's SIGTERM code); it used to leave the shards without index.json. The writer
    stops after its first shard's ids, as a slow preparation would, for the signal."""
    (tmp_path / "a.txt").write_text("some text to tokenize\n" * 300)
    out = tmp_path / "tok"
    code = textwrap.dedent("""
        import sys, time
        from dtcli import cli
        from dtcli.data import prepare
        write = prepare._ShardWriter.write
        def slow(self, ids):
            write(self, ids)
            print("writing", flush=True)
            time.sleep(60)
        prepare._ShardWriter.write = slow
        sys.exit(cli.run(sys.argv[1:]))
    """)
    args = ["prepare-text", str(tmp_path / "a.txt"), "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout.readline() == "writing\n"
        assert (out / "tokenizer.json").is_file()  # half written, as the trial found it
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert err.splitlines() == [
        f"preempted (SIGTERM); prepare-text stopped and removed what it wrote to --out {str(out)!r}"
    ]
    assert not out.exists()


def test_prepare_text_into_an_incomplete_output_says_so(tmp_path):
    (tmp_path / "a.txt").write_text("text\n" * 100)
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")
    (out / "train-00000.bin").write_bytes(b"\0\0")
    with pytest.raises(UsageError, match="holds an incomplete prepare-text output .no index.json"):
        prepare.prepare_text(str(tmp_path / "a.txt"), "bytes", out)
    (out / "index.json").write_text("{}")
    with pytest.raises(UsageError, match="holds a finished prepare-text output"):
        prepare.prepare_text(str(tmp_path / "a.txt"), "bytes", out)
    assert sorted(p.name for p in out.iterdir()) == [
        "index.json",
        "tokenizer.json",
        "train-00000.bin",
    ]


def prepare_error(tmp_path, source: str, **options) -> str:
    out = tmp_path / "refused"
    with pytest.raises(UsageError) as caught:
        prepare.prepare_text(source, options.pop("tokenizer", "bytes"), out, **options)
    assert not out.exists()  # nothing left behind
    return str(caught.value)


def test_prepare_text_says_why_a_source_gives_no_split(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    assert prepare_error(tmp_path, str(tmp_path / "empty.txt")) == (
        f"SOURCE: {tmp_path / 'empty.txt'} is empty (expected text)"
    )
    (tmp_path / "line.txt").write_text("word " * 200)  # no line break: no cut
    assert prepare_error(tmp_path, str(tmp_path / "line.txt")) == (
        f"SOURCE: its evaluation split is empty: --eval-fraction 0.1 cuts {tmp_path / 'line.txt'} "
        "at byte 900, the cut moves to a line's end, and the file has no line break; give text "
        "in lines, or several files (the split may fall between two)"
    )
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "a.txt").write_text("line\n" * 100)
    (tmp_path / "lines" / "b.txt").write_text("word " * 100)
    message = prepare_error(tmp_path, str(tmp_path / "lines"))
    assert message.endswith(
        "give --eval-fraction 0.5 or more, text in lines, or several files (the split may fall between two)"
    )
    index = prepare.prepare_text(str(tmp_path / "lines"), "bytes", tmp_path / "ok", 0.5)
    assert index["splits"]["eval"]["bytes"] == 500


def test_prepare_text_says_what_a_glob_matched_that_is_no_file(tmp_path):
    for name in ("d1", "d2"):
        (tmp_path / name).mkdir()
    os.mkfifo(tmp_path / "pipe")
    assert prepare_error(tmp_path, str(tmp_path / "d*")) == (
        f"SOURCE: {str(tmp_path / 'd*')!r} matches no file, only 2 folders ({tmp_path / 'd1'}, "
        f"{tmp_path / 'd2'}); a glob reads the files it matches (give a folder itself to read "
        "every file under it)"
    )
    assert "only 1 FIFO" in prepare_error(tmp_path, str(tmp_path / "pi*"))
    assert prepare_error(tmp_path, str(tmp_path / "pipe")) == (
        f"SOURCE: {str(tmp_path / 'pipe')!r} is a FIFO, expected a file or a folder"
    )
    assert "no file, folder or glob match" in prepare_error(tmp_path, str(tmp_path / "x*"))


def test_prepare_text_tfds_errors_name_its_options_with_the_native_logs_hidden(
    tmp_path, monkeypatch
):
    """The TFDS helpers' errors name source text's recipe keys: prepare-text's own options
    instead; TensorFlow's native start-up lines are hidden, as other commands hide them."""
    pytest.importorskip("tensorflow_datasets")
    quieted = []
    quiet = tfruntime.quiet_native_logs

    def recorded():
        quieted.append(True)
        return quiet()

    monkeypatch.setattr(tfruntime, "quiet_native_logs", recorded)
    message = prepare_error(tmp_path, "tfds:tiny_shakespear")
    assert message.startswith("SOURCE: no TFDS data set named 'tiny_shakespear'")
    assert quieted
    where = tmp_path / "tfds"
    tfds = prepare.TfdsOptions(data_dir=str(where))
    message = prepare_error(tmp_path, "tfds:tiny_shakespeare", tfds=tfds)
    assert message == (
        f"SOURCE: TFDS data set 'tiny_shakespeare' is not prepared in {where} and --download is "
        "not given; prepare it where there is network (`tfds build tiny_shakespeare --data_dir "
        "DIR`) and give --data-dir DIR, or --download"
    )


def test_prepare_text_prints_thousands_and_a_capped_bpes_real_size(corpus, tmp_path, capsys):
    from dtcli import cli

    out = tmp_path / "tok"
    args = ["prepare-text", str(corpus / "a.txt"), "--tokenizer", "bpe:70000"]
    assert cli.run([*args, "--out", str(out), "--shard-tokens", "4"]) == 0
    index = json.loads((out / "index.json").read_text())
    size = index["vocab_size"]
    assert size < 1000 and index["tokenizer"] == (
        f"a byte-level BPE of {size} tokens trained on the training split (of 70,000 asked: it "
        "has no more merges)"
    )
    shards = len(index["splits"]["train"]["shards"])
    assert shards > 1000 and f"in {shards:,} shards" in capsys.readouterr().out
    assert "70,000" not in tokens.shards_tokenizer(str(out)).description
    for spec, expected in (("", "--tokenizer '': expected bytes | bpe:N | tokenizer.json"),
                           ("bpe:9", "--tokenizer 'bpe:9': expected bpe:N with N, the vocabulary size, an integer from 257")):  # fmt: skip
        assert prepare_error(tmp_path, str(corpus / "a.txt"), tokenizer=spec).startswith(expected)


def test_prepare_text_reads_its_tokenizer_before_anything_else(tmp_path):
    """--tokenizer is refused before the split (issue 43: a name that is no tokenizer was
    reported after it, here its failure), a binary file as no tokenizer.json (it was a
    UnicodeDecodeError)."""
    source = tmp_path / "line.txt"
    source.write_text("word " * 200)  # no line break: its split is refused
    npy = tmp_path / "a.npy"
    npy.write_bytes(b"\x93NUMPY\x01\x00v\x00" + bytes(100))
    for spec, expected in (
        ("gpt2", "--tokenizer 'gpt2': expected bytes | bpe:N | tokenizer.json (a path to one, or "
                 "to a folder holding one); no file or folder 'gpt2' exists"),
        (str(npy), f"--tokenizer: {str(npy)!r} is not a tokenizer.json (the UTF-8 JSON Hugging "
                   "Face `tokenizers` saves): a binary file, not UTF-8 text (byte 0x93 at offset 0)"),
        ("bpe:", "--tokenizer 'bpe:': expected bpe:N with N, the vocabulary size"),
    ):  # fmt: skip
        assert prepare_error(tmp_path, str(source), tokenizer=spec).startswith(expected)
    assert "evaluation split is empty" in prepare_error(tmp_path, str(source))


def windows(ds) -> list[tuple[np.ndarray, np.ndarray]]:
    return list(ds.as_numpy_iterator())


def test_windows_are_the_shards_tokens_in_a_seeded_order(cpu8, shards):
    out, index = shards
    cfg = R.DataConfig(source="tokens", path=str(out), context=CONTEXT)
    ds = D.load(cfg)
    assert ds.num_classes == 320 and ds.tokenizer.vocab_size == 300
    # evaluation: in order, every CONTEXT tokens from each shard's start
    held = ids_of(out, "eval", index)
    got = windows(D.examples(ds.eval, 0, 0, False, 0, 1))
    assert len(got) == len(ds.eval) == sum(len(h) // CONTEXT - 1 for h in held)
    np.testing.assert_array_equal(got[1][0], held[0][16:32])
    np.testing.assert_array_equal(got[1][1], held[0][17:33])
    targets = np.concatenate([h[1 : 1 + (len(h) // CONTEXT - 1) * CONTEXT] for h in held])
    assert ds.eval.target_bytes == ds.tokenizer.target_bytes(targets)
    # training: the same order for the same (seed, epoch), another for the next epoch
    epoch0 = windows(D.examples(ds.train, 7, 0, True, 0, 1))
    assert len(epoch0) == len(ds.train)
    again = windows(D.examples(ds.train, 7, 0, True, 0, 1))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(epoch0, again))
    epoch1 = windows(D.examples(ds.train, 7, 1, True, 0, 1))
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(epoch0, epoch1))
    # each window is CONTEXT + 1 consecutive tokens of one shard
    raw = [s.tobytes() for s in ids_of(out, "train", index)]
    for x, y in epoch0[:50]:
        np.testing.assert_array_equal(x[1:], y[:-1])
        window = np.concatenate([x, y[-1:]]).astype(np.uint16).tobytes()
        assert any(_aligned_find(r, window) for r in raw)


def _aligned_find(haystack: bytes, needle: bytes) -> bool:
    at = haystack.find(needle)
    while at >= 0 and at % 2:
        at = haystack.find(needle, at + 1)
    return at >= 0


def _keys(pairs) -> Counter:
    return Counter(x.tobytes() + y[-1:].tobytes() for x, y in pairs)


@pytest.mark.parametrize("split, groups", [("train", 2), ("eval", 3)])
def test_client_groups_read_disjoint_shares_that_make_the_epoch(cpu8, shards, split, groups):
    """14 training shards dealt to 2 groups (disjoint files); 2 evaluation shards for 3
    groups: too few, every group reads the same order and keeps its n-th window."""
    out, _ = shards
    stream = getattr(D.load(R.DataConfig(source="tokens", path=str(out), context=CONTEXT)), split)
    shuffle = split == "train"
    whole = _keys(windows(D.examples(stream, 3, 0, shuffle, 0, 1)))
    shares = [_keys(windows(D.examples(stream, 3, 0, shuffle, g, groups))) for g in range(groups)]
    assert sum(shares, Counter()) == whole
    assert all(not (a & b) for i, a in enumerate(shares) for b in shares[i + 1 :])
    assert [sum(s.values()) for s in shares] == D.share_counts(stream, groups)


def gpt_recipe(folder, *sets):
    return R.load(
        RECIPES / "tiny_gpt.yaml",
        R.Overrides(
            ("data.source=tokens", f"data.path={folder}", *TINY, *sets),
            mesh="batch=1",
            devices="cpu:8",
        ),
    )


def test_a_run_resumed_mid_epoch_on_token_shards_ends_equal(cpu8, shards, tmp_path):
    """Stretches of 6 steps: after the first call of the second (4 steps) a checkpoint is saved
    and the run goes on to step 12; a new session restored from it and finishing the stretch
    (skipping the 4 batches it trained, in the same order) ends with the same weights."""
    from dtcli import checkpoint as ckpt_lib
    from dtcli import models
    from dtcli import session as T
    from dtcli import steps as steps_lib

    # DTensor, not XLA, on this one device: XLA's compile was 2/3 of the test's time (38 -> 16 s).
    recipe = gpt_recipe(shards[0], "train.steps=12", "train.eval_every=6", "train.compile=dtensor")
    whole = T.prepare(recipe, use_devices=1)
    call = steps_lib.make_steps(whole)[0]
    T.run_epoch(whole, call, T.EpochState(0))
    saver = ckpt_lib.Checkpointer(tmp_path, whole.checkpoint_objects(), keep=1)
    saved = []

    def save_once() -> None:
        if not saved:
            saved.append(saver.save(int(whole.optimizer.iterations.numpy()), {"step": 10}))

    T.run_epoch(whole, call, T.EpochState(1), trained=save_once)
    assert int(whole.optimizer.iterations.numpy()) == 12

    resumed = T.prepare(recipe, use_devices=1)
    ckpt_lib.Checkpointer(tmp_path, resumed.checkpoint_objects(), keep=1).restore(saved[0])
    assert int(resumed.optimizer.iterations.numpy()) == 10
    T.run_epoch(resumed, steps_lib.make_steps(resumed)[0], T.EpochState(1, batch=4))
    assert int(resumed.optimizer.iterations.numpy()) == 12
    reference = models.host_weights(whole.model, whole.mesh)
    for path, value in models.host_weights(resumed.model, resumed.mesh).items():
        np.testing.assert_allclose(value, reference[path], rtol=1e-5, atol=1e-6, err_msg=path)


@pytest.mark.slow
def test_a_run_from_shards_keeps_their_tokenizer_and_generates_without_them(cpu8, shards, tmp_path):
    """Trained in a fresh process on one device (this one has 8: a mesh of 8 compiles 8
    copies); generated here on one of its 8."""
    from dtcli import generate

    folder = tmp_path / "tok"
    shutil.copytree(shards[0], folder)
    out = tmp_path / "run"
    sets = [x for s in TINY for x in ("--set", s)]
    proc = dtcli(
        "train", RECIPES / "tiny_gpt.yaml", "--set", "data.source=tokens",
        "--set", f"data.path={folder}", *sets, "--set", "train.steps=4", "--out", out,
        "--no-progress", "--set", "train.compile=dtensor",  # XLA's compile: 2x the test's time
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    # bits per byte: the nats of every eval token over the text bytes they cover
    stream = D.load(R.DataConfig(source="tokens", path=str(folder), context=CONTEXT)).eval
    nats = record["eval_loss"] * record["eval_tokens"]
    assert record["eval_bpb"] == pytest.approx(nats / math.log(2) / stream.target_bytes)
    assert record["eval_bpb"] < record["eval_loss"] / math.log(2)  # > 1 byte a token
    assert (out / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()
    shutil.rmtree(folder)
    text = generate.stream(out, "the", 6, temperature=0, devices="cpu:8", use_devices=1)
    assert "".join(text).strip()


@pytest.mark.slow
def test_two_clients_train_on_disjoint_token_shards(shards, tmp_path):
    """14 training shards on 2 clients (7 each): one epoch counts every window once,
    in as many steps as the larger share needs."""
    out = tmp_path / "run"
    folder, index = shards
    sets = [x for s in TINY for x in ("--set", s)]
    proc = dtcli(
        "launch", "--clients", "2", "--devices-per-client", "cpu:1", RECIPES / "tiny_gpt.yaml",
        "--mesh", "batch=2", "--set", "data.source=tokens", "--set", f"data.path={folder}",
        *sets, "--set", "train.steps=null", "--set", "train.eval_every=null",
        "--set", "optimizer.schedule=constant", "--epochs", "1", "--out", out, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    counts = [tokens.train_windows(n, CONTEXT) for _, n in index["splits"]["train"]["shards"]]
    shares = [sum(counts[0::2]), sum(counts[1::2])]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["train_tokens"] == sum(counts) * CONTEXT
    assert record["step"] == max(-(-n // 4) for n in shares)  # 4 rows of 8 per client
    assert "eval_bpb" in record


def test_a_bpe_sizes_the_model_from_the_size_it_reached_in_memory_and_in_shards(tmp_path):
    """bpe:N on a text with fewer pairs than N merges gives a model of the size the BPE reached,
    from source text (in memory: describe, which plan and the memory check read, and load) and
    from prepare-text's shards alike, as the tokenizer.json a run saves would rebuild it (issue 43:
    source text sized it from the N asked, the shards from the size reached)."""
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    rich = (" ".join("".join(rng.choice(letters, 6)) for _ in range(12)) for _ in range(500))
    corpora = {"poor": "ab ba\n" * 400, "rich": "\n".join(rich) + "\n"}
    asked = 448
    for name, text in corpora.items():
        path = tmp_path / f"{name}.txt"
        path.write_text(text)
        bpe = R.TrainTokenizerConfig(vocab_size=asked)
        in_memory = R.DataConfig(source="text", path=str(path), tokenizer=bpe, context=CONTEXT)
        prepare.prepare_text(str(path), f"bpe:{asked}", tmp_path / name)
        shards = R.DataConfig(source="tokens", path=str(tmp_path / name), context=CONTEXT)
        seen = {}
        for cfg in (in_memory, shards):
            ds = D.load(cfg, ("train", "eval"))
            seen[cfg.source] = (D.describe(cfg)[1], ds.num_classes, ds.tokenizer.vocab_size)
        reached = seen["text"][2]
        assert seen["text"] == seen["tokens"] == (T.model_vocab(reached),) * 2 + (reached,), name
        assert (reached < 300) if name == "poor" else (reached == asked), (name, reached)
