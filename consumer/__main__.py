"""`python -m consumer consume MODULE:ATTR` runs the consumer's own command line (`gazette consume`)."""

from consumer.cli import main

main()
