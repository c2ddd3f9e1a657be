"""Helpers shared by test modules (``from tests.helpers.data import run_config``); fixtures
built on them live in tests/conftest.py."""
