"""Client library of the broker (see the client library issue)."""
