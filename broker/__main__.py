"""`python -m broker` runs the `gazette` command line."""

from broker.cli import main

main()
