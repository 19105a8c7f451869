"""`dtcli launch`: a multi-client DTensor run as N local processes on loopback.

Each client is a plain `dtcli train --client-id I --jobs ...` in its own process group, so the
launcher adds nothing a multi-host run lacks: it picks free loopback ports, prefixes each
client's output with its id, draws client 0's progress bar, and when one client fails it stops
the others (SIGINT, then SIGKILL) and names the client. Clients also die with the launcher
(PR_SET_PDEATHSIG), so even a killed launcher leaves no orphans on Linux.
"""

from dtcli.launch.planning import LaunchPlan, plan
from dtcli.launch.supervisor import ClientFailed, run

__all__ = ["ClientFailed", "LaunchPlan", "plan", "run"]
