"""Repository-wide rules: import layers, function length, documentation, the lean install and
the layout of this suite (a test per package in the fast tier)."""
