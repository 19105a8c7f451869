"""`python -m dtcli`: the same as the `dtcli` console script."""

from dtcli.cli import main

main()
