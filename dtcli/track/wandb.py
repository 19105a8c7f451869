"""track: wandb: a run's config, metrics, tags and files in a Weights & Biases run (a resume:
the same run id, resume="allow"). Its files go into RUN_DIR/wandb; it never captures the
terminal (dtcli owns it). wandb (an optional extra) is imported inside the functions only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dtcli.recipe import WandbConfig
from dtcli.track.base import FINISHED, KILLED, Batch, RunInfo, cause

# W&B's limit on a tag's length.
TAG_LENGTH = 64


class WandbSink:
    name = "wandb"

    def __init__(self, cfg: WandbConfig):
        self.cfg = cfg
        self.where = f"{cfg.entity or ''}/{cfg.project}"
        self.run: Any = None
        self.run_dir: Path | None = None

    def start(self, run: RunInfo) -> str:
        import wandb
        from wandb.sdk.lib.runid import generate_id

        self.run_dir = run.run_dir
        settings = wandb.Settings(
            console="off",  # no stdout/stderr capture: dtcli owns the terminal
            silent=True,
            show_info=False,
            show_warnings=False,
            disable_git=True,
            save_code=False,
            x_save_requirements=False,
            x_disable_stats=True,
            init_timeout=30,
        )
        resumed = run.run_id is not None
        self.run = wandb.init(
            project=self.cfg.project,
            entity=self.cfg.entity,
            mode=self.cfg.mode,
            dir=str(run.run_dir),
            id=run.run_id or generate_id(),
            resume="allow",
            name=run.name,
            config=None if resumed else run.params,
            tags=[f"{k}={v}"[:TAG_LENGTH] for k, v in run.tags.items()],
            settings=settings,
            reinit="create_new",
        )
        if resumed and run.changes:  # a resume's changes beside the first recipe's config
            changed = {f"dtcli.resumed.{k}": v[1] for k, v in run.changes.items()}
            self.run.config.update(changed, allow_val_change=True)
        return self.run.id

    def log(self, batch: Batch) -> None:
        for step, values in batch:
            self.run.log(dict(values), step=step)

    def artifacts(self, files: list[Path], summary: dict[str, Any]) -> None:
        import wandb

        if summary:
            self.run.summary.update(summary)
        if not files:
            return
        # One artifact of the run's files, each added where it lies: no copy staged in the
        # user's home, no line printed (run.save and add_dir print one).
        artifact = wandb.Artifact(f"{self.run.id}-files", type="dtcli-run")
        for path in files:
            found = sorted(path.rglob("*")) if path.is_dir() else [path]
            for file in (f for f in found if f.is_file()):
                name = str(file.relative_to(path.parent))
                where = os.path.abspath(file)  # `wandb sync` may run from another folder
                artifact.add_file(where, name=name, policy="immutable", skip_cache=True)
        self.run.log_artifact(artifact)

    def failure(self, exc: BaseException) -> str:
        return cause(exc)

    def finish(self, status: str) -> None:
        if status == KILLED:
            self.run.mark_preempting()  # W&B shows it preempted: a resume continues it
        self.run.finish(exit_code=0 if status == FINISHED else 1)
