"""One place per fact: each fact below has one home in src/attnlab, and a second copy fails here.

Each test reads the sources for the shape a copy would take (a literal exit code, a second
``resolve_device``, a JSON-lines loop, ...), and names the home the copy should call instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers.paths import PACKAGE

SRC = PACKAGE


def _hits(pattern: str, allowed: set[str], files: list[Path] | None = None) -> list[str]:
    """``file:line: text`` of every line matching ``pattern`` outside the ``allowed`` files
    (paths under src/attnlab)."""
    regex = re.compile(pattern)
    out = []
    for path in sorted(files if files is not None else SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        if rel in allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if regex.search(line):
                out.append(f"{rel}:{n}: {line.strip()}")
    return out


FACTS = {
    # fact: (pattern of a copy, its one home)
    "device auto": (
        r"def resolve_device\b|\"cuda\" if torch\.cuda\.is_available\(\)",
        "runs/device.py",
    ),
    "auto dtype": (r"torch\.bfloat16 if ", "runs/device.py"),
    "default init std": (r"(?<![\w.])0\.02\b", "base/schema.py"),
    "JSON-lines reading": (r"json\.loads\(line\)", "base/jsonlines.py"),
    "versioned meta.json": (r"meta\.get\(\"format\"\) != ", "data/versioned.py"),
    "flattening to dotted keys": (r'key \+ "\."', "config/merge.py"),
    "parameter counting": (r"numel\(\) for \w+ in ", "base/params.py"),
    "torchrun's LOCAL_RANK": (r"\"LOCAL_RANK\"", "runs/device.py"),
}
#: the same shape meaning another fact: a FLOP tolerance, the bytes of a module's state
ELSEWHERE = {
    "default init std": {"testing/declarations.py"},
    "parameter counting": {"testing/memory.py"},
}


@pytest.mark.parametrize("fact", FACTS)
def test_a_fact_has_one_home(fact: str) -> None:
    pattern, home = FACTS[fact]
    assert (SRC / home).is_file()
    copies = _hits(pattern, {home, *ELSEWHERE.get(fact, set())})
    assert copies == [], f"{fact} belongs in {home}; copies:\n" + "\n".join(copies)


def test_the_patterns_would_catch_a_copy() -> None:
    for fact, line in {
        "device auto": 'return "cuda" if torch.cuda.is_available() else "cpu"',
        "auto dtype": 'return torch.bfloat16 if device.type == "cuda" else torch.float32',
        "default init std": "part.init_weights(Init(0.02, 0.02))",
        "JSON-lines reading": "row = json.loads(line)",
        "versioned meta.json": 'if meta.get("format") != FORMAT:',
        "flattening to dotted keys": 'out.update(_flatten(v, key + "."))',
        "parameter counting": "n = sum(p.numel() for p in model.parameters())",
        "torchrun's LOCAL_RANK": 'int(os.environ.get("LOCAL_RANK", "0"))',
    }.items():
        assert re.search(FACTS[fact][0], line), fact


# ------------------------------------------------------------------------------- exit codes

EXIT_LITERAL = re.compile(
    r"\breturn [0-9]+\b(?!\.)|sys\.exit\([0-9]+\)|SystemExit\([0-9]+\)|\b[0-9]+ if .* else [0-9]+\b"
)


def test_commands_exit_only_through_the_named_codes() -> None:
    """cli.py and every command return ``exitcodes.OK`` / ``FAILED`` / ``USER_ERROR`` ..., never
    a bare number (base/exitcodes.py is the one table the CLI, --help and the README share)."""
    files = [SRC / "cli.py", *sorted((SRC / "commands").glob("*.py"))]
    bad = _hits(EXIT_LITERAL.pattern, set(), files)
    assert len(files) > 10 and bad == [], "\n".join(bad)
    assert EXIT_LITERAL.search("        return 2")
    assert EXIT_LITERAL.search("    return 0 if ok else 1")
    assert not EXIT_LITERAL.search("    return exitcodes.OK")


# --------------------------------------------------------------------------- the hot path


def test_decoding_looks_nothing_up_per_token(monkeypatch) -> None:
    """The position part's limit and class are read when the model is built: generating asks
    the part registry nothing, however many tokens it decodes."""
    from attnlab.model import build_model
    from attnlab.model.generate import generate
    from attnlab.parts import registry
    from tests.helpers.model import tiny

    model = build_model(tiny("model.position.kind=learned"))
    calls = []
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda *a: calls.append(a) or real(*a))
    ids = torch.zeros(1, 3, dtype=torch.long)
    for cache in (True, False):
        generate(model, ids, 5, temperature=0, use_cache=cache)
        model(ids)
    assert calls == []
