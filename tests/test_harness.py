"""lm-evaluation-harness over a dtcli session (dtcli.harness.model.SessionLM), against `dtcli
score` and `dtcli generate` run in another process (their own code paths, not the adapter's):

- loglikelihood (tests/data/lm_tasks/tiny_mc): each choice's log likelihood is the sum of
  score's log probabilities over the continuation's tokens as lm-eval splits them (the whole
  text encoded once; the continuation the tokens past the context's own encoding), an item whose
  BPE merges across the boundary included: there lm-eval scores the context's own tokens and
  then the whole's tokens past their count ("Long live t" + "he king!" is " t" then " king!",
  the merged " the" lost), so score is given the text of exactly those tokens (checked to
  encode back to them); acc and acc_norm are the argmax over those sums (and over sums / the
  choice's UTF-8 bytes);
- loglikelihood_rolling (tiny_ppl): each document's log likelihood is score's with the prefix
  token in front and --stride CONTEXT (the same windows as lm-eval's disjoint rolling ones), a
  document longer than the context included; word/byte perplexity and bits per byte as lm-eval
  computes them from it;
- both on one device and on batch=2,model=2, within 1e-5 relative;
- generate_until (tiny_gen): greedy generate's text, cut before the first stop string;
- is_greedy, left truncation, one compiled shape, the refusal without a prefix token.

Every lm-eval run is offline (HF_*_OFFLINE, HF_HOME in a tmp folder)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import LM_CONTEXT, LM_TASKS, ROOT, env

from dtcli import score
from dtcli.errors import UsageError

# Checked: lm-eval's results equal to `dtcli score` and `dtcli
# generate` on the same checkpoint (1e-5 relative); Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

MESHES = {"one": ("batch=1", 1), "tp": ("batch=2,model=2", 4)}
GEN_TOKENS = 16  # tiny_gen.yaml's max_gen_toks
REL = 1e-5


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (LM_TASKS / f"{name}.jsonl").read_text().splitlines()]


MC = records("tiny_mc")
PPL = [r["text"] for r in records("tiny_ppl")]
GEN = [r["prompt"] for r in records("tiny_gen")]
EOT_TEXT = "<|endoftext|>"  # dtcli's BPE's end-of-text token: lm-eval's prefix token here

# `dtcli score`'s and `dtcli generate`'s own library paths (what score_path and the generate
# command call, --json's object), in a fresh process on one CPU: one TensorFlow import for all
# the texts, where the CLI entry would restore the checkpoint once per text.
EXPECTED = f"""
import json, sys
from dtcli import generate, score

run, texts, prompts, tokens = json.loads(sys.stdin.read())
scorer = score.Scorer.restored(run, "batch=1", "cpu:1", stride={LM_CONTEXT})
scores = [json.loads(score.as_json(scorer.score(score.Text(t, "--text")))) for t in texts]
gen = generate.Generator(run, "batch=1", "cpu:1")
settings = generate.Settings(tokens, temperature=0.0)
answers = [a for _, a in gen.answers([p.encode() for p in prompts], settings)]
print(json.dumps([scores, [{{"text": a.text, "tokens": a.tokens}} for a in answers]]))
"""


@pytest.fixture(scope="module", autouse=True)
def offline(tmp_path_factory):
    hf = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(hf))
        mp.setenv("HF_DATASETS_CACHE", str(hf / "datasets"))
        yield


@pytest.fixture(scope="module")
def tokenizer(lm_run):
    """The run's tokenizer read by `tokenizers` itself (not through dtcli)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(lm_run / "tokenizer.json"))


def split_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's _encode_pair, spelled out: trailing spaces move to the continuation; the whole
    text encoded once; the continuation the tokens past the context's own encoding."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok.encode(context + continuation).ids
    ctx = tok.encode(context).ids
    return ctx, whole[len(ctx) :]


@pytest.fixture(scope="module")
def expected_process(lm_run, tokenizer):
    """The fresh process, started first: it runs while this one evaluates."""
    pairs = [split_pair(tokenizer, r["question"], c) for r in MC for c in r["choices"]]
    texts = [tokenizer.decode(ctx + cont) for ctx, cont in pairs] + [EOT_TEXT + d for d in PPL]
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(EXPECTED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env(),
    )
    proc.stdin.write(json.dumps([str(lm_run), texts, GEN, GEN_TOKENS]))
    proc.stdin.close()
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def expected(expected_process) -> dict:
    """score's log likelihood of each tiny_mc choice's continuation and each tiny_ppl document;
    generate's greedy answer to each tiny_gen prompt."""
    out = expected_process.stdout.read()
    assert expected_process.wait(timeout=600) == 0, expected_process.stderr.read()[-4000:]
    scores, answers = json.loads(out.strip().splitlines()[-1])
    mc, rest = scores[: sum(len(r["choices"]) for r in MC)], scores[-len(PPL) :]
    return {"mc": mc, "ppl": rest, "gen": answers}


@pytest.fixture(scope="module")
def lms(lm_run, expected_process):
    from dtcli.harness.model import SessionLM

    out = {}
    for name, (mesh, use) in MESHES.items():
        session = score.Scorer.restored(lm_run, mesh, "cpu:8", use_devices=use).session
        out[name] = SessionLM(session, run_dir=lm_run)
    return out


def evaluate(lm, tasks: list[str]) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(LM_TASKS), include_defaults=False)
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, log_samples=True)


@pytest.fixture(scope="module")
def results(lms) -> dict:
    return {name: evaluate(lm, ["tiny_mc", "tiny_ppl", "tiny_gen"]) for name, lm in lms.items()}


def by_doc(samples: list[dict]) -> list[dict]:
    return sorted(samples, key=lambda s: s["doc_id"])


@pytest.mark.parametrize("mesh", MESHES)
def test_choices_are_score_sums_and_acc_their_argmax(results, expected, tokenizer, mesh):
    samples = by_doc(results[mesh]["samples"]["tiny_mc"])
    assert len(samples) == len(MC) >= 20
    sums = iter(expected["mc"])
    acc, acc_norm, merged = [], [], 0
    for record, sample in zip(MC, samples):
        ours = [ll for ll, _ in sample["filtered_resps"]]
        want = []
        for choice, args in zip(record["choices"], sample["arguments"]):
            assert tuple(args) == (record["question"], choice)
            ctx, cont = split_pair(tokenizer, record["question"], choice)
            scored = next(sums)
            assert scored["tokens"] == ctx + cont  # what lm-eval scores, token for token
            merged += tokenizer.encode(record["question"] + choice).ids != ctx + cont
            # logprobs[i] predicts token i + 1: the continuation's are the last len(cont)
            want.append(math.fsum(scored["logprobs"][len(ctx) - 1 :]))
        np.testing.assert_allclose(ours, want, rtol=REL)
        lengths = [len(c.encode("utf-8")) for c in record["choices"]]
        acc.append(float(np.argmax(want) == record["answer"]))
        acc_norm.append(float(np.argmax(np.array(want) / lengths) == record["answer"]))
    assert merged >= 1  # "Long live t" + "he king!": the whole text's tokens cross the boundary
    task = results[mesh]["results"]["tiny_mc"]
    assert task["acc,none"] == pytest.approx(np.mean(acc))
    assert task["acc_norm,none"] == pytest.approx(np.mean(acc_norm))


@pytest.mark.parametrize("mesh", MESHES)
def test_rolling_is_score_with_the_prefix_token(results, expected, tokenizer, lms, mesh):
    samples = by_doc(results[mesh]["samples"]["tiny_ppl"])
    eot = lms[mesh].eot_token_id
    lls, words, nbytes = [], 0, 0
    for doc, sample, scored in zip(PPL, samples, expected["ppl"]):
        # score's text is the prefix token, then the document's own tokens
        assert scored["tokens"] == [eot, *tokenizer.encode(doc).ids]
        assert sample["filtered_resps"][0] == pytest.approx(scored["sum"], rel=REL)
        lls.append(scored["sum"])
        words += len(re.split(r"\s+", doc))  # lm-eval's count_words
        nbytes += len(doc.encode("utf-8"))
    assert max(len(s["tokens"]) for s in expected["ppl"]) > 2 * LM_CONTEXT  # several windows
    task = results[mesh]["results"]["tiny_ppl"]
    assert task["word_perplexity,none"] == pytest.approx(math.exp(-sum(lls) / words), rel=REL)
    assert task["byte_perplexity,none"] == pytest.approx(math.exp(-sum(lls) / nbytes), rel=REL)
    bpb = -sum(lls) / nbytes / math.log(2)
    assert task["bits_per_byte,none"] == pytest.approx(bpb, rel=REL)


@pytest.mark.parametrize("mesh", MESHES)
def test_generate_until_is_greedy_generate_cut_at_the_first_stop(results, expected, mesh):
    samples = by_doc(results[mesh]["samples"]["tiny_gen"])
    assert [s["arguments"][0][0] for s in samples] == GEN
    stops = ["\n", "."]
    cut = 0
    for sample, answer in zip(samples, expected["gen"]):
        text = answer["text"]
        at = min([text.find(s) for s in stops if s in text], default=len(text))
        cut += at < len(text)
        assert sample["filtered_resps"][0] == text[:at]
    assert cut >= 1  # a stop string ended at least one answer early


def test_one_device_and_the_mesh_agree(results):
    one, tp = results["one"]["results"], results["tp"]["results"]
    for task in ("tiny_mc", "tiny_ppl", "tiny_gen"):
        for key, value in one[task].items():
            if isinstance(value, float) and "stderr" not in key:
                assert tp[task][key] == pytest.approx(value, rel=REL), (task, key)


def test_is_greedy_on_the_models_own_continuation(lms, expected, tokenizer):
    lm = lms["one"]
    answer = expected["gen"][0]["tokens"][:8]  # greedy generate's own tokens
    context = tokenizer.encode(GEN[0]).ids
    wrong = [*answer[:-1], (answer[-1] + 1) % 300]
    got = lm._loglikelihood_tokens([(None, context, answer), (None, context, wrong)])
    assert [g for _, g in got] == [True, False]
    assert got[0][0] > got[1][0]


def test_a_long_request_is_left_truncated_as_lm_evals_hf(lms, tokenizer):
    """(context + continuation)[-(max_length + 1):][:-1] is the input: a context longer than the
    window scores as its last tokens alone, and only as many as fit."""
    lm = lms["one"]
    ids = tokenizer.encode(PPL[-1]).ids
    assert len(ids) > 2 * LM_CONTEXT
    context, continuation = ids[:-5], ids[-5:]
    keep = LM_CONTEXT + 1 - len(continuation)
    full, fitted, shorter = lm._loglikelihood_tokens(
        [(None, c, continuation) for c in (context, context[-keep:], context[-keep + 1 :])]
    )
    assert full == fitted
    assert full[0] != shorter[0]


def test_batches_run_in_a_few_shapes_each_compiled_once(lms, results):
    """Requests of every length (tiny_mc's short ones, the rolling windows of a whole context)
    ran in windows of a power of two from 16 up to the context, each shape traced once; the
    short ones not padded to the context (their equality with score: the tests above)."""
    from dtcli.harness.requests import window_length

    assert [window_length(n, 64, True) for n in (1, 16, 17, 33, 64, 65)] == [16, 16, 32] + [64] * 3
    assert window_length(5, 64, False) == 64  # a model built at its context's length
    for lm in lms.values():
        lengths = {length for rows, length in lm.shapes_run if rows == lm.rows}
        assert len(lengths) == len(lm.shapes_run) and LM_CONTEXT in lengths
        assert lengths <= {16, 32, 64} and min(lengths) < LM_CONTEXT
        tracings = lm._logprobs.logprobs.experimental_get_tracing_count()
        assert tracings == len(lm.shapes_run)


def test_rolling_without_a_prefix_token_is_refused(lms):
    """A tokenizer with neither a BOS nor an end of text (bytes without one) has no token to
    start a document from."""
    from lm_eval.api.instance import Instance

    from dtcli.data.tokenizer import ByteTokenizer
    from dtcli.harness.model import SessionLM

    session = lms["one"].session
    data = dataclasses.replace(session.data, tokenizer=ByteTokenizer())
    lm = SessionLM(dataclasses.replace(session, data=data))
    request = Instance("loglikelihood_rolling", {}, ("Some text.",), 0)
    with pytest.raises(UsageError) as refused:
        lm.loglikelihood_rolling([request])
    assert str(refused.value) == (
        "lm-eval: loglikelihood_rolling (document perplexity) needs a prefix token (a BOS or an "
        "end-of-text token) and this run's tokenizer (byte tokens) has neither; train with one that "
        "has (data.tokenizer bpe:N adds an end-of-text token)"
    )


def test_the_tasks_load_from_a_copy_of_their_folder(tmp_path, monkeypatch):
    """The task YAMLs read their JSON files from their own folder wherever it is (lm-eval's
    data_files would resolve against the working directory)."""
    import shutil

    from lm_eval.tasks import TaskManager

    copy = tmp_path / "tasks"
    shutil.copytree(LM_TASKS, copy)
    monkeypatch.chdir(tmp_path)
    manager = TaskManager(include_path=str(copy), include_defaults=False)
    tasks = manager.load(["tiny_mc", "tiny_ppl", "tiny_gen"])["tasks"]
    counts = {name: len(list(task.test_docs())) for name, task in tasks.items()}
    assert counts == {"tiny_mc": len(MC), "tiny_ppl": len(PPL), "tiny_gen": len(GEN)}
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_a_bos_tokenizer_encodes_as_score_and_lm_evals_hf(lms, lm_run):
    """With a post-processor that writes a BOS (a Llama tokenizer's): tok_encode puts it first
    as score's encoding does, not twice where the text starts with it; the prefix token is the
    BOS; add_special_tokens=False writes none."""
    from tokenizers import Tokenizer, processors

    from dtcli.data.tokenizer import HFTokenizer
    from dtcli.harness.model import SessionLM

    tok = Tokenizer.from_file(str(lm_run / "tokenizer.json"))
    bos = tok.token_to_id(EOT_TEXT)  # stands in for a BOS: a special token of its own
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOT_TEXT} $A", special_tokens=[(EOT_TEXT, bos)]
    )
    session = lms["one"].session
    data = dataclasses.replace(session.data, tokenizer=HFTokenizer(tok, "with a BOS"))
    lm = SessionLM(dataclasses.replace(session, data=data))
    plain = tok.encode("The king", add_special_tokens=False).ids
    assert lm.prefix_token_id == bos
    assert lm.tok_encode("The king") == [bos, *plain]
    assert lm.tok_encode(EOT_TEXT + "The king") == [bos, *plain]
    assert lm.tok_encode("The king", add_special_tokens=False) == plain


def test_a_chat_template_is_refused_where_the_run_has_none(lms):
    with pytest.raises(UsageError, match="--apply-chat-template: this run was trained without"):
        lms["one"].apply_chat_template([{"role": "user", "content": "Hi"}])


def test_apply_chat_template_renders_the_template_the_run_directory_keeps(lms, lm_run, tmp_path):
    """--apply-chat-template on a run trained on plain text: the chat template of the
    tokenizer_config.json the run keeps in RUN_DIR/hf (an imported model's), found from the run
    directory SessionLM is given; a run directory without one is refused."""
    from dtcli.harness.model import SessionLM

    session = lms["one"].session
    run = tmp_path / "run"
    (run / "hf").mkdir(parents=True)
    (run / "tokenizer.json").write_bytes((lm_run / "tokenizer.json").read_bytes())
    template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    config = {"chat_template": template}
    (run / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    history = [{"role": "user", "content": "Who comes here?"}]
    rendered = SessionLM(session, run_dir=run).apply_chat_template(history)
    assert rendered == "[user] Who comes here?\n[assistant] "
    with pytest.raises(UsageError, match="--apply-chat-template"):
        SessionLM(session, run_dir=lm_run).apply_chat_template(history)
