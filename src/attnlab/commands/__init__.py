"""One module per CLI command (see attnlab.cli)."""
