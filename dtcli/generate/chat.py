"""`dtcli generate --chat`: each prompt a user message rendered with the run's chat template as
training rendered its examples (dtcli.data.chat and dtcli.data.jsonl's template, the same
encoder), with the generation prompt; the answer ends at the template's end of turn. No
TensorFlow.

The run's template: that of its instruction data (data.chat_template, else the
tokenizer_config.json it kept in RUN_DIR/hf/, else plain); a run trained on plain text has one
only where RUN_DIR/hf/tokenizer_config.json holds one (an imported chat model), else
--chat-template names it. The end of turn is the special token that ends an answer's span
(`Template.end_of_turn`: plain's end-of-text token, chatml's <|im_end|>, llama3's <|eot_id|>).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dtcli import storage
from dtcli.data import chat, instructions, jsonl
from dtcli.data.tokenizer import Tokenizer
from dtcli.errors import UsageError
from dtcli.generate.prompts import read_prompts
from dtcli.hf import tokenizer_files
from dtcli.recipe import Recipe

OPTION = "--chat-template"


@dataclass(frozen=True)
class Conversation:
    """A prompt of --chat: the messages up to the user's turn to answer."""

    messages: tuple[dict, ...]

    @property
    def shown(self) -> str:
        """What stands for the prompt in headers and --json: the last user message."""
        return self.messages[-1]["content"]


def read_conversations(prompts: list[str] | None, prompts_file: str | None) -> list[Conversation]:
    """--prompt's texts, each a user message; or --prompts FILE: a .jsonl file's records (the
    forms instruction data takes, the response optional: the conversation up to its last user
    message), any other file's lines (read_prompts' rules), each a user message."""
    if not prompts and prompts_file is None:
        raise UsageError("--chat: give the user's message with --prompt TEXT or --prompts FILE")
    if prompts_file is not None and str(prompts_file).endswith(".jsonl") and not prompts:
        return _records(prompts_file)
    out = []
    for text in read_prompts(prompts, prompts_file):
        try:
            content = text.decode("utf-8")
        except UnicodeDecodeError as exc:  # --prompt's bytes passed as surrogate escapes
            raise UsageError(f"--prompt: not UTF-8 text (byte {exc.start + 1})") from None
        out.append(Conversation(({"role": "user", "content": content},)))
    return out


def _records(prompts_file: str) -> list[Conversation]:
    named = f"--prompts {prompts_file!r}"
    try:
        lines = storage.as_path(prompts_file).read_bytes().split(b"\n")
    except OSError as exc:
        raise UsageError(
            f"{named}: cannot read it ({exc.strerror or type(exc).__name__})"
        ) from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{named}: line {number}"
        try:
            record = json.loads(line)
        except ValueError as exc:  # UnicodeDecodeError too
            raise UsageError(f"{where}: not a JSON object ({exc})") from None
        out.append(Conversation(tuple(chat.prompt(record, where))))
    if not out:
        raise UsageError(f"{named}: holds no prompt (one JSON object a line)")
    return out


def check_template_option(chat_template: str | None, on: bool) -> None:
    """--chat-template, checked before any checkpoint is read: with --chat, a built-in or a
    Jinja file that reads and compiles."""
    if chat_template is None:
        return
    if not on:
        raise UsageError(f"{OPTION} {chat_template!r}: it renders --chat's prompts; give --chat")
    chat.load(chat_template, [], OPTION)


@dataclass(frozen=True)
class ChatFormat:
    """How a run's prompts become ids: its template, its encoder, its end of turn's id."""

    template: chat.Template
    encoder: instructions.TextEncoder
    end_of_turn: int | None

    def ids(self, conversation: Conversation, where: str) -> np.ndarray:
        """The conversation rendered with the generation prompt, encoded as training encodes
        (the tokenizer's BOS first where the template writes none)."""
        text = self.template.generation_prompt(list(conversation.messages), where, OPTION)
        return instructions.encoded(self.encoder, text, []).ids

    def note(self) -> str | None:
        """What stderr says of a template without an end of turn: answers run --tokens long."""
        if self.end_of_turn is not None:
            return None
        return (
            f"note: --chat: {self.template.name} ends an answer with no token of this "
            "tokenizer, so each answer runs its --tokens (or to the tokenizer's end of text)"
        )


def check_run(recipe: Recipe, saved: Path, chat_template: str | None, run: str) -> None:
    """A run with no chat template and no --chat-template, refused before it is restored
    (`saved`: its tokenizer.json; `run`: as the user named it)."""
    if chat_template is None and recipe.data.source != "jsonl" and not chat.beside([_kept(saved)]):
        raise UsageError(
            f"--chat: {run} was trained without instruction data (data.source "
            f"{recipe.data.source}) and keeps no chat template; name one with {OPTION} "
            f"({chat.FORMS})"
        )


def run_format(
    recipe: Recipe, tokenizer: Tokenizer, saved: Path, chat_template: str | None, run: str
) -> ChatFormat:
    """The chat format of a run: --chat-template's template, else the run's (see the module's
    docstring); refused where there is none (check_run)."""
    check_run(recipe, saved, chat_template, run)
    cfg, key = recipe.data, chat.KEY
    if chat_template is not None:
        cfg, key = dataclasses.replace(cfg, chat_template=chat_template), OPTION
    if recipe.data.source != "jsonl":
        # Only the run's kept files: the recipe's tokenizer folder is no longer the run's.
        cfg = dataclasses.replace(cfg, tokenizer=None)
    template = jsonl.template(cfg, saved, tokenizer, key)
    encoder = instructions.TextEncoder(tokenizer)
    token = template.end_of_turn()
    return ChatFormat(template, encoder, None if token is None else encoder.single_id(token))


def _kept(saved: Path) -> Path:
    """Where a run keeps its Hugging Face files (a tokenizer_config.json): RUN_DIR/hf/."""
    return storage.as_path(saved).parent / tokenizer_files.FOLDER
