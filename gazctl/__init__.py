"""gazctl: the command-line tool of Gazette in Python (typer + rich)."""
