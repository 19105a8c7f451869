"""`dtcli generate` with the KV cache: at every step (window restarts included) the cached
forward pass gives the logits of the window pass training runs, so greedy text is the same with
and without the cache, on 1 device (plain variables compiled by XLA, and DTensor) and on
batch=2,model=4 (heads split, prompts on the data axis); several prompts batched give each
prompt's text alone; top-p, end of document, the windowing policy, what the command prints, and
its options."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import ROOT, SHAKESPEARE, StampedStream, dtcli, env, run_cli

from dtcli import generate, rundir
from dtcli.infer import decoding
from dtcli.recipe import Overrides

# Checked: the cached forward pass equal to the window pass
# (1e-4) and texts equal to each other; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

CONTEXT = 16
# recipes/tiny_gpt_tensor_parallel.yaml shrunk as in test_language_model.py: 8 heads split 4
# ways on model=4. Trained on one device in a fresh process (about 15 s): enough for greedy
# text that differs between the prompts (" the the the" after "ROMEO:\nThe", "und" after "O").
# train.compile xla: its checkpoint still generates on any mesh (rundir.checkpoint_recipe).
TRAIN = [
    "train.compile=xla",
    f"model.transformer={{layers: 1, d_model: 32, heads: 8, mlp_ratio: 2, context: {CONTEXT}}}",
    "data.batch_size=16",
    "data.eval_batch_size=8",
    "train.steps_per_call=20",
    "train.steps=600",
    "train.eval_every=600",
    "optimizer.learning_rate=1e-2",
    "optimizer.warmup_steps=5",
    "optimizer.min_learning_rate=1e-3",
]
# Ragged lengths; the last is longer than the context (its first window is a restarted one).
PROMPTS = [b"ROMEO:", b"O", b"First Citizen:\nBefore we proceed any further, hear me"]
TOKENS = 30  # past the context: every prompt's window restarts (at least twice)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    # Real text even without ../shared (write_corpus's drawn words give every prompt one
    # continuation): docs/benchmarks.md's prose then (over the 20,000 bytes taken; the README,
    # its first fallback, shrank below them).
    source = SHAKESPEARE if SHAKESPEARE.is_file() else ROOT / "docs" / "benchmarks.md"
    folder = tmp_path_factory.mktemp("generate")
    (folder / "corpus.txt").write_bytes(source.read_bytes()[:20_000])
    sets = [x for s in (f"data.path={folder / 'corpus.txt'}", *TRAIN) for x in ("--set", s)]
    recipe = ROOT / "recipes" / "tiny_gpt_tensor_parallel.yaml"
    out = folder / "run"
    r = dtcli("train", recipe, *sets, "--mesh", "batch=1", "--devices", "cpu:1", "--out", out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def one(run_dir, cpu8):
    return generate.Generator(run_dir, mesh="batch=1", devices="cpu:8", use_devices=1)


@pytest.fixture(scope="module")
def one_dtensor(run_dir, cpu8):
    """One device on DTensor, as a run with train.compile dtensor generates."""
    sets = ("train.compile=dtensor",)
    return generate.Generator(run_dir, "batch=1", "cpu:8", use_devices=1, sets=sets)


@pytest.fixture(scope="module")
def tp(run_dir, cpu8):
    return generate.Generator(run_dir, mesh="batch=2,model=4", devices="cpu:8")


def greedy(tokens: int = TOKENS, cache: bool = True, **kw) -> generate.Settings:
    return generate.Settings(tokens, temperature=0.0, cache=cache, **kw)


def texts(gen, prompts, settings) -> list[str]:
    return [text for _, text in gen.texts(prompts, settings)]


@pytest.mark.parametrize("name", ["one", "tp"])
def test_the_cache_gives_the_window_passes_logits_at_every_step(name, request):
    """Both forward passes on the same steps (greedy on the cached logits): equal to float32
    noise at every step, through restarts that come at different steps for different rows
    (a step then refills some rows' caches and extends the others')."""
    gen = request.getfixturevalue(name)
    rows = gen.rows_for(len(PROMPTS))
    assert rows == (3 if name == "one" else 4)  # padded to the data axis (2)
    cached, window = gen.forward_for(True, rows), gen.forward_for(False, rows)
    cached.reset()
    gaps, mixed, restarts = [], 0, np.zeros(rows, int)

    def both(step: decoding.Step) -> np.ndarray:
        nonlocal mixed
        a, b = cached(step), window(step)
        gaps.append(float(np.max(np.abs(a - b)[step.active])))
        mixed += bool((step.restart & step.active).any() and (~step.restart & step.active).any())
        restarts[:] += step.restart & step.active
        return a

    ids = [gen.tokenizer.encode(p) for p in PROMPTS]
    picked = list(decoding.run(ids, both, CONTEXT, TOKENS, rows, lambda i, x: int(np.argmax(x))))
    assert len(picked) == TOKENS and max(gaps) < 1e-4, gaps
    assert mixed > 0 and (restarts[: len(PROMPTS)] >= 3).all(), restarts  # the first window too


def test_greedy_text_is_the_same_with_and_without_the_cache_on_any_mesh_and_alone(one, tp):
    base = texts(one, PROMPTS, greedy())
    assert len(set(base)) == len(base) and all(len(t.encode()) >= TOKENS for t in base), base
    assert texts(one, PROMPTS, greedy(cache=False)) == base
    assert texts(tp, PROMPTS, greedy()) == base
    assert texts(tp, PROMPTS, greedy(cache=False)) == base
    # each prompt alone (one row; on the mesh: padded to two rows)
    assert [texts(one, [p], greedy())[0] for p in PROMPTS] == base
    assert texts(tp, PROMPTS[2:], greedy()) == base[2:]


def test_a_data_axis_neither_batch_key_divides_generates_the_same_text(run_dir, one):
    """generate uses neither data.batch_size (16) nor data.eval_batch_size (8): it pads its
    prompts to the data axis, so batch=3 is no reason to refuse it."""
    three = generate.Generator(run_dir, mesh="batch=3", devices="cpu:8", use_devices=3)
    assert three.rows_for(2) == 3
    assert texts(three, PROMPTS[:2], greedy(8)) == texts(one, PROMPTS[:2], greedy(8))


def test_generate_keeps_the_checkpoints_model(run_dir, cli):
    """A --set that changes a weight's shape is refused before any weight is read; what changes
    no weight (dropout, remat: neither runs at inference) may be set."""
    r = cli("generate", run_dir, "--set", "model.transformer.heads=4", "--tokens", "1")
    assert r.code == 2 and len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith(
        "error: --set model.transformer.heads: generate keeps the checkpoint's model, whose "
        "model.transformer.heads is 8 (not 4); only model.transformer.dropout, "
    ), r.err
    ckpt = rundir.complete_checkpoints(run_dir)[-1]
    for sets in (("model.transformer.dropout=0.1",), ("model.transformer.remat=true",)):
        assert rundir.checkpoint_recipe(ckpt, "generate", Overrides(sets)).task == "language_model"


def test_one_device_generates_on_plain_variables_compiled_by_xla_as_dtensor_does(one, one_dtensor):
    """The same greedy tokens at every step as the one-device DTensor path on the same
    checkpoint, with and without the cache; each pass traced once (its shapes never change), so
    XLA compiles it once."""
    assert one.session.xla and not one_dtensor.session.xla
    assert all(not hasattr(v, "layout") for v in one.session.model.variables.values())
    for cache in (True, False):
        on_xla = list(one.steps(PROMPTS, greedy(cache=cache)))
        assert on_xla == list(one_dtensor.steps(PROMPTS, greedy(cache=cache))), cache
        assert len(on_xla) == TOKENS
    cached, window = one.forward_for(True, 3), one.forward_for(False, 3)
    for function in (cached.gpt.prefill, cached.gpt.decode, window.logits_at):
        assert function.experimental_get_tracing_count() == 1


def test_caches_are_laid_out_batch_on_the_data_axis_heads_on_model(tp):
    from tensorflow.experimental import dtensor

    forward = tp.forward_for(True, 4)
    list(tp.steps(PROMPTS, greedy(3)))
    assert "with the KV cache, on DTensor;" in tp.stats.line()
    for cache in forward.caches:
        layout = dtensor.fetch_layout(cache)
        assert layout.sharding_specs == ["batch", "model", "unsharded", "unsharded"]
        # [4 rows, 8 heads, context, head_dim 4] over batch=2 x model=4
        assert dtensor.unpack(cache)[0].shape == (2, 2, CONTEXT, 4)


def test_top_p_tiny_is_greedy_and_a_seed_gives_the_same_sample(one):
    tiny = generate.Settings(20, temperature=1.0, top_p=1e-6, seed=3)
    assert texts(one, PROMPTS[:2], tiny) == texts(one, PROMPTS[:2], greedy(20))
    sampled = generate.Settings(20, temperature=1.0, top_p=0.9, seed=3)
    assert texts(one, PROMPTS[:2], sampled) == texts(one, PROMPTS[:2], sampled)


def test_a_prompt_stops_at_end_of_document_and_the_others_go_on(one, monkeypatch):
    steps = list(one.steps(PROMPTS, greedy(12)))
    alone = [[t for s in steps for i, t in s if i == row] for row in range(len(PROMPTS))]
    eot = next(t for t in alone[0][2:] if t not in alone[0][:2])  # prompt 0 stops early
    monkeypatch.setattr(one.tokenizer, "eot", eot)
    stopped = list(one.steps(PROMPTS, greedy(12)))
    for row, tokens in enumerate(alone):
        got = [t for s in stopped for i, t in s if i == row]
        expected = tokens[: tokens.index(eot) + 1] if eot in tokens else tokens
        assert got == expected, row
    assert len(alone[0]) == 12 and len([t for s in stopped for i, t in s if i == 0]) < 12


def test_the_loop_stops_each_row_at_its_end_of_document_then_all():
    scripted = {0: [1, 9, 5], 1: [2, 3, 4, 5], 2: [9]}
    seen = []

    def forward(step: decoding.Step) -> np.ndarray:
        seen.append(step.active.tolist())
        return np.zeros((4, 16))

    def pick_row(i, logits):
        return scripted[i].pop(0)

    out = list(decoding.run([np.array([7])] * 3, forward, 4, 4, 4, pick_row, stop_ids={9}))
    assert out == [[(0, 1), (1, 2), (2, 9)], [(0, 9), (1, 3)], [(1, 4)], [(1, 5)]]
    assert seen[0] == [True, True, True, False] and seen[2] == [False, True, False, False]
    everyone = {0: [9], 1: [9]}
    done = list(
        decoding.run([np.array([7])] * 2, forward, 4, 5, 2, lambda i, x: everyone[i][0], {9})
    )
    assert done == [[(0, 9), (1, 9)]]  # all stopped: no more steps


def test_the_windowing_policy():
    """The window of n tokens: all of them up to the context; then it restarts at the last
    context // 2 and grows back to the context, one token per step."""
    for context in (1, 2, 5, 16):
        keep = decoding.restart_keep(context)
        lengths = [n - decoding.window_start(n, context) for n in range(1, 200)]
        assert lengths[:context] == list(range(1, context + 1))
        for before, after in zip(lengths[context - 1 :], lengths[context:]):
            assert after == (keep if before == context else before + 1), (context, lengths)
    assert decoding.window_start(17, 16) == 9 and decoding.window_start(25, 16) == 9
    assert decoding.window_start(26, 16) == 18


def test_pick_top_p_keeps_the_fewest_most_likely_tokens_that_reach_p():
    logits = np.log([0.5, 0.3, 0.2, 0.0 + 1e-12])
    rng = np.random.default_rng(0)
    for p, allowed in ((0.45, {0}), (0.55, {0, 1}), (0.79, {0, 1}), (0.85, {0, 1, 2})):
        assert {generate.pick(logits, 1.0, None, rng, top_p=p) for _ in range(200)} == allowed
    plain = [generate.pick(logits, 1.0, None, np.random.default_rng(1)) for _ in range(50)]
    full = [
        generate.pick(logits, 1.0, None, np.random.default_rng(1), top_p=1.0) for _ in range(50)
    ]
    assert plain == full


def test_write_prints_blocks_for_several_prompts_and_tokens_per_second(one):
    out, err = io.StringIO(), io.StringIO()
    generate.write(one, PROMPTS[:2], greedy(5), out, err)
    expected = texts(one, PROMPTS[:2], greedy(5))
    assert out.getvalue() == (
        f"==> prompt 1: 'ROMEO:' <==\n{expected[0]}\n\n==> prompt 2: 'O' <==\n{expected[1]}\n"
    )
    line = err.getvalue()
    assert line.startswith("tokens/s: ") and "10 new tokens" in line
    assert "with the KV cache, compiled by XLA;" in line
    out, err = io.StringIO(), io.StringIO()
    generate.write(one, PROMPTS[:1], greedy(5, cache=False), out, err)
    assert out.getvalue() == expected[0] + "\n" and "without a cache" in err.getvalue()


def test_a_prompt_longer_than_the_context_is_noted_with_what_the_model_sees(one):
    """A prompt longer than the context used to be cut to its last window silently: stderr
    says how long it is and how many of its last tokens the first window holds (the windowing
    policy's window_start); a prompt that fits says nothing."""
    n = len(one.tokenizer.encode(PROMPTS[2]))
    seen = n - decoding.window_start(n, CONTEXT)
    assert CONTEXT // 2 <= seen < CONTEXT < n
    tail = (
        f"{n} tokens, longer than the context {CONTEXT}: generating from its last {seen} "
        f"(a full window starts again from its last {CONTEXT // 2} tokens)"
    )
    for prompts, which in ((PROMPTS, "prompt 3"), (PROMPTS[2:], "the prompt")):
        out, err = io.StringIO(), io.StringIO()
        generate.write(one, prompts, greedy(1), out, err)
        assert err.getvalue().splitlines()[:-1] == [f"note: {which}: {tail}"]
    out, err = io.StringIO(), io.StringIO()
    generate.write(one, PROMPTS[:2], greedy(1), out, err)
    assert err.getvalue().startswith("tokens/s: ")


def test_the_command_passes_its_options_to_the_library(cpu8, tmp_path, monkeypatch):
    calls = []

    class Stub:
        def __init__(self, path, mesh=None, devices=None, sets=(), progress=True, **chat):
            calls.append((path, mesh, sets, progress))
            assert chat == {"chat": False, "chat_template": None}

    monkeypatch.setattr(generate, "Generator", Stub)
    monkeypatch.setattr(
        generate, "write", lambda g, prompts, s, out, err: calls.append((prompts, s))
    )
    r = run_cli(
        "generate",
        "R",
        "--prompt",
        "a",
        "--prompt",
        "b",
        "--top-p",
        ".5",
        "--no-cache",
        "--set",
        "train.compile=dtensor",
    )
    assert r.code == 0, r.err
    assert calls[0] == ("R", None, ("train.compile=dtensor",), True)
    assert calls[1][0] == [b"a", b"b"]
    assert calls[1][1] == generate.Settings(200, 1.0, None, 0.5, 0, cache=False)
    (tmp_path / "p.txt").write_bytes("one\r\n\n  \ntwo é\n".encode())
    assert run_cli("generate", "R", "--prompts", tmp_path / "p.txt", "--no-progress").code == 0
    assert calls[-1][0] == [b"one", "two é".encode()] and calls[-1][1].cache
    assert calls[-2] == ("R", None, (), False)  # --no-progress: no heartbeat (was refused)


def test_the_rate_line_of_a_short_request_has_no_steady_rate():
    short = generate.Stats(tokens=0, seconds=0.0, cache=True)
    for elapsed in (1.0, 1.5):
        short.add(1, elapsed)
    assert "nan" not in short.line() and "all of it the first steps" in short.line()
    long = generate.Stats(tokens=0, seconds=0.0, cache=True)
    for elapsed in (1.0, 1.5, 2.0, 2.5):
        long.add(1, elapsed)
    assert "2.0 after the first 2 steps, which took 1.50 s" in long.line()  # 2 in 1 s


@pytest.mark.slow
def test_ctrl_c_stops_generate_started_with_sigint_ignored(run_dir):
    """A script's background job inherits SIGINT ignored, and Python keeps it so: generate ran
    to its end and exited 0. A user who presses Ctrl-C (kill -INT) expects it to stop: 130."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtcli", "generate", str(run_dir), "--tokens", "100000",
         "--temperature", "0", "--devices", "cpu:1"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        assert proc.stdout.read(1)  # the first new text: it is generating
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.decode().strip().splitlines()[-1] == "error: interrupted"


def test_generate_says_it_compiles_until_its_first_text_then_never_inside_the_text(monkeypatch):
    """Into a pipe, the first step's compile is a heartbeat every BEAT_EVERY seconds (here
    0.05); once the text flows it shows the process is alive, and a line of the heartbeat on
    a shared pipe (2>&1) would land inside it."""
    from dtcli import progress

    monkeypatch.setattr(progress, "BEAT_EVERY", 0.05)
    err = StampedStream()

    def pieces():
        assert err.wait_for(2, "generate: compiling the forward pass... ")  # the compile
        yield "first"
        yield from ["second", "third"]

    got = []
    for piece in generate._first_compiled(pieces(), err):
        got.append(piece)  # the text flows: the heartbeat's thread is gone
        assert not [t for t in threading.enumerate() if t.name == "dtcli-heartbeat"]
    assert got == ["first", "second", "third"]


def test_a_ctrl_c_during_a_step_is_held_until_the_step_is_out():
    """A Ctrl-C raised inside TensorFlow's C++ callbacks came back as a SystemError (generate
    then said 'unexpected', exit 1, in 1 of 2 suite runs): the first is held until the step is
    out, then raised as a KeyboardInterrupt; a second interrupts at once; the handler found is
    put back."""
    import os

    from dtcli.generate import ctrl_c

    # As the command line sets it (cli.main); an xdist worker's own is another.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ctrl_c.held() as pressed:
            os.kill(os.getpid(), signal.SIGINT)  # delivered here: the handler runs at once
            pressed_at_once = pressed.pressed
            with pytest.raises(KeyboardInterrupt):
                pressed.raise_if_pressed()
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert pressed_at_once
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


def test_chat_on_a_run_without_instruction_data_needs_a_template(run_dir, one, cli):
    """A run trained on plain text keeps no chat template: --chat is refused in one line unless
    --chat-template names one; plain then writes no end of turn this tokenizer has (bytes
    without an end of text: a note, and the answer runs its tokens); a template whose special
    tokens the tokenizer lacks is refused."""
    from dtcli.data import chat

    ask = ("generate", run_dir, "--chat", "--prompt", "ROMEO", "--tokens", "3", "--no-progress")
    ask += ("--mesh", "batch=8", "--devices", "cpu:8")
    refused = cli(*ask)
    assert refused.code == 2 and len(refused.err_lines) == 1, refused.err
    assert refused.err_lines[0] == (
        f"error: --chat: {run_dir} was trained without instruction data (data.source text) "
        f"and keeps no chat template; name one with --chat-template ({chat.FORMS})"
    )
    named = cli(*ask, "--chat-template", "plain", "--json", "--temperature", "0")
    assert named.code == 0, named.err
    assert (
        "note: --chat: plain (built in) ends an answer with no token of this tokenizer, so "
        "each answer runs its --tokens (or to the tokenizer's end of text)"
    ) in named.err_lines
    answer = json.loads(named.out)
    assert answer["prompt"] == "ROMEO" and len(answer["tokens"]) == 3 and not answer["stopped"]
    prompt = b"User: ROMEO\nAssistant:"  # plain's generation prompt, by hand
    assert answer["text"] == texts(one, [prompt], greedy(3))[0]
    lacking = cli(*ask, "--chat-template", "chatml")
    assert lacking.code == 2 and len(lacking.err_lines) == 1, lacking.err
    assert lacking.err_lines[0].startswith(
        "error: --chat-template: chatml (built in) writes <|im_start|>, <|im_end|>, which the "
        "tokenizer (byte tokens) does not have as tokens"
    )
