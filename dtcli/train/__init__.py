"""`dtcli train`: orchestration of one run, and the loop that decides when to log, evaluate and
checkpoint.

    run.py      open and lock the run, check the other clients, restore, run the loop, plot
    loop.py     one epoch -> its record -> a checkpoint when due
    signals.py  SIGINT, SIGTERM and a multi-client run's preemption
    console.py  the run header, the epoch line, the summary

The engine (devices, mesh, data, model, optimizer, the compiled steps, evaluation) is
dtcli.session; the run directory's layout, lock and checkpoints are dtcli.rundir. A run stops
loudly on a non-finite loss.
"""

from dtcli.train.run import RunResult, train

__all__ = ["RunResult", "train"]
