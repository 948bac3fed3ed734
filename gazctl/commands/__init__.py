"""gazctl sub-commands, one module per command group."""
