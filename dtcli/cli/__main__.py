"""`python -m dtcli.cli`: the same as the `dtcli` console script (launch starts its clients so)."""

from dtcli.cli import main

main()
