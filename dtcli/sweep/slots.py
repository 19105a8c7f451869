"""`--jobs K`: the K places trials run at once. On CPUs each place is a share of the cores this
process may use (os.sched_setaffinity in the trial's process: TensorFlow sizes its thread pools,
and devices.py its intra-op threads per virtual CPU, by the cores a process may use); on GPUs a
share of the GPUs (CUDA_VISIBLE_DEVICES). K processes on the same cores only contend."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dtcli import devices as devices_lib
from dtcli.errors import UsageError
from dtcli.recipe import Recipe


@dataclass(frozen=True)
class Slot:
    """Where one trial runs: the cores it may use (None: every one) and its environment."""

    cores: frozenset[int] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def enter(self) -> None:
        """In the trial's process, before it execs: keep to this slot's cores."""
        if self.cores is not None and hasattr(os, "sched_setaffinity"):  # Linux
            os.sched_setaffinity(0, self.cores)


def usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def slots(jobs: int, recipes: list[Recipe]) -> list[Slot]:
    """K slots for trials of `recipes` (every trial's devices must fit one), or a refusal."""
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: expected at least 1 (trials at once)")
    if jobs == 1:
        return [Slot()]
    kinds = {devices_lib.parse(r.devices).kind for r in recipes}
    if kinds == {"cpu"}:
        return _cpu_slots(jobs, usable_cores())
    if kinds == {"gpu"}:
        return _gpu_slots(jobs, recipes, devices_lib.gpus_without_tensorflow())
    raise UsageError(
        f"--jobs {jobs}: trials at once need every trial on cpu or every trial on gpu:N "
        f"(the trials' devices: {', '.join(sorted({r.devices for r in recipes}))}); use --jobs 1"
    )


def _cpu_slots(jobs: int, cores: list[int]) -> list[Slot]:
    if jobs > len(cores):
        raise UsageError(
            f"--jobs {jobs}: this process may use {len(cores)} CPU cores; at most one trial per "
            f"core (--jobs {len(cores)} or fewer)"
        )
    share, extra = divmod(len(cores), jobs)
    out, start = [], 0
    for i in range(jobs):
        size = share + (1 if i < extra else 0)
        out.append(Slot(frozenset(cores[start : start + size])))
        start += size
    return out


def _gpu_slots(jobs: int, recipes: list[Recipe], gpus: int | None) -> list[Slot]:
    counts = {devices_lib.parse(r.devices).count for r in recipes}
    if None in counts:
        raise UsageError(
            f"--jobs {jobs}: a trial's devices are 'gpu' (every GPU); name a count, like "
            "--set devices=gpu:1, to run trials side by side"
        )
    each = max(c for c in counts if c is not None)
    if gpus is None or jobs * each > gpus:
        have = "an unknown number of" if gpus is None else str(gpus)
        raise UsageError(
            f"--jobs {jobs}: {jobs} trials of {each} GPU(s) each need {jobs * each} GPUs; this "
            f"machine shows {have}"
        )
    return [
        Slot(
            env={"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in range(i * each, (i + 1) * each))}
        )
        for i in range(jobs)
    ]
