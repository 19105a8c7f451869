"""The model a run starts from, `model.from_run`: a dtcli run directory (its newest checkpoint
that verifies) or one of its checkpoint folders; and the digests that name a fine-tuned run's base.

`resolve` fills a user's recipe in from the checkpoint's stored recipe as it loads, as
recipe.from_hf does from a Hugging Face folder's config.json: the model section, the task and
data.tokenizer (the base run's tokenizer.json: the model's ids mean its tokens). Of the model the
recipe keeps only model.transformer's context, dropout and remat (recipe.from_hf.OWN_KEYS); a
key it sets otherwise is refused, naming both. The learned position table keeps the base's rows
(max_positions), so a shorter context reads the same weights and a longer one is refused. The
resolved recipe names the checkpoint folder itself (absolute): a run's recipe.yaml says which
weights it started from, and loads again (resume, eval, generate) without the base. Reading
checkpoints is this package's business, a layer above the recipe's: the commands that load a
user's recipe pass `resolve` to recipe.load.

`restore_weights` reads the checkpoint's model weights into a model built on any mesh (a new
run's step 0), `base_digests` and `hf_digests` name a base by its files' SHA-256.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dtcli import checkpoint as ckpt_lib
from dtcli import storage
from dtcli.errors import UsageError
from dtcli.hf import tokenizer_files
from dtcli.recipe.from_hf import OWN_KEYS
from dtcli.rundir.files import TOKENIZER, run_of, tokenizer_file
from dtcli.rundir.find import read_checkpoint

KEY = "model.from_run"
NAMED = f"recipe key '{KEY}'"
# Keys of a recipe's model section that are its own beside model.from_run: where model.build's
# module lives (filled in at load), and what model.from_hf's rule leaves to the recipe.
FREE = {"model.from_run", "model.build_path", *(f"model.transformer.{k}" for k in OWN_KEYS)}

T = TypeVar("T")


def resolve(raw: dict) -> dict:
    """The raw recipe with its model section, task and data.tokenizer filled in from
    model.from_run's checkpoint (unchanged without it). `raw` is not changed."""
    model = raw.get("model")
    if not isinstance(model, dict) or model.get("from_run") is None:
        return raw
    given = model["from_run"]
    if not isinstance(given, str):
        raise UsageError(
            f"{NAMED}: expected a run directory or a checkpoint folder (a string), got {given!r}"
        )
    checkpoint, base = _read(given, lambda checkpoint, held: (checkpoint, _stored_recipe(held)))
    if base.get("lora") is not None:
        raise UsageError(
            f"{NAMED} {given!r}: a LoRA run, whose checkpoints hold adapters, not a model; "
            "start from its base, or from its merged export (export --merge --format hf, then "
            "model.from_hf)"
        )
    base_model = _with_position_rows(base["model"])
    found = _contradiction(model, base_model, "model")
    if found is None and "task" in raw:
        found = _contradiction({"task": raw["task"]}, {"task": base.get("task")}, "")
    if found is not None:
        key, value, have = found
        raise UsageError(
            f"recipe key '{key}': {value!r} contradicts {KEY} {given!r}, whose recipe makes it "
            f"{'null' if have is None else repr(have)}"
        )
    own = model.get("transformer") if isinstance(model.get("transformer"), dict) else {}
    transformer = base_model.get("transformer")
    if isinstance(transformer, dict):
        transformer = {**transformer, **{k: v for k, v in own.items() if k in OWN_KEYS}}
    unknown = {k: v for k, v in model.items() if k not in base_model}  # for typed.build to name
    resolved = {
        **raw,
        "task": base.get("task"),
        "model": {
            **base_model,
            **unknown,
            "transformer": transformer,
            "from_hf": None,  # the base run's own start, not this one's
            "from_run": str(storage.as_path(checkpoint).resolve()),
        },
    }
    data = raw.get("data", {})
    if base.get("task") == "language_model" and isinstance(data, dict):  # else refused by type
        data = dict(data)
        data["tokenizer"] = _tokenizer(data.get("tokenizer"), checkpoint, base, given)
        resolved["data"] = data
        if data.get("source") == "jsonl":
            _check_end_of_text(data["tokenizer"], base_model, given)
    return resolved


def _check_end_of_text(tokenizer: Any, model: dict, path: str) -> None:
    """Instruction data ends each answer with an end-of-text token, which data.jsonl adds
    after the ids of a tokenizer that has none: a base trained on such a tokenizer whose
    vocabulary has no row past its ids (byte tokens: 256 ids, 256 rows) cannot take it, and is
    refused here in words rather than as an embedding's shape at restore (dtcli adds no
    embedding rows)."""
    from dtcli.data import tokenizer as tokenizer_lib

    transformer = model.get("transformer")
    if not isinstance(transformer, dict) or transformer.get("vocab_size") is not None:
        return  # an imported model's real vocabulary: data.tokenizer's own check
    if tokenizer is None or tokenizer == "bytes":
        tok: Any = tokenizer_lib.ByteTokenizer()
    elif isinstance(tokenizer, str):
        tok = tokenizer_lib.from_spec(tokenizer, "recipe key 'data.tokenizer'")
    else:
        return
    if tok is None or tok.eot is not None:
        return
    rows = tokenizer_lib.model_vocab(tok.vocab_size)
    if tokenizer_lib.model_vocab(tok.vocab_size + 1) == rows:
        return
    raise UsageError(
        f"{NAMED} {path!r}: instruction data (data.source jsonl) ends each answer with an "
        f"end-of-text token; the base's tokenizer ({tok.description}) has none and its model "
        f"no row for one ({rows} rows for {tok.vocab_size} ids; dtcli adds no embedding rows). "
        "Pretrain the base with one: dtcli prepare-text TEXT --out SHARDS, then train with "
        "data.source tokens, data.path SHARDS (bytes and <|endoftext|>)"
    )


def _read(path: str, read: Callable[[Path, Path], T]) -> T:
    """`read(checkpoint, held)` of the checkpoint `path` names (rundir.read_checkpoint: held open
    while it is read), a damaged one named as model.from_run's."""
    try:
        return read_checkpoint(storage.as_path(path), read, NAMED)
    except ckpt_lib.DamagedCheckpoint as exc:
        raise UsageError(f"{NAMED}: {exc}") from None


def _stored_recipe(held: Path) -> dict:
    recipe = ckpt_lib.read_meta(held)["recipe"]
    if not isinstance(recipe, dict) or not isinstance(recipe.get("model"), dict):
        raise ckpt_lib.DamagedCheckpoint(held, "its recipe is not a mapping")
    return recipe


def _with_position_rows(model: dict) -> dict:
    """The base's model section with max_positions written out: the positions it was trained
    on, which a recipe's shorter context keeps (the learned table's rows) and a longer one may
    not pass."""
    transformer = model.get("transformer")
    if not isinstance(transformer, dict) or transformer.get("max_positions") is not None:
        return model
    return {**model, "transformer": {**transformer, "max_positions": transformer.get("context")}}


def _contradiction(given: dict, base: dict, key: str) -> tuple[str, Any, Any] | None:
    """(dotted key, the recipe's value, the base's) of the first key the recipe sets otherwise
    than the base's recipe, or None. A key the base has not (unknown, or newer than the base) is
    left to the recipe's own checks."""
    for name, value in given.items():
        dotted = f"{key}.{name}" if key else name
        if dotted in FREE or name not in base:
            continue
        have = base[name]
        if isinstance(value, dict) and isinstance(have, dict):
            found = _contradiction(value, have, dotted)
            if found is not None:
                return found
        elif not _same(value, have):
            return dotted, value, have
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal values, a number as YAML 1.1 reads `1e-5` (a string) included."""
    if a == b:
        return True
    numbers = (int, float, str)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    if not isinstance(a, numbers) or not isinstance(b, numbers):
        return False
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def _tokenizer(given: Any, checkpoint: Path, base: dict, path: str) -> Any:
    """data.tokenizer of a language model started from a run: the run's own tokenizer.json,
    whose tokens the model's ids mean; a recipe's other tokenizer is refused."""
    kept = tokenizer_file(checkpoint)
    if kept.is_file():
        mine: Any = str(kept.resolve())
        accepted = {mine, str(run_of(checkpoint).resolve())}
    else:  # a checkpoint kept without its run: the tokenizer its recipe names
        mine = (base.get("data") or {}).get("tokenizer")
        if isinstance(mine, dict):
            raise UsageError(
                f"{NAMED} {path!r}: its run has no {TOKENIZER} (the tokenizer it trained, "
                "whose ids the model means); give the checkpoint inside its run directory"
            )
        accepted = {mine}
    if given is None or (
        isinstance(given, str)
        and (given in accepted or str(storage.as_path(given).resolve()) in accepted)
    ):
        return mine
    raise UsageError(
        f"recipe key 'data.tokenizer': {given!r} contradicts {KEY} {path!r}, whose run's "
        "tokenizer the model's ids mean (leave data.tokenizer out)"
    )


def restore_weights(
    module: Any,
    weights: list | None,
    path: str,
    check: Callable[[dict[str, str]], None] | None = None,
) -> dict[str, str]:
    """The model weights of the checkpoint `path` names (model.from_run as a resolved recipe
    holds it) read into `module`, on a mesh (DVariables: each relaid out onto its layout) or on
    plain variables (XLA's one device); `weights` (the live model's WeightInfo) checked against
    the checkpoint's first. No optimizer state is read. Returns the checkpoint's digests
    (`base_digests`), read in the same verification; `check(digests)` runs before any weight
    is read (a LoRA checkpoint's base compared), so the base is hashed once, not twice."""

    def read(checkpoint: Path, held: Path) -> dict[str, str]:
        if check is not None:
            check(_digests(held))
        saver = ckpt_lib.Checkpointer(held.parent, {"model": module}, keep=1)
        try:
            saver.restore(held, weights, partial=True)
        except ckpt_lib.DamagedCheckpoint:
            raise
        except UsageError as exc:
            raise UsageError(f"{NAMED}: {exc}") from None
        return _digests(held)

    return _read(path, read)


def base_digests(path: str) -> dict[str, str]:
    """The SHA-256 of each file of the checkpoint `path` names (a run directory: its newest that
    verifies; a checkpoint folder), by file name, as its meta.json records them: what a
    checkpoint that holds adapters names its base by, whatever path the base was given by."""
    return _read(path, lambda checkpoint, held: _digests(held))


def _digests(held: Path) -> dict[str, str]:
    files = ckpt_lib.read_meta(held)["files"]
    return {name: files[name]["sha256"] for name in sorted(files)}


def hf_digests(folder: str | Path) -> dict[str, str]:
    """The SHA-256 of a Hugging Face model folder's config.json and each *.safetensors file, by
    file name: model.from_hf's base named as base_digests names a run's."""
    folder = storage.as_path(folder)
    files = [folder / tokenizer_files.SOURCE_CONFIG, *sorted(folder.glob("*.safetensors"))]
    return {p.name: ckpt_lib.sha256_of(p) for p in files if p.is_file()}


def hf_files(path: str) -> dict[str, bytes]:
    """The Hugging Face files the base's run keeps in RUN_DIR/hf/ (an import's, or those of a run
    started from a folder), by name: a run started from it keeps them too."""
    return tokenizer_files.carried(run_of(path) / tokenizer_files.FOLDER)
