"""Consumer framework (not yet built)."""
