"""Instruction data (`data.source: jsonl`): chat templates render as transformers'
`apply_chat_template` does, each assistant turn (with its end of turn) is the response, one
BOS, examples cut as data.truncate says, windows unpacked and packed with -1 targets outside
the responses and at each example's seam; then trained with `dtcli train` (in this process):
eval counts the response tokens only, its loss is the hand-computed cross-entropy over them,
and accumulating micro-batches counts a step's targets as one batch does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import hf_models
import numpy as np
import pytest
from conftest import run_cli

from dtcli.data import chat, instructions, jsonl
from dtcli.data import tokenizer as T
from dtcli.errors import UsageError

# Checked: templates, masks, and losses equal to numpy's
# cross-entropy or to other batchings of the same examples, within 1e-5; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Speak, speak."},
    {"role": "assistant", "content": "We are accounted poor."},
    {"role": "user", "content": "Hear me"},
    {"role": "assistant", "content": "Speak!"},
]
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# chatml with transformers' generation markers around each answer and its end of turn: what
# `return_assistant_tokens_mask` reads (dtcli finds the spans by comparing renderings instead).
CHATML_MARKED = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}"
)


def small_tokenizer(folder: Path, specials: list[str], bos: str | None = None) -> Path:
    """hf_models' byte-level BPE of 100 ids with `specials` added; `bos`: a post-processor
    that puts it first (as Llama 3's tokenizer.json does)."""
    from tokenizers import Tokenizer, processors

    folder.mkdir(parents=True, exist_ok=True)
    hf_models.tokenizer_json(folder, 100)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(specials)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    tok.save(str(folder / "tokenizer.json"))
    return folder


def encoded(tok: T.Tokenizer, template: chat.Template) -> instructions.Example:
    text, spans = template.spans(CONVERSATION, "test:1")
    return instructions.encoded(instructions.TextEncoder(tok), text, spans)


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_templates_render_and_tokenize_as_transformers_apply_chat_template(tmp_path, name):
    """chatml on a tokenizer without a BOS, llama3 on one whose post-processor adds the BOS
    its template writes too: the text and the ids are transformers' (one BOS)."""
    from transformers import PreTrainedTokenizerFast

    if name == "chatml":
        folder = small_tokenizer(tmp_path, ["<|im_start|>", "<|im_end|>"])
        bos, eos = None, "<|im_end|>"
    else:
        folder = small_tokenizer(tmp_path, LLAMA3_TOKENS, bos="<|begin_of_text|>")
        bos, eos = "<|begin_of_text|>", "<|eot_id|>"
    ref = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token=bos, eos_token=eos
    )
    ref.chat_template = chat.BUILTIN[name]
    tok = T.load(str(folder), "test")
    template = chat.Template(chat.BUILTIN[name], name, bos or "", eos)
    for generation in (False, True):
        want = ref.apply_chat_template(
            CONVERSATION[:4], tokenize=False, add_generation_prompt=generation
        )
        assert template.render(CONVERSATION[:4], generation) == want
    example = encoded(tok, template)
    want_ids = ref.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"]
    assert example.ids.tolist() == want_ids
    if bos is not None:
        assert example.ids.tolist().count(tok.tok.token_to_id(bos)) == 1
    answers = tok.decode(example.ids[example.response])
    assert answers == b"We are accounted poor.Speak!"  # special tokens decode to nothing
    end = tok.tok.token_to_id(eos)
    assert example.ids[example.response].tolist().count(end) == 2  # each turn's end of turn


def test_the_spans_are_those_transformers_generation_markers_give(tmp_path):
    """Every assistant turn and its <|im_end|> is the response; the newline after it is not:
    the mask transformers' `return_assistant_tokens_mask` gives a template marked with
    {% generation %} (dtcli's spans come from rendering prefixes of the unmarked one)."""
    from transformers import PreTrainedTokenizerFast

    folder = small_tokenizer(tmp_path, ["<|im_start|>", "<|im_end|>"])
    ref = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    ref.chat_template = CHATML_MARKED
    out = ref.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    example = encoded(T.load(str(folder), "test"), chat.Template(chat.CHATML, "chatml"))
    assert example.ids.tolist() == out["input_ids"]
    assert example.response.astype(int).tolist() == out["assistant_masks"]


def test_plain_on_bytes_ends_each_answer_with_the_end_of_text_token():
    """plain on bytes: the end-of-text id (256) after each answer, in the response with it;
    the prompt, the roles and the newline after each turn outside."""
    tok = T.ByteTokenizer(eot=T.BYTE_VALUES)
    example = encoded(tok, chat.Template(chat.PLAIN, "plain", eos_token=T.EOT_TOKEN))
    text = b"".join(bytes([i]) if i < 256 else T.EOT_TOKEN.encode() for i in example.ids.tolist())
    assert text == (
        b"Be brief.\n\nUser: Speak, speak.\nAssistant: We are accounted poor.<|endoftext|>\n"
        b"User: Hear me\nAssistant: Speak!<|endoftext|>\n"
    )
    response = example.ids[example.response].tolist()
    assert response == [*b" We are accounted poor.", 256, *b" Speak!", 256]


def test_plain_puts_the_tokenizers_bos_first_once(tmp_path):
    """A template that writes no BOS, on a tokenizer whose post-processor adds one: the BOS
    is put first, once (as tokenizing the rendered text would)."""
    folder = small_tokenizer(tmp_path, LLAMA3_TOKENS, bos="<|begin_of_text|>")
    tok = T.load(str(folder), "test")
    example = encoded(tok, chat.Template(chat.PLAIN, "plain", eos_token="<|eot_id|>"))
    bos = tok.tok.token_to_id("<|begin_of_text|>")
    assert example.ids[0] == bos and example.ids.tolist().count(bos) == 1
    assert not example.response[0]


def example_of(ids: list[int], response: list[int]) -> instructions.Example:
    mask = np.zeros(len(ids), bool)
    mask[response] = True
    return instructions.Example(np.array(ids, np.int32), mask)


def test_truncation_cuts_the_prompts_start_after_the_bos_else_the_end():
    # BOS 1, prompt 10..15, response 20..22.
    ex = example_of([1, 10, 11, 12, 13, 14, 15, 20, 21, 22], [7, 8, 9])
    cut = instructions.fit(ex, 7, "prompt_start", keep=1, where="f:3")
    assert cut.ids.tolist() == [1, 13, 14, 15, 20, 21, 22]
    assert cut.response.tolist() == [False] * 4 + [True] * 3
    # The response alone is longer than what is left after the BOS: the end is cut.
    assert instructions.fit(ex, 3, "prompt_start", 1, "f:3").ids.tolist() == [1, 10, 11]
    assert instructions.fit(ex, 7, "end", 1, "f:3").ids.tolist() == [1, 10, 11, 12, 13, 14, 15]
    assert instructions.fit(ex, 10, "refuse", 1, "f:3") is ex
    with pytest.raises(UsageError, match=r"'data.truncate': f:3: the example is 10 tokens"):
        instructions.fit(ex, 9, "refuse", 1, "f:3")


def test_packed_windows_keep_examples_apart_and_predict_nothing_across_a_seam():
    a = example_of([5, 6, 7, 8], [2, 3])  # prompt 5 6, response 7 8
    b = example_of([9, 10, 11], [2])
    assert instructions.pack(np.array([4, 3, 2, 5]), 8, True).tolist() == [0, 2, 4]
    assert instructions.pack(np.array([4, 3]), 8, False).tolist() == [0, 1, 2]
    x, y = instructions.window([a, b], 9, 0, packed=True, mask_prompt=True)
    assert x.tolist() == [
        [5, 6, 7, 8, 9, 10, 11, 0, 0],
        [1, 1, 1, 1, 2, 2, 2, 0, 0],  # segments: 0 is padding
        [0, 1, 2, 3, 0, 1, 2, 0, 0],  # positions restart at each example
    ]
    # 6 -> 7 and 7 -> 8 (a's answer), 10 -> 11 (b's); 8 never predicts 9: the seam.
    assert y.tolist() == [-1, 7, 8, -1, -1, 11, -1, -1, -1]
    x, y = instructions.window([a, b], 9, 0, packed=True, mask_prompt=False)
    assert y.tolist() == [6, 7, 8, -1, 10, 11, -1, -1, -1]
    x, y = instructions.window([a], 6, 3, packed=False, mask_prompt=True)
    assert x.tolist() == [5, 6, 7, 8, 3, 3] and y.tolist() == [-1, 7, 8, -1, -1, -1]


def test_a_template_whose_special_tokens_the_vocabulary_lacks_is_refused():
    cfg = jsonl_config("unused.jsonl", chat_template="chatml")
    with pytest.raises(UsageError) as err:
        jsonl.describe(cfg)
    assert str(err.value) == (
        "recipe key 'data.chat_template': chatml (built in) writes <|im_start|>, <|im_end|>, "
        "which the tokenizer (byte tokens (256 byte values plus the end-of-document token)) "
        "does not have as tokens (dtcli adds no embedding rows); use a template of the "
        "tokenizer's own tokens, such as plain"
    )


def test_the_default_template_is_the_tokenizer_configs_beside_the_tokenizer(tmp_path):
    folder = small_tokenizer(tmp_path, ["<|im_start|>", "<|im_end|>"])
    config = {"chat_template": chat.CHATML, "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    cfg = jsonl_config("unused.jsonl", tokenizer=str(folder))
    reader = jsonl._reader(cfg, None, jsonl.tokenizer(cfg), "data.path")
    assert reader.template.source == chat.CHATML
    assert reader.template.eos_token == "<|im_end|>"
    assert reader.template.name == f"the chat_template of {folder / 'tokenizer_config.json'}"


def test_an_epoch_is_a_permutation_of_the_windows_dealt_to_client_groups(tmp_path):
    """Each epoch's order is a pure function of (seed, epoch); two client groups read disjoint
    halves of it, together every window once; data.eval_fraction holds out a fixed tenth."""
    from dtcli import data as data_lib

    path = write_jsonl(tmp_path / "t.jsonl", addition(np.random.default_rng(0), 40, 0))
    dataset = data_lib.load(jsonl_config(path, packing=True))
    train = list(jsonl.windows(dataset.train, 0, 0, False, 0, 1))
    assert sum(x[instructions.SEGMENTS].max() for x, _ in train) == 36  # and 4 evaluate
    assert len(train) == len(dataset.train) < 36

    def epoch(e: int, group: int = 0, groups: int = 1) -> list[bytes]:
        windows = jsonl.windows(dataset.train, 0, e, True, group, groups)
        return [x.tobytes() + y.tobytes() for x, y in windows]

    first = epoch(0)
    assert len(set(first)) == len(train) and epoch(0) == first and epoch(1) != first
    halves = epoch(0, 0, 2), epoch(0, 1, 2)
    assert sorted(halves[0] + halves[1]) == sorted(first) and not set(halves[0]) & set(halves[1])
    again = data_lib.load(jsonl_config(path, seed=7, packing=True))
    assert [x.tobytes() for x, _ in jsonl.windows(again.eval, 7, 0, False, 0, 1)] == [
        x.tobytes() for x, _ in jsonl.windows(dataset.eval, 0, 0, False, 0, 1)
    ]


def test_generate_and_score_build_a_trained_runs_model_without_its_template(tmp_path):
    """A run's data without examples (generate, score): the unpacked window of one sequence
    of ids a row, though the run packed; its template, a file since removed, is not read."""
    from dtcli import data as data_lib

    saved = tmp_path / "tokenizer.json"
    saved.write_text(T.ByteTokenizer(eot=T.BYTE_VALUES).to_json())
    gone = str(tmp_path / "gone.jinja")
    cfg = jsonl_config(tmp_path / "t.jsonl", packing=True, chat_template=gone)
    dataset = data_lib.no_data(cfg, saved)
    assert dataset.input_shape == (128,) and dataset.num_classes == 320
    with pytest.raises(UsageError, match="recipe key 'data.chat_template': expected"):
        data_lib.no_data(cfg)  # a new run's template is checked


# --------------------------------------------------------------------------- through dtcli


def jsonl_config(path: str, seed: int = 0, **keys):
    from dtcli import recipe as R

    raw = {
        "seed": seed,
        "task": "language_model",
        "model": {"transformer": {"layers": 1, "d_model": 32, "heads": 2, "context": 128}},
        "data": {"source": "jsonl", "path": str(path), "batch_size": 8, **keys},
    }
    return R.load(raw).data


# The sft run's template, in the tokenizer_config.json beside its (byte) tokenizer: Q:/A:
# lines, each answer ended by the end-of-text token.
QA_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}A: {{ m['content'] }}"
    "{{ eos_token }}\n{% else %}Q: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def addition(rng: np.random.Generator, n: int, offset: int) -> list[tuple[dict, str, str]]:
    """`n` addition questions in the three record forms -> (record, prompt, answer); the
    prompt as QA_TEMPLATE writes it (`offset` shifts the operands: held-out questions are
    other sums)."""
    out = []
    for i in range(n):
        a, b = (int(v) + offset for v in rng.integers(0, 40, 2))
        answer = str(a + b)
        if i % 3 == 0:
            record = {"prompt": f"{a} plus {b}?", "response": answer}
            prompt = f"Q: {a} plus {b}?\n"
        elif i % 3 == 1:
            record = {
                "messages": [
                    {"role": "system", "content": "Add."},
                    {"role": "user", "content": f"{a}+{b}"},
                    {"role": "assistant", "content": answer},
                ]
            }
            prompt = f"Q: Add.\nQ: {a}+{b}\n"
        else:  # alpaca's fields under another template: the instruction is the prompt
            record = {"instruction": f"Add {a} and {b}.", "input": "", "output": answer}
            prompt = f"Q: Add {a} and {b}.\n"
        out.append((record, prompt, answer))
    return out


def write_jsonl(path: Path, examples: list[tuple[dict, str, str]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record, _, _ in examples))
    return path


CONTEXT = 64
RECIPE = f"""\
name: sft
task: language_model
devices: cpu:8
mesh: {{batch: 8}}
model:
  transformer: {{layers: 1, d_model: 32, heads: 2, context: {CONTEXT}}}
data:
  source: jsonl
  path: train.jsonl
  eval_path: eval.jsonl
  tokenizer: tokenizer
  batch_size: 8
optimizer: {{name: adamw, learning_rate: 0.01}}
train: {{steps: 6, eval_every: 3}}
"""


@pytest.fixture(scope="module")
def recipe_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "r.yaml"
    path.write_text(RECIPE)
    return path


@pytest.fixture(scope="module")
def sft(tmp_path_factory, cpu8):
    """A tiny GPT trained on 48 addition questions for 6 steps, evaluated on 8 others after 3
    and 6 steps: byte tokens and QA_TEMPLATE from a tokenizer folder (data.tokenizer), which
    is removed once the run has trained (the run keeps the template). (The folder, the run,
    the training and the eval examples, train's stderr.)"""
    folder = tmp_path_factory.mktemp("sft")
    rng = np.random.default_rng(0)
    train = addition(rng, 48, 0)
    write_jsonl(folder / "train.jsonl", train)
    held_out = addition(rng, 8, 50)
    write_jsonl(folder / "eval.jsonl", held_out)
    (folder / "r.yaml").write_text(RECIPE)
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text(T.ByteTokenizer(eot=T.BYTE_VALUES).to_json())
    config = {"chat_template": QA_TEMPLATE, "eos_token": T.EOT_TOKEN}
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    result = run_cli("train", "r.yaml", "--out", "run", "--no-progress", cwd=folder)
    assert result.code == 0, result.err
    shutil.rmtree(tokenizer)
    return folder, folder / "run", train, held_out, result.err


def response_tokens(examples: list[tuple[dict, str, str]]) -> int:
    """The targets of examples under plain on bytes: " ANSWER" and the end-of-text token."""
    return sum(len(f" {answer}".encode()) + 1 for _, _, answer in examples)


def test_dtcli_train_on_instruction_data_evaluates_the_response_tokens_only(sft):
    """The template of the tokenizer_config.json beside the tokenizer; eval counts each
    answer's bytes and its end-of-text token (not the prompts, the "A:" or the padding), bits
    per byte over the answers' bytes; the loss fell."""
    from dtcli import metrics

    _, run, _, held_out, out = sft
    assert "chat template the chat_template of tokenizer/tokenizer_config.json" in out
    records = metrics.read(run / "metrics.jsonl")
    assert [r["eval_tokens"] for r in records] == [response_tokens(held_out)] * 2
    last = records[-1]
    bits = last["eval_loss"] * last["eval_tokens"] / np.log(2)
    text_bytes = response_tokens(held_out) - len(held_out)  # the end of text is no byte
    assert last["eval_bpb"] == pytest.approx(bits / text_bytes, rel=1e-6)
    assert records[1]["eval_loss"] < records[0]["eval_loss"] - 0.5


def test_the_masked_loss_is_the_cross_entropy_over_the_answers_by_hand(sft):
    """`dtcli eval`'s loss: the GPT's forward over windows built here from the text, and the
    cross-entropy in numpy over each answer's tokens and its end of text only (1e-5); the
    loss of the run's last evaluation, though the tokenizer folder that gave the template is
    gone."""
    import tensorflow as tf

    from dtcli import checkpoint as ckpt_lib
    from dtcli import metrics
    from dtcli import recipe as R
    from dtcli import session as session_lib
    from dtcli.rundir import checkpoint_recipe, find_checkpoint, tokenizer_file

    folder, run, _, held_out, _ = sft
    result = run_cli("eval", run, "--json", "--no-progress", cwd=folder)
    assert result.code == 0, result.err
    got = json.loads(result.out)
    eot = T.BYTE_VALUES
    windows, targets = [], []  # targets: (row, position, id) predicted at position - 1
    for row, (_, prompt, answer) in enumerate(held_out):
        head = f"{prompt}A:".encode()
        ids = [*head, *f" {answer}".encode(), eot, *b"\n"]
        targets += [(row, p, ids[p]) for p in range(len(head), len(head) + len(answer) + 2)]
        windows.append(ids + [eot] * (CONTEXT - len(ids)))
    ckpt = find_checkpoint(run)
    recipe = checkpoint_recipe(ckpt, "eval", R.Overrides((), "batch=1", "cpu:8"))
    s = session_lib.prepare(recipe, splits=(), use_devices=1, tokenizer_file=tokenizer_file(ckpt))
    ckpt_lib.Checkpointer(ckpt.parent, {"model": s.model.module}, 1).restore(
        ckpt, s.model.weights, partial=True
    )
    logits = s.model.forward(tf.constant(windows, tf.int32), training=False).numpy()
    logits = logits.astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = [-logp[row, p - 1, token] for row, p, token in targets]
    assert got["tokens"] == len(nll)
    assert got["loss"] == pytest.approx(float(np.mean(nll)), rel=1e-5)
    # Its tokenizer folder gone, the run evaluates with the template it trained with.
    trained = metrics.read(run / "metrics.jsonl")[-1]["eval_loss"]
    assert got["loss"] == pytest.approx(trained, rel=1e-6)


def steps_of(session, steps: int) -> dict[str, np.ndarray]:
    """`steps` training steps in data order -> each step's loss and count."""
    import itertools

    from dtcli import steps as steps_lib

    call, _ = steps_lib.make_steps(session)
    block = list(itertools.islice(session.train_feed.epoch(0, 0, steps), steps))
    out = steps_lib.train_block(session, call, block)
    assert out["applied"] == steps
    return {"loss": out["loss"], "count": out["count"]}


def test_accumulating_micro_batches_counts_the_targets_of_the_whole_step(sft):
    """train.accumulate 2 on instruction data: each micro-batch's loss is over the targets
    (>= 0) of the whole step, so 3 steps give the losses of 3 whole batches (1e-5)."""
    from dtcli import recipe as R
    from dtcli import session as session_lib

    folder, _, train, _, _ = sft

    def run(n: int) -> dict[str, np.ndarray]:
        sets = (
            f"data.path={folder / 'train.jsonl'}",
            f"data.eval_path={folder / 'eval.jsonl'}",
            f"data.tokenizer={folder / 'run' / 'tokenizer.json'}",
            "data.chat_template=plain",
            "data.shuffle=false",
            f"train.accumulate={n}",
            "train.steps_per_call=3",
        )
        recipe = R.load(folder / "r.yaml", R.Overrides(sets, "batch=1", "cpu:8"))
        return steps_of(session_lib.prepare(recipe, splits=("train",), use_devices=1), 3)

    whole, accumulated = run(1), run(2)
    assert whole["count"].tolist() == [response_tokens(train[i : i + 8]) for i in (0, 8, 16)]
    np.testing.assert_array_equal(accumulated["count"], whole["count"])
    np.testing.assert_allclose(accumulated["loss"], whole["loss"], rtol=1e-5)


def test_a_packed_recipe_plans_the_activations_and_logits_of_its_context(
    tmp_path, cli, recipe_file
):
    """`dtcli plan` of packed windows ([3, context]): the activations and logits of `context`
    positions, as the unpacked recipe's, and its extra rows."""
    path = write_jsonl(tmp_path / "t.jsonl", addition(np.random.default_rng(0), 4, 0))
    plans = {}
    for packing in ("false", "true"):
        sets = ["--set", f"data.path={path}", "--set", f"data.packing={packing}"]
        sets += ["--set", "data.eval_path=null", "--set", "data.tokenizer=null"]
        result = cli("plan", recipe_file, "--json", *sets, cwd=tmp_path)
        assert result.code == 0, result.err
        plans[packing] = json.loads(result.out)
    packed = plans["true"]
    assert packed["batch"]["per_device_shape"] == [1, 3, CONTEXT]
    assert packed["batch"]["logits_per_device_shape"] == [1, CONTEXT, 320]
    # The same blocks and logits; a packed window also holds its segment and position rows
    # and the attention mask made from them (models/activations.py).
    est = {k: v["activations_estimate"]["bytes"] for k, v in plans.items()}
    for part in ("blocks", "head", "logits"):
        assert est["true"][part] == est["false"][part], part
    assert est["true"]["inputs"] == 2 * est["false"]["inputs"]


def test_a_packed_window_loses_what_its_examples_lose_one_a_window(sft):
    """data.packing: `dtcli eval` of the run over its eval examples two or three a window gives
    the loss and the count of one a window (1e-5); a training step on the first packed window
    gives the loss of its examples as a batch of their own (1e-5): nothing crosses an edge."""
    from dtcli import recipe as R
    from dtcli import session as session_lib

    folder, run, train, held_out, _ = sft
    args = ("eval", run, "--json", "--no-progress")
    one = json.loads(run_cli(*args, cwd=folder).out)
    result = run_cli(*args, "--set", "data.packing=true", cwd=folder)
    assert result.code == 0, result.err
    packed = json.loads(result.out)
    assert packed["tokens"] == one["tokens"] == response_tokens(held_out)
    assert packed["loss"] == pytest.approx(one["loss"], rel=1e-5)

    template = folder / "qa.jinja"  # the run's, which fits two examples in a window
    template.write_text(QA_TEMPLATE)

    def first_step(packing: bool, batch: int) -> tuple[Any, dict]:
        sets = (
            f"data.path={folder / 'train.jsonl'}",
            f"data.eval_path={folder / 'eval.jsonl'}",
            f"data.tokenizer={run / 'tokenizer.json'}",
            f"data.chat_template={template}",
            "data.shuffle=false",
            f"data.packing={str(packing).lower()}",
            f"data.batch_size={batch}",
            "train.steps_per_call=1",
        )
        recipe = R.load(folder / "r.yaml", R.Overrides(sets, "batch=1", "cpu:8"))
        s = session_lib.prepare(recipe, splits=("train",), use_devices=1)
        return s, steps_of(s, 1)

    s, window = first_step(True, 1)
    x, _ = next(jsonl.windows(s.data.train, 0, 0, False, 0, 1))
    examples = int(x[instructions.SEGMENTS].max())
    assert examples >= 2
    _, alone = first_step(False, examples)
    assert window["count"][0] == alone["count"][0] == response_tokens(train[:examples])
    np.testing.assert_allclose(window["loss"], alone["loss"], rtol=1e-5)


def test_a_tokenizer_config_named_as_the_template_gives_its_chat_template(tmp_path):
    """data.chat_template naming a tokenizer_config.json reads its chat_template and its BOS and
    EOS, as when the file lies beside the tokenizer (not its JSON rendered as Jinja)."""
    from dtcli.data import chat

    config = {"chat_template": chat.CHATML, "bos_token": "<s>", "eos_token": {"content": "</s>"}}
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config))
    named = chat.load(str(path), [])
    beside = chat.load(None, [tmp_path])
    assert (named.source, named.bos_token, named.eos_token) == (chat.CHATML, "<s>", "</s>")
    assert (beside.source, beside.bos_token, beside.eos_token) == (named.source, "<s>", "</s>")
