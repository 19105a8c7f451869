"""What a run directory holds and where (the file names), and the small helpers every part of
dtcli.rundir shares: warnings, OS error reasons, unreachable file systems as bad input."""

from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dtcli import storage
from dtcli.errors import UsageError

RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
STEPS = "steps.jsonl"
RESUMES = "resumes.jsonl"
TRAIN_LOG = "train.log"
TENSORBOARD = "tensorboard"
# The experiment trackers' run ids (`track`), so that a resume continues the same tracker runs.
TRACKER_IDS = "trackers.json"
# W&B's own files of the run (wandb.init(dir=RUN_DIR) makes RUN_DIR/wandb).
WANDB = "wandb"
CHECKPOINTS = "checkpoints"
PLOTS = "plots"
LOCK = ".dtcli.lock"
# lm-evaluation-harness's results files (`dtcli eval --tasks`), as lm-eval names them.
LM_EVAL = "lm_eval"
# A language model's tokenizer, as `tokenizers` writes it (bytes too: see data.tokenizer).
TOKENIZER = "tokenizer.json"

# What a run writes before its first checkpoint (no run directory holds anything else of ours).
RUN_FILES = (
    LOCK,
    TRAIN_LOG,
    RECIPE,
    METRICS,
    STEPS,
    RESUMES,
    TENSORBOARD,
    TRACKER_IDS,
    WANDB,
    CHECKPOINTS,
    PLOTS,
    TOKENIZER,
)

Warn = Callable[[str], None]


def run_of(checkpoint: Any) -> Any:
    """The run directory a checkpoint (RUN_DIR/checkpoints/ckpt-STEP) belongs to."""
    return storage.as_path(checkpoint).parent.parent


def tokenizer_file(checkpoint: Any) -> Any:
    """Where the run a checkpoint belongs to keeps its tokenizer (it may be missing: a run from
    before tokenizers, or a checkpoint copied alone)."""
    return run_of(checkpoint) / TOKENIZER


def stderr(message: str) -> None:
    print(message, file=sys.stderr)


def check_plots(run_dir: Any, arg: str = "RUN_DIR") -> None:
    """The run's plots/ is a folder or not there yet (a file there would fail the plots after
    training): one line naming the run as the user gave it."""
    plots = storage.as_path(run_dir) / PLOTS
    with reachable(arg, run_dir):
        is_file = plots.exists() and not plots.is_dir()
    if is_file:
        raise UsageError(
            f"{arg} {str(run_dir)!r}: its {PLOTS} ({str(plots)!r}) is a file, expected a folder "
            "for the PNGs; move it away"
        )


# The files a resume rewrites or appends to once its first step trained.
RECORDS = (METRICS, STEPS, RESUMES, TRAIN_LOG)


def check_records(run_dir: Any, arg: str = "--resume") -> None:
    """Each of the run's RECORDS is a file or not there yet: a folder in one's place would fail
    the resume after its first step trained, with recipe.yaml already rewritten."""
    with reachable(arg, run_dir):
        path = storage.as_path(run_dir)
        bad = [name for name in RECORDS if (path / name).exists() and not (path / name).is_file()]
    if bad:
        raise UsageError(
            f"{arg} {str(run_dir)!r}: its {bad[0]} ({str(path / bad[0])!r}) is not a file; "
            "move it away"
        )


def os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


@contextlib.contextmanager
def written_whole(out: Path, what: str) -> Iterator[Path]:
    """A folder a command writes whole (export's hf and peft formats): written into a hidden
    `.OUT.tmp` beside `out` (the context's value) and renamed into place once complete, so a
    failure or a stop leaves nothing of it; an OSError is one line naming --out and `what`."""
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        storage.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        yield tmp
        if out.exists():  # check_new_local_folder let only an empty one through
            out.rmdir()
        tmp.rename(out)
    except BaseException as exc:
        storage.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UsageError(
                f"--out {str(out)!r}: cannot write {what} ({os_reason(exc)})"
            ) from None
        raise


@contextlib.contextmanager
def reachable(arg: str, path: Any) -> Iterator[None]:
    """A file system that cannot be reached (a bucket without network or credentials, a scheme
    TensorFlow has no plug-in for) or a name longer than it allows is bad input naming the
    argument, not a crash."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # a user's name, not a fault of the file system
            raise UsageError(
                f"{arg} {str(path)!r}: a name in it, or the whole path, is longer than the "
                f"file system allows ({os_reason(exc)}); give a shorter one"
            ) from None
        if not storage.is_remote(path):
            raise
        reason = os_reason(exc)
        if "not implemented" in reason:
            reason += (
                "; TensorFlow has no file system for it here (a plug-in such as tensorflow-io)"
            )
        raise UsageError(f"{arg} {str(path)!r}: cannot use it ({reason})") from None
