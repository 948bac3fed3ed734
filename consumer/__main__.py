"""`python -m consumer` runs the `gazette` command line (`consume`, and the broker's `serve`)."""

from consumer.cli import main

main()
