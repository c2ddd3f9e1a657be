"""attnlab's test suite, one folder per package of src/attnlab (see docs/ARCHITECTURE.md, "Where a
test goes"); shared fixtures in conftest.py, shared helpers in tests/helpers."""
