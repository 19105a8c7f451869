"""lm-eval's own output while dtcli runs it (its task checks and its evaluations): nothing on
stdout, which is dtcli's (--json prints one JSON object there); no progress bars where dtcli
shows none; no hint about an option dtcli does not have; no git error from the folder dtcli
happens to run in.

lm_eval, datasets and tqdm are imported inside the functions: lm_eval is an optional extra.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator

# lm-eval's warning at each task with a `custom_dataset`, pointing at lm-eval's --metadata
# option, which dtcli's commands do not have.
METADATA_HINT = "Custom kwargs can be passed to `--metadata`"


@contextlib.contextmanager
def lm_eval_output(progress: bool = True, prints: bool = True) -> Iterator[None]:
    """For the duration: lm-eval's prints (a stray `print(type(...))` before one of its errors)
    go to stderr, or nowhere with `prints` false (a check, whose refusal is one line); its
    --metadata hint is dropped; its results' git_hash is dtcli's version and runs no git; with
    `progress` false, no tqdm bar (lm-eval's, datasets') is drawn."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(sys.stderr if prints else io.StringIO()))
        stack.enter_context(_metadata_hint_dropped())
        stack.enter_context(_dtcli_as_git_hash())
        stack.enter_context(_no_torch())
        if not progress:
            stack.enter_context(_no_progress_bars())
        yield


class _DropMetadataHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return METADATA_HINT not in record.getMessage()


@contextlib.contextmanager
def _metadata_hint_dropped() -> Iterator[None]:
    # on the logger that emits it (a logger's filters see its own records only), so every
    # other warning of lm-eval's still shows
    logger = logging.getLogger("lm_eval.api.task")
    hint = _DropMetadataHint()
    logger.addFilter(hint)
    try:
        yield
    finally:
        logger.removeFilter(hint)


@contextlib.contextmanager
def _dtcli_as_git_hash() -> Iterator[None]:
    """lm-eval records `git describe` of the working directory as the results' git_hash, with
    git's stderr inherited: outside a checkout a `fatal: not a git repository` line, inside one
    the hash of whatever folder dtcli runs in. The code that scored is dtcli (lm_eval's own
    version is in the results beside it): its version instead, and no git."""
    import lm_eval.evaluator

    from dtcli import __version__

    real = lm_eval.evaluator.get_git_commit_hash
    lm_eval.evaluator.get_git_commit_hash = lambda: f"dtcli {__version__}"
    try:
        yield
    finally:
        lm_eval.evaluator.get_git_commit_hash = real


@contextlib.contextmanager
def _no_torch() -> Iterator[None]:
    """Where torch is installed (beside dtcli, not for it), lm-eval imports it to seed it and to
    run torch's collect_env into the results (0.8 s, then 0.4 s at every evaluation of a
    training run), though nothing of dtcli's runs on torch: neither happens, and the results'
    environment names what scored (dtcli, TensorFlow). --seed's third value is still recorded."""
    from importlib.metadata import version

    import lm_eval.evaluator

    from dtcli import __version__

    def env_info(storage: dict) -> None:
        storage.update(
            pretty_env_info=f"dtcli {__version__}, TensorFlow {version('tensorflow')}",
            transformers_version="N/A (not used by dtcli)",
            lm_eval_version=version("lm_eval"),
            upper_git_hash=None,
        )

    real = lm_eval.evaluator.set_torch_seed, lm_eval.evaluator.add_env_info
    lm_eval.evaluator.set_torch_seed = lambda seed: None
    lm_eval.evaluator.add_env_info = env_info
    try:
        yield
    finally:
        lm_eval.evaluator.set_torch_seed, lm_eval.evaluator.add_env_info = real


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """Every tqdm bar created meanwhile disabled: lm-eval's (`Tokenizing inputs`, building
    requests) take no switch from simple_evaluate, and tqdm reads TQDM_DISABLE once, at its
    import. datasets' and huggingface_hub's bars are tqdm subclasses, so this covers them too."""
    from tqdm import std

    real = vars(std.tqdm)["__init__"]

    def disabled(self, *args, **kwargs) -> None:  # noqa: ANN001
        kwargs["disable"] = True
        real.__get__(self, type(self))(*args, **kwargs)

    std.tqdm.__init__ = disabled
    try:
        yield
    finally:
        std.tqdm.__init__ = real
