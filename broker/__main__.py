"""`python -m broker serve` runs the broker's own command line (`gazette serve`)."""

from broker.cli import main

main()
