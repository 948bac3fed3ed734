"""gazctl: the command-line tool of Gazette in Python (typer + rich)."""

import os

# gRPC's C core logs connection failures (a refused TLS handshake among them) on stderr before the
# call fails, whatever the level of Python's logging; gazctl reports the failed call itself, in one
# line. Read when grpc is imported, so set before any gazctl module imports it.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
