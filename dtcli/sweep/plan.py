"""A sweep made ready before any trial starts, without TensorFlow: the trials drawn, each
trial's recipe loaded with the recipe's own checks, the metric and its direction, the slots of
--jobs, the folder and whether it is this command's own."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtcli import recipe as recipe_lib
from dtcli import rundir, track
from dtcli.errors import UsageError
from dtcli.recipe import Recipe
from dtcli.sweep import folder as folder_lib
from dtcli.sweep import parent, ranking
from dtcli.sweep import trials as trials_lib
from dtcli.sweep.slots import Slot, slots
from dtcli.sweep.trials import Trial


@dataclass(frozen=True)
class SweepAsk:
    """What the command line asks for."""

    recipe: str
    grid: tuple[str, ...] = ()
    random: int | None = None
    distributions: tuple[str, ...] = ()
    seed: int | None = None
    sets: tuple[str, ...] = ()
    metric: str = "eval_loss"
    mode: str | None = None
    rank: str = "last"
    out: str | None = None
    jobs: int = 1


@dataclass
class SweepPlan:
    recipe: str  # the recipe's path, absolute: each trial runs it
    sets: list[str]  # --set common to every trial
    trials: list[Trial]
    recipes: list[Recipe]  # each trial's, loaded and checked
    metric: str
    mode: str
    rank: str
    out: Path
    slots: list[Slot]
    overrides: list[dict[str, Any]]  # each trial's swept keys as its recipe holds them
    log_keys: set[str]  # keys drawn on a log scale
    mlflow: Any  # the trials' mlflow tracker's options (a parent run nests them), or None
    ident: dict[str, Any]  # sweep.json's identity of the sweep
    recorded: dict[str, Any] | None  # its sweep.json, on a re-run

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.trials[0].texts] if self.trials else []

    def trial_dir(self, trial: Trial) -> Path:
        return self.out / trial.folder


def make(ask: SweepAsk) -> SweepPlan:
    """Every check a sweep makes before it starts anything; refusals as UsageError."""
    trials = _trials(ask)
    ranking.check_rank(ask.rank)
    if ask.jobs < 1:
        raise UsageError(f"--jobs {ask.jobs}: expected at least 1 (trials at once)")
    swept = {key for t in trials for key, _ in t.texts}
    for assignment in ask.sets:
        key = assignment.partition("=")[0].strip()
        if key in swept:
            raise UsageError(f"--set {assignment!r}: '{key}' is swept; drop it from --set")
    path = str(Path(ask.recipe).resolve()) if Path(ask.recipe).is_file() else ask.recipe
    # The recipe and the common --set alone first: a mistake there is no trial's.
    recipe_lib.load(path, list(ask.sets), from_run=rundir.resolve_from_run)
    recipes = [_trial_recipe(path, list(ask.sets), t) for t in trials]
    for recipe in recipes:
        ranking.check_metric(ask.metric, recipe)
        track.check_installed(recipe)  # as train checks it, but before any trial starts
    overrides = [_as_loaded(r, t) for r, t in zip(recipes, trials)]
    if ask.grid:
        _check_typed_values_once(trials, overrides)
    mode = ranking.default_mode(ask.metric, ask.mode)
    ident = folder_lib.identity(path, list(ask.sets), trials)
    if ask.out is not None and not ask.out.strip():
        raise UsageError(f"--out {ask.out!r}: expected a folder")
    out = Path(ask.out) if ask.out else folder_lib.default_out(recipes[0].name, ident)
    recorded = folder_lib.check_out(out, ident)
    for trial in trials:
        _check_trial_folder(out / trial.folder, trial)
    return SweepPlan(
        recipe=path,
        sets=list(ask.sets),
        trials=trials,
        recipes=recipes,
        metric=ask.metric,
        mode=mode,
        rank=ask.rank,
        out=out,
        slots=slots(ask.jobs, recipes),
        overrides=overrides,
        log_keys=trials_lib.log_keys(list(ask.distributions)) if ask.random else set(),
        ident=ident,
        recorded=recorded,
        mlflow=parent.mlflow_config(recipes[0]),
    )


def _trials(ask: SweepAsk) -> list[Trial]:
    if ask.grid and ask.random is not None:
        raise UsageError(
            "--grid and --random: give one of them (a sweep is a grid, or N random draws)"
        )
    if ask.random is not None:
        return trials_lib.random(ask.random, list(ask.distributions), ask.seed)
    if ask.distributions:
        raise UsageError(
            f"{ask.distributions[0]!r}: an argument after RECIPE is a distribution of --random N; "
            "for a grid write --grid KEY=V1,V2"
        )
    if not ask.grid:
        raise UsageError("expected --grid KEY=V1,V2,... or --random N KEY=DIST ... --seed S")
    if ask.seed is not None:
        raise UsageError("--seed: draws --random's trials; a --grid draws nothing")
    return trials_lib.grid(list(ask.grid))


def _trial_recipe(path: str, sets: list[str], trial: Trial) -> Recipe:
    """The trial's recipe, loaded as `dtcli train RECIPE --set ...` loads it."""
    try:
        return recipe_lib.load(path, [*sets, *trial.sets], from_run=rundir.resolve_from_run)
    except UsageError as exc:
        raise UsageError(f"trial {trial.index} ({trial.shown()}): {exc}") from None


def _as_loaded(recipe: Recipe, trial: Trial) -> dict[str, Any]:
    """The trial's swept keys with the values its recipe holds: typed by the key (YAML reads
    `1e-3` as text; optimizer.learning_rate makes it the number 0.001)."""
    mapping = recipe_lib.to_mapping(recipe)
    out = {}
    for key, value in trial.values.items():
        node: Any = mapping
        for part in re.sub(r"\[(\w*)\]", r".\1", key).split("."):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                node = value  # a key the loaded recipe spells otherwise: as --set typed it
                break
        out[key] = node
    return out


def _check_typed_values_once(trials: list[Trial], overrides: list[dict[str, Any]]) -> None:
    """Two texts of a --grid key that the key types to one value (1e-3 and 0.001 for
    optimizer.learning_rate) make two identical trials."""
    texts: dict[tuple[str, str], str] = {}  # (key, the typed value as JSON): its first text
    for trial, typed in zip(trials, overrides):
        for key, text in trial.texts:
            first = texts.setdefault(
                (key, json.dumps(typed[key], sort_keys=True, default=str)), text
            )
            if first != text:
                raise UsageError(
                    f"--grid '{key}=...': the value {typed[key]} of '{key}' is given twice (as "
                    f"{first} and {text}); give each value once"
                )


def _check_trial_folder(path: Path, trial: Trial) -> None:
    if path.exists() and not path.is_dir():
        raise UsageError(f"trial {trial.index}: {str(path)!r} is a file, expected its run folder")
