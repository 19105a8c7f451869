"""`dtcli generate --chat`: a prompt is a user message rendered with the run's chat template
(chatml here, on byte tokens with <|im_start|>, <|im_end|> and <|endoftext|> as special tokens),
the answer ends at the template's end of turn (<|im_end|>, not the tokenizer's end of text),
and only the answer is printed; greedy --chat is generation from the rendered text by hand, cut
there. --json, --prompts FILE.jsonl, each template's end of turn. (A run without instruction
data: test_generate.py; the refusals: test_bad_inputs.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_cli

from dtcli import generate
from dtcli.data import chat, instructions, jsonl
from dtcli.data import tokenizer as T
from dtcli.generate import chat as generate_chat
from dtcli.recipe import load as load_recipe

# Checked: answers, tokens and texts equal to generation by hand on the same run; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
WORDS = ["thee", "abc", "romeo"]
TOKENS = 24


def chatml_tokenizer(path: Path) -> Path:
    """Byte tokens (ids 0-255) and <|endoftext|> 256, <|im_start|> 257, <|im_end|> 258."""
    tok = T.byte_identity()
    tok.add_special_tokens([T.EOT_TOKEN, IM_START, IM_END])
    path.write_text(tok.to_str())
    return path


def sft_examples(count: int) -> list[dict]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sft_data", ROOT / "recipes" / "sft_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.splits(train=count, held_out=8)[0]


RECIPE = """\
name: chat
task: language_model
devices: cpu:8
mesh: {batch: 8}
model:
  transformer: {layers: 1, d_model: 32, heads: 2, context: 48}
data:
  source: jsonl
  path: train.jsonl
  tokenizer: tokenizer.json
  chat_template: chatml
  eval_fraction: 0.05
  batch_size: 16
optimizer: {name: adamw, learning_rate: 1.0e-2}
train: {steps: 60, eval_every: 30, steps_per_call: 30}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory, cpu8) -> Path:
    """A tiny GPT trained 60 steps on 600 'Uppercase: word' examples in chatml: enough that
    its greedy answers end with <|im_end|>."""
    folder = tmp_path_factory.mktemp("chat")
    rows = sft_examples(600)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    chatml_tokenizer(folder / "tokenizer.json")
    (folder / "r.yaml").write_text(RECIPE)
    result = run_cli("train", "r.yaml", "--out", "run", "--no-progress", cwd=folder)
    assert result.code == 0, result.err
    return folder / "run"


def greedy(tokens: int = TOKENS) -> generate.Settings:
    return generate.Settings(tokens, temperature=0.0)


def test_greedy_chat_is_the_rendered_text_continued_by_hand_and_cut_at_the_end_of_turn(run):
    """--chat --json's answers: generation (no --chat) from the text chatml writes, by hand,
    cut after its first <|im_end|> (258), which --chat stops at and does not print, though it
    is not the tokenizer's end of text (256), where generation without --chat stops."""
    r = run_cli(
        "generate", run, "--chat", "--json", "--temperature", "0", "--tokens", TOKENS,
        "--no-progress", *[a for w in WORDS for a in ("--prompt", f"Uppercase: {w}")],
    )  # fmt: skip
    assert r.code == 0, r.err
    answers = [json.loads(line) for line in r.out.splitlines()]
    plain = generate.Generator(run, mesh="batch=1", devices="cpu:8", use_devices=1)
    assert plain.stop_ids() == {256}
    rendered = [
        f"{IM_START}user\nUppercase: {w}{IM_END}\n{IM_START}assistant\n".encode() for w in WORDS
    ]
    for word, answer, by_hand in zip(WORDS, answers, plain.answers(rendered, greedy())):
        tokens = by_hand[1].tokens
        cut = tokens[: tokens.index(258) + 1] if 258 in tokens else tokens
        assert answer["prompt"] == f"Uppercase: {word}"
        assert answer["tokens"] == cut and answer["stopped"] == (cut[-1] == 258)
        text = bytes(t for t in cut if t < 256).decode("utf-8", errors="replace")
        assert answer["text"] == text and IM_END not in answer["text"]
    assert all(a["stopped"] and len(a["tokens"]) < TOKENS for a in answers)  # it learned chatml


def test_the_end_of_turn_stops_one_prompt_and_the_others_go_on(run, monkeypatch):
    """A prompt stops at the end-of-turn id (here set to the second token of prompt 0's greedy
    answer without one), its text without it; the others go on to theirs (or to the end of
    text, or their tokens), as without it."""
    gen = generate.Generator(run, mesh="batch=1", devices="cpu:8", use_devices=1, chat=True)
    assert gen.chat.end_of_turn == 258 and gen.stop_ids() == {256, 258}
    prompts = [generate_chat.Conversation(({"role": "user", "content": w},)) for w in WORDS]
    monkeypatch.setattr(gen, "chat", dataclasses.replace(gen.chat, end_of_turn=None))
    free = [a.tokens for _, a in gen.answers(prompts, greedy(12))]
    stop = free[0][1]
    monkeypatch.setattr(gen, "chat", dataclasses.replace(gen.chat, end_of_turn=stop))
    got = [a for _, a in gen.answers(prompts, greedy(12))]
    cut = free[0].index(stop)
    assert got[0].tokens == free[0][: cut + 1] and got[0].stopped
    assert got[0].text == bytes(free[0][:cut]).decode()
    for answer, tokens in zip(got[1:], free[1:]):
        expected = tokens[: tokens.index(stop) + 1] if stop in tokens else tokens
        assert answer.tokens == expected


def test_prompts_of_a_jsonl_file_are_conversations_up_to_the_last_user_turn(run, tmp_path):
    """--prompts FILE.jsonl: the three record forms, a response optional, a multi-turn
    conversation up to its last user turn; the answers equal --prompt's for the same message."""
    records = [
        {"prompt": "Uppercase: thee"},
        {"prompt": "Uppercase: abc", "response": "ABC"},
        {"messages": [
            {"role": "user", "content": "Uppercase: x"}, {"role": "assistant", "content": "X"},
            {"role": "user", "content": "Uppercase: romeo"},
            {"role": "assistant", "content": "ROMEO"},
        ]},
        {"instruction": "Uppercase: thee", "input": ""},
    ]  # fmt: skip
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    conversations = generate.read_conversations(None, str(path))
    assert [c.messages[-1]["content"] for c in conversations] == [
        "Uppercase: thee", "Uppercase: abc", "Uppercase: romeo", "Uppercase: thee",
    ]  # fmt: skip
    assert len(conversations[2].messages) == 3
    base = ("generate", run, "--chat", "--json", "--temperature", "0", "--tokens", 12)
    base += ("--no-progress",)
    from_file = run_cli(*base, "--prompts", path)
    alone = run_cli(*base, "--prompt", "Uppercase: thee")
    assert from_file.code == alone.code == 0, from_file.err + alone.err
    first, *_, last = from_file.out.splitlines()
    assert first == last == alone.out.strip()


def test_each_template_ends_a_turn_with_its_own_token():
    """plain: the tokenizer's end of text; chatml: <|im_end|>; llama3: <|eot_id|>; a template
    that writes no special token after an answer: none. No TensorFlow."""
    tok = T.byte_identity()
    tok.add_special_tokens([T.EOT_TOKEN, IM_START, IM_END])
    tok.add_special_tokens(["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    hf = T.from_json(tok.to_str(), "test")
    cfg = load_recipe(
        {"task": "language_model", "model": {"transformer": {"layers": 1, "d_model": 32,
         "heads": 2, "context": 16}}, "data": {"source": "jsonl", "path": "x.jsonl"}}
    ).data  # fmt: skip
    expected = {"plain": 256, "chatml": 258, "alpaca": 256, "llama3": 261}
    encoder = instructions.TextEncoder(hf)
    for name, token in expected.items():
        template = jsonl.template(dataclasses.replace(cfg, chat_template=name), None, hf)
        assert encoder.single_id(template.end_of_turn()) == token, name
    bare = chat.Template("{% for m in messages %}{{ m['content'] }}\n{% endfor %}", "bare")
    assert bare.end_of_turn() is None


def test_a_conversation_is_encoded_as_training_encodes_its_prompt(run):
    """The ids of a --chat prompt are the first ids of the training example with that prompt,
    up to where its answer starts."""
    from dtcli import rundir
    from dtcli.recipe import Overrides

    ckpt = rundir.complete_checkpoints(run)[-1]
    recipe = rundir.checkpoint_recipe(ckpt, "generate", Overrides((), "batch=1", "cpu:8"))
    tok = T.read_saved(run / "tokenizer.json")
    fmt = generate_chat.run_format(recipe, tok, run / "tokenizer.json", None, str(run))
    messages = [{"role": "user", "content": "Uppercase: thee"}]
    ids = fmt.ids(generate_chat.Conversation(tuple(messages)), "test")
    text, spans = fmt.template.spans([*messages, {"role": "assistant", "content": "THEE"}], "t")
    example = instructions.encoded(fmt.encoder, text, spans)
    first = int(np.flatnonzero(example.response)[0])
    np.testing.assert_array_equal(ids, example.ids[:first])
    assert fmt.end_of_turn == 258


def test_lm_eval_with_the_chat_template_generates_as_generate_chat(run):
    """lm-eval's --apply-chat-template through SessionLM on a chatml run: each request is the
    conversation rendered with the run's template, and generate_until stops at <|im_end|> (not
    the tokenizer's end of text) and leaves it out: the answers of generate --chat, greedy."""
    from lm_eval.api.instance import Instance

    from dtcli.harness.model import SessionLM

    chat_run = generate.Generator(run, mesh="batch=1", devices="cpu:8", use_devices=1, chat=True)
    prompts = [
        generate.Conversation(({"role": "user", "content": f"Uppercase: {w}"},)) for w in WORDS
    ]
    expected = [a.text for _, a in chat_run.answers(prompts, greedy())]
    lm = SessionLM(chat_run.session, run_dir=run)
    contexts = [lm.apply_chat_template(list(p.messages)) for p in prompts]
    assert contexts[0] == f"{IM_START}user\nUppercase: thee{IM_END}\n{IM_START}assistant\n"
    assert 258 in lm.stop_ids and 256 in lm.stop_ids
    settings = {"until": ["\n\n\n"], "max_gen_toks": TOKENS, "do_sample": False}
    requests = [
        Instance("generate_until", {}, (c, dict(settings)), i) for i, c in enumerate(contexts)
    ]
    assert lm.generate_until(requests) == expected
    # (this run answers at once: <|im_end|> first; without that stop the text would go on)
