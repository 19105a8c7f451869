"""The tokenizer files that travel with a Hugging Face model: into a run directory on import,
out of it on export.

tokenizer.json is the run's tokenizer (RUN_DIR/tokenizer.json, as every language-model run keeps
one); tokenizer_config.json (the chat template, the special tokens), generation_config.json (the
end-of-sequence ids, several for Llama 3) and special_tokens_map.json are kept as they are in
RUN_DIR/hf/ and written back out by an export, with the source's config.json for reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dtcli import storage
from dtcli.errors import UsageError

TOKENIZER = "tokenizer.json"
# RUN_DIR/hf/: the Hugging Face files a run keeps beside its own.
FOLDER = "hf"
CARRIED = ("tokenizer_config.json", "generation_config.json", "special_tokens_map.json")
SOURCE_CONFIG = "config.json"


def check(folder: Path, vocab_size: int) -> None:
    """HF_DIR holds a tokenizer.json that `tokenizers` reads, with at most `vocab_size` ids."""
    from tokenizers import Tokenizer

    path = Path(folder) / TOKENIZER
    if not path.is_file():
        raise UsageError(
            f"HF_DIR {str(folder)!r}: has no {TOKENIZER} (dtcli reads a model's tokenizer from "
            "it; a folder with only vocab.json/merges.txt or tokenizer.model: save it with "
            "transformers' AutoTokenizer.save_pretrained first)"
        )
    try:
        size = Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # tokenizers raises its own Exception type for any parse error
        raise UsageError(
            f"{path}: is no tokenizer.json the tokenizers library reads ({exc})"
        ) from None
    if size > vocab_size:
        raise UsageError(
            f"model.transformer.vocab_size: the model has {vocab_size} ids (config.json's "
            f"vocab_size) but its tokenizer {path} makes {size}"
        )


def copy_in(folder: Path, run: Path) -> None:
    """The model folder's tokenizer and carried files into a run directory being written."""
    shutil.copyfile(Path(folder) / TOKENIZER, run / TOKENIZER)
    (run / FOLDER).mkdir()
    for name, data in carried(folder).items():
        (run / FOLDER / name).write_bytes(data)


def carried(folder: Path) -> dict[str, bytes]:
    """The files a run keeps under RUN_DIR/hf/ from a model folder, by name: those it has of
    CARRIED and its config.json."""
    paths = (storage.as_path(folder) / name for name in (*CARRIED, SOURCE_CONFIG))
    return {p.name: p.read_bytes() for p in paths if p.is_file()}


def source_config(run: Path) -> dict:
    """The config.json an imported run came from ({} for a run dtcli trained from scratch)."""
    path = storage.as_path(run) / FOLDER / SOURCE_CONFIG  # a run directory: local or gs://
    return json.loads(path.read_bytes()) if path.is_file() else {}


def end_of_sequence_ids(run: Path) -> list[int] | None:
    """The ids that end a generation of an imported run, as transformers' generate stops at
    them: generation_config.json's eos_token_id, else the source config.json's (an id or a
    list: Llama 3 has several); None for a run that has neither (dtcli's own)."""
    for name in (CARRIED[1], SOURCE_CONFIG):
        path = storage.as_path(run) / FOLDER / name
        ids = json.loads(path.read_bytes()).get("eos_token_id") if path.is_file() else None
        if ids is not None:
            return [int(i) for i in (ids if isinstance(ids, list) else [ids])]
    return None


def copy_out(run: Path, tokenizer_text: str, out: Path) -> None:
    """An export's tokenizer files: the run's tokenizer.json and the files it carried; a run
    without a tokenizer_config.json gets one that names the fast tokenizer (AutoTokenizer
    needs it to load a bare tokenizer.json)."""
    (out / TOKENIZER).write_text(tokenizer_text)
    for name in CARRIED:
        kept = storage.as_path(run) / FOLDER / name
        if kept.is_file():
            (out / name).write_bytes(kept.read_bytes())
    if not (out / CARRIED[0]).exists():
        config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        (out / CARRIED[0]).write_text(json.dumps(config, indent=2) + "\n")
