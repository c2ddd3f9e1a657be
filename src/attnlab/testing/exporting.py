"""Export: the part's small decoder, exported (``attnlab.hf.export.export_model``), loads in
``transformers`` in a fresh process where attnlab cannot be imported; its logits equal
attnlab's, and transformers' own ``generate()`` with its cache gives step logits equal to a full
forward (``attnlab.hf.verify.check_exports``, float32, limit 1e-4). Every part's folder is loaded
by one child process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.parts import families
from attnlab.testing.cases import Case, build
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "export"
#: tokens the checks decode (few: each step is a forward in the child process)
NEW_TOKENS = 4
SEQ_LEN = 12
#: the exported model holds the positions of the text transformers' pipeline() decodes
CONFIG = ("model.max_seq_len=64",)


@dataclass
class Job:
    """One part's exported folder with the model and tokenizer it came from."""

    folder: Path
    model: torch.nn.Module
    tokenizer: object
    case: Case


def prepare(name: str, cfg, case: Case, folder: Path) -> Job | Result:
    """Export the part's small decoder to ``folder`` (float32, spread weights so greedy decoding
    has no near-ties); a Result when it cannot be exported."""
    family = families.of(cfg.model)
    if not family.exports or family.data_needs:  # the check feeds the exported model text alone
        plain = families.where(lambda f: f.exports and not f.data_needs)
        return skipped(NAME, f"no {plain} config accepts {name}; only those export here")
    from transformers.utils import logging as hf_logging

    from attnlab.data.tokenizer_lookup import load_tokenizer
    from attnlab.hf.export import export_model

    model = build(cfg, seed=4, spread=0.15, dtype=torch.float32)
    tok = load_tokenizer("bytes")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the tokenizer's notes on a 64-position model
    try:
        export_model(model, cfg, tok, folder, source=f"attnlab check {name}")
    except Exception as e:
        return failed(
            NAME,
            f"exporting {name} fails: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
            "keep the part's module importable on its own (absolute imports of attnlab and "
            "installed packages only)",
            where=case.name,
        )
    finally:
        hf_logging.set_verbosity(level)
    return Job(folder, model, tok, case)


def run(jobs: list[Job]) -> list[Result]:
    """Load every folder in one child process; one Result per job."""
    if not jobs:
        return []
    from attnlab.hf.verify import check_exports

    try:
        checks = check_exports(
            [(j.folder, j.model, j.tokenizer) for j in jobs],
            seq_len=SEQ_LEN,
            new_tokens=NEW_TOKENS,
            pipeline=False,
        )
    except Exception as e:
        message = " ".join(str(e).split())[-400:]
        return [
            failed(
                NAME,
                f"transformers could not load the exports: {message}",
                "run `attnlab export` on a run with this part for the full error",
                where=j.case.name,
            )
            for j in jobs
        ]
    out = []
    for job, c in zip(jobs, checks):
        worst = max(c.max_abs_logits, c.max_abs_step_logits)
        if c.passed:
            out.append(passed(NAME, c.sentence(), worst, c.TOLERANCE, job.case.name))
            continue
        if c.max_abs_logits >= c.TOLERANCE:
            fix = (
                "the exported code computes differently: keep forward's behaviour in the module "
                "(no global state, no reading of attnlab outside its own imports)"
            )
        elif c.max_abs_step_logits >= c.TOLERANCE:
            fix = (
                "cached decoding in transformers differs from the full forward: a part that mixes "
                "over time must declare supports_kv_cache = False or keep what the cache needs"
            )
        else:
            fix = "greedy tokens differ: a near-tie in the logits, or decoding reads other state"
        out.append(failed(NAME, c.sentence(), fix, worst, c.TOLERANCE, job.case.name))
    return out
