"""`python -m gazctl` runs the gazctl command line."""

from gazctl.app import main

main()
