"""Chat templates: a conversation rendered as text the way Hugging Face's `apply_chat_template`
renders it, and where each assistant turn lies in that text. No TensorFlow.

A template is Jinja, run as transformers runs it: a sandboxed environment with trim_blocks and
lstrip_blocks, `raise_exception`, `bos_token`/`eos_token`, `add_generation_prompt`, a
pass-through `{% generation %}` tag. The built-ins are `plain` (any tokenizer: "User:" and
"Assistant:" lines, each answer ended by the end-of-text token), `alpaca` (Stanford Alpaca's
prompt), `chatml` and `llama3` (their special tokens must be in the vocabulary).

An assistant turn's span is found by rendering the conversation up to the turn (with the
generation prompt) and through it, and comparing with the whole rendering: robust for any
template whose earlier turns render the same once later ones follow. The span runs to the
turn's last special token (its end of turn); what the template writes after it (a newline) is
outside.

A line of instruction data is one of three records: `{"prompt", "response"}`,
`{"messages": [{"role", "content"}, ...]}` or Alpaca's `{"instruction", "input", "output"}`
(`conversation`).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtcli import storage
from dtcli.errors import UsageError

KEY = "recipe key 'data.chat_template'"
ROLES = ("system", "user", "assistant")
CONFIG = "tokenizer_config.json"

PLAIN = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
_ALPACA_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
)
_ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n"
)
ALPACA = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}"
    "{% if loop.first %}{% if message.get('input') %}"
    + _ALPACA_INPUT
    + "{% else %}"
    + _ALPACA_NO_INPUT
    + "{% endif %}{% endif %}"
    "### Instruction:\n{{ message['content'] }}\n\n"
    "{% if message.get('input') %}### Input:\n{{ message['input'] }}\n\n{% endif %}"
    "{% else %}### Response:\n{{ message['content'] }}{{ eos_token }}\n\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}### Response:\n{% endif %}"
)
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# What end_of_turn renders to find a template's end of turn.
PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
BUILTIN = {"plain": PLAIN, "alpaca": ALPACA, "chatml": CHATML, "llama3": LLAMA3}
FORMS = "plain, alpaca, chatml, llama3 or a Jinja template file"
# Special tokens as chat templates write them (<|im_start|>, <|eot_id|>...): a template that
# writes one the vocabulary lacks is refused.
SPECIAL = re.compile(r"<\|[^<>|\s]{1,64}\|>")


@dataclass(frozen=True)
class Template:
    """A chat template and the token texts it is rendered with."""

    source: str
    name: str  # what it is, for messages: "chatml (built in)", a file's path...
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return _compiled(self.source).render(
            messages=messages,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
        )

    def special_tokens(self) -> list[str]:
        """The special tokens the template writes: those its source spells out, and its BOS
        and EOS text, in order of first appearance."""
        found = SPECIAL.findall(self.source) + [self.bos_token, self.eos_token]
        return list(dict.fromkeys(t for t in found if t))

    def spans(self, messages: list[dict], where: str) -> tuple[str, list[tuple[int, int]]]:
        """The whole conversation's text and each assistant turn's [start, end) in it
        (characters), found by rendering the prefixes (see the module's docstring)."""
        text = self._rendered(messages, False, where)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = len(self._prefix(messages[:i], True, text, where))
            end = len(self._prefix(messages[: i + 1], False, text, where))
            spans.append((start, self._end_of_turn(text, start, end)))
        return text, spans

    def generation_prompt(self, messages: list[dict], where: str, key: str = KEY) -> str:
        """The text a model continues with the next assistant turn: `messages` (up to a user
        turn) rendered with the generation prompt, as generate --chat renders a prompt."""
        return self._rendered(messages, True, where, key)

    def end_of_turn(self) -> str | None:
        """The special token that ends an assistant turn (its EOS, <|im_end|>, <|eot_id|>):
        the last one of the answer's span in a conversation of one question; None where the
        template ends an answer with no special token."""
        text, spans = self.spans(PROBE, "a conversation of one question and its answer")
        start, end = spans[0]
        return next((t for t in self.special_tokens() if text[start:end].endswith(t)), None)

    def _end_of_turn(self, text: str, start: int, end: int) -> int:
        """Where a turn rendered as text[start:end] ends: after its last special token."""
        last = [m.end() for t in self.special_tokens() for m in re.finditer(re.escape(t), text)]
        inside = [e for e in last if start < e <= end]
        return max(inside) if inside else end

    def _prefix(self, messages: list[dict], generation: bool, whole: str, where: str) -> str:
        text = self._rendered(messages, generation, where)
        if not whole.startswith(text):
            raise UsageError(
                f"{KEY}: {where}: {self.name} renders the conversation up to an assistant turn "
                "as text the whole conversation does not start with, so the response spans "
                "cannot be found (dtcli compares those renderings); use a built-in template "
                f"({', '.join(BUILTIN)})"
            )
        return text

    def _rendered(self, messages: list[dict], generation: bool, where: str, key: str = KEY) -> str:
        import jinja2

        try:
            return self.render(messages, generation)
        except jinja2.TemplateError as exc:
            raise UsageError(
                f"{key}: {where}: {self.name} refused the conversation ({exc})"
            ) from None


@functools.lru_cache(maxsize=8)
def _compiled(source: str) -> Any:
    """A template compiled as transformers compiles chat templates (its sandbox and options)."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}`: transformers' marker of assistant text,
        rendered as its body (dtcli finds the spans by comparing renderings)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, **kw: Any) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def check_compiles(template: Template, key: str = KEY) -> None:
    """A template that is not Jinja, refused before any example is read."""
    import jinja2

    try:
        _compiled(template.source)
    except jinja2.TemplateSyntaxError as exc:
        raise UsageError(
            f"{key}: {template.name} is not a Jinja template (line {exc.lineno}: {exc.message})"
        ) from None


def load(spec: str | None, folders: list[Path], key: str = KEY) -> Template:
    """The template `spec` (data.chat_template) names: a built-in, a Jinja file, or (None) the
    `chat_template` of the first tokenizer_config.json in `folders` (beside the tokenizer),
    else `plain`. Its BOS and EOS texts are that tokenizer_config.json's where one is there
    (empty where it names none: the caller fills in the tokenizer's). `key`: what a refusal
    names (the recipe key, or generate's --chat-template)."""
    config, config_path = _tokenizer_config(folders)
    tokens = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token")}
    if spec is None:
        source = _config_template(config)
        if source is None:
            return Template(PLAIN, "plain (built in; no chat template beside the tokenizer)")
        return Template(source, f"the chat_template of {config_path}", **tokens)
    if spec in BUILTIN:
        return Template(BUILTIN[spec], f"{spec} (built in)", **tokens)
    path = storage.as_path(spec)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"{key}: expected {FORMS}, got {spec!r} ({why})") from None
    if path.suffix == ".json":
        return _named_config(path, source, spec, key)
    template = Template(source, f"the template {spec}", **tokens)
    check_compiles(template, key)
    return template


def _named_config(path: Path, text: str, spec: str, key: str) -> Template:
    """A tokenizer_config.json named as the template: its chat_template, BOS and EOS (as when
    it lies beside the tokenizer), not its JSON rendered as Jinja."""
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{key}: {spec} is not JSON ({exc})") from None
    source = _config_template(config) if isinstance(config, dict) else None
    if source is None:
        raise UsageError(f"{key}: {spec} has no chat_template (expected {FORMS})")
    tokens = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token")}
    template = Template(source, f"the chat_template of {path}", **tokens)
    check_compiles(template, key)
    return template


def beside(folders: list[Path]) -> bool:
    """Whether the first tokenizer_config.json in `folders` holds a chat template (what
    load(None, folders) renders with; else plain)."""
    return _config_template(_tokenizer_config(folders)[0]) is not None


def _tokenizer_config(folders: list[Path]) -> tuple[dict, Path | None]:
    for folder in folders:
        path = Path(folder) / CONFIG
        if path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UsageError(f"{KEY}: cannot read {path} ({exc})") from None
            return (config if isinstance(config, dict) else {}), path
    return {}, None


def _config_template(config: dict) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of named ones (the
    "default")."""
    found = config.get("chat_template")
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        found = named.get("default")
    return found if isinstance(found, str) and found.strip() else None


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def conversation(record: Any, where: str, key: str) -> list[dict]:
    """The messages of one line's record, checked: roles, non-empty answers, text contents.
    `where`: FILE:LINE; `key`: the recipe key the file came from."""
    refuse = _refusal(f"recipe key '{key}': {where}")
    out = _messages(record, refuse, answered=True)
    if not any(m["role"] == "assistant" for m in out):
        raise refuse("no assistant message (nothing to learn)")
    return out


def prompt(record: Any, where: str) -> list[dict]:
    """A prompt's messages (generate --chat): a record of the forms `conversation` reads, its
    response optional, up to its last user message. `where`: what a refusal names."""
    refuse = _refusal(where)
    out = _messages(record, refuse, answered=False)
    users = [i for i, m in enumerate(out) if m["role"] == "user"]
    if not users:
        raise refuse("no user message (nothing to answer)")
    if not out[users[-1]]["content"]:  # as --prompt "" is refused
        raise refuse("an empty prompt (its last user message has no text)")
    return out[: users[-1] + 1]


def _refusal(prefix: str) -> Any:
    return lambda why: UsageError(f"{prefix}: {why}")


def _messages(record: Any, refuse: Any, answered: bool) -> list[dict]:
    """A record's messages; `answered` False: a prompt's (its response fields optional)."""
    if not isinstance(record, dict):
        raise refuse(f"expected a JSON object, got {type(record).__name__}")
    forms = [f for f in _FORMS if all(k in record for k in f)]
    if len(forms) > 1:
        # Which one the line means is a guess; training on the other would be silent.
        named = " and ".join("{" + ", ".join(f'"{k}"' for k in f) + "}" for f in forms)
        raise refuse(f"the record has both {named}: expected one form a line")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise refuse("'messages' must be a non-empty list of {role, content}")
        return [_message(m, refuse, f"message {i}") for i, m in enumerate(messages)]
    if "prompt" in record and ("response" in record or not answered):
        return _pair(record, "prompt", "response" if answered else None, refuse)
    if "instruction" in record and ("output" in record or not answered):
        out = _pair(record, "instruction", "output" if answered else None, refuse)
        extra = record.get("input") or ""
        if not isinstance(extra, str):
            raise refuse(f"'input' must be text, got {type(extra).__name__}")
        out[0]["input"] = extra
        return out
    forms = (
        '{"prompt", "response"}, {"messages": [...]} or {"instruction", "input", "output"}'
        if answered
        else '{"prompt"}, {"messages": [...]} or {"instruction", "input"}'
    )
    raise refuse(f"expected {forms}, got the keys {sorted(record)}")


# The fields that make each form of record (_messages).
_FORMS = (("messages",), ("prompt", "response"), ("instruction", "output"))


def _pair(record: dict, prompt: str, response: str | None, refuse: Any) -> list[dict]:
    """A record's prompt and response fields as a user and an assistant message (no response
    field: the user's alone)."""
    out = [_message({"role": "user", "content": record[prompt]}, refuse, f"'{prompt}'")]
    if response is not None:
        answer = {"role": "assistant", "content": record[response]}
        out.append(_message(answer, refuse, f"'{response}'"))
    return out


def _message(message: Any, refuse: Any, named: str) -> dict:
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise refuse(f"{named}: expected {{role, content}}, got {json.dumps(message)[:80]}")
    role, content = message["role"], message["content"]
    if role not in ROLES:
        raise refuse(f"{named}: unknown role {role!r} (expected {', '.join(ROLES)})")
    if not isinstance(content, str):
        raise refuse(f"{named}: the content must be text, got {type(content).__name__}")
    if role == "assistant" and not content.strip():
        raise refuse(f"{named}: an empty response")
    return {"role": role, "content": content}
