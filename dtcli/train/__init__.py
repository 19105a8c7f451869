"""`dtcli train`: orchestration of one run, and the loop that decides when to log, evaluate and
checkpoint.

    run.py      open and lock the run, check the other clients, restore, run the loop, plot
    state.py    `Run`: what one run holds as this process trains it; `RunResult`
    resume.py   a resume: its checkpoint restored, its files brought up to date after a step
    clients.py  a multi-client run: the preflight, client 0's choices, a lost client
    loop.py     one epoch -> its record -> a checkpoint when due
    signals.py  SIGINT, SIGTERM and a multi-client run's preemption
    console.py  the run header, the epoch line, the summary

The engine (devices, mesh, data, model, optimizer, the compiled steps, evaluation) is
dtcli.session; the run directory's layout, lock and checkpoints are dtcli.rundir. A run stops
loudly on a non-finite loss.
"""

from dtcli.train.run import command, train
from dtcli.train.state import RunResult

__all__ = ["RunResult", "command", "train"]
