"""`python -m rlgate ...`: the `rlgate` command line."""

from rlgate.cli import main

main()
