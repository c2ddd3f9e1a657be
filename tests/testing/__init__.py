"""Tests of attnlab.testing: the conformance battery over every part, and ``attnlab check``."""
