"""rlgate's product commands (the top layer)."""
