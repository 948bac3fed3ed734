"""`python -m gazette serve|consume` runs the `gazette` command line."""

from gazette.cli import main

main()
