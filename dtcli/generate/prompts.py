"""`dtcli generate`'s prompts: --prompt's text or --prompts FILE's lines, as bytes, checked
before anything is built (no TensorFlow)."""

from __future__ import annotations

from dtcli import storage
from dtcli.errors import UsageError

DEFAULT_PROMPT = "\n"


def prompt_bytes(prompt: str | bytes) -> bytes:
    """The prompt's bytes: bytes that are not UTF-8 (a command line passes them to Python as
    surrogate escapes, like os.fsencode) stay as given (the byte vocabulary covers any byte)."""
    if isinstance(prompt, bytes):
        return prompt
    try:
        return prompt.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError as exc:
        raise UsageError(f"--prompt: {exc.reason} at character {exc.start + 1}") from None


def read_prompts(prompts: list[str] | None, prompts_file: str | None) -> list[bytes]:
    """The prompts of --prompt (repeated; default one newline) or of --prompts FILE (UTF-8 text,
    one a line, without its line end; blank lines skipped), as bytes."""
    if prompts and prompts_file is not None:
        raise UsageError("--prompts: give the prompts with --prompt or with --prompts, not both")
    if prompts_file is None:
        texts = prompts or [DEFAULT_PROMPT]
        if not all(texts):
            raise UsageError("--prompt: expected at least one character")
        return [prompt_bytes(p) for p in texts]
    try:
        data = storage.as_path(prompts_file).read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"--prompts {prompts_file!r}: cannot read it ({reason})") from None
    lines = [line.removesuffix(b"\r") for line in data.split(b"\n")]
    _check_text(prompts_file, lines)
    found = [line for line in lines if line.strip()]
    if not found:
        raise UsageError(f"--prompts {prompts_file!r}: holds no prompt (one a line)")
    return found


def _check_text(prompts_file: str, lines: list[bytes]) -> None:
    """A prompts file is UTF-8 text: a binary file (an image, a checkpoint's shard, a zip)
    given by mistake would otherwise become thousands of prompts of noise. (A prompt of any
    bytes can still be given with --prompt.)"""
    for number, line in enumerate(lines, 1):
        if b"\0" in line:
            problem = "a NUL byte"
        else:
            try:
                line.decode("utf-8")
                continue
            except UnicodeDecodeError as exc:
                problem = f"byte 0x{line[exc.start]:02x}"
        raise UsageError(
            f"--prompts {prompts_file!r}: not UTF-8 text ({problem} on line {number}); "
            "expected a text file of prompts, one a line"
        )
