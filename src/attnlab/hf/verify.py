"""Check exported folders the way a user without attnlab loads them: in a fresh interpreter where
``import attnlab`` fails, through ``AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)``
and ``AutoTokenizer``, against the run's own model.

For each folder: max |attnlab logits - transformers logits| on a fixed batch of token ids, and
whether ``model.generate()`` (greedy, KV cache) gives ``attnlab.model.generate``'s tokens
(greedy, stopping at end-of-text like ``attnlab generate``). Several folders share one child
process (imports cost most of its time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.errors import UserError

#: prepended to the child's code: attnlab cannot be imported there
BLOCK_ATTNLAB = """
import importlib.abc, sys
class _NoAttnlab(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "attnlab" or name.startswith("attnlab."):
            raise ImportError(f"attnlab is not importable in this check ({name})")
sys.meta_path.insert(0, _NoAttnlab())
"""

CHILD = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(1)
for job in json.load(open(sys.argv[1])):
    model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=True)
    ids = torch.tensor(job["ids"])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    prompt = torch.tensor([job["prompt"]])
    out = model.generate(prompt, max_new_tokens=job["max_new_tokens"], do_sample=False)
    torch.save({"logits": logits, "generated": out[0].tolist(), "module": type(model).__module__,
                "text_ids": tok(job["text"], add_special_tokens=False).input_ids}, job["out"])
"""


@dataclass
class Check:
    """One folder's result."""

    folder: str
    max_abs_logits: float
    greedy_equal: bool
    tokens_equal: bool
    remote_module: str
    attnlab_tokens: list[int]
    transformers_tokens: list[int]
    prompt_tokens: int


def check_exports(
    jobs: list[tuple[Path, torch.nn.Module, object]],
    *,
    seq_len: int = 24,
    new_tokens: int = 24,
    text: str = "The history of attention, in brief.",
    timeout: float = 600,
) -> list[Check]:
    """``jobs``: (exported folder, the run's model, the run's tokenizer) triples."""
    from attnlab.model import generate

    gen = torch.Generator().manual_seed(0)
    specs, refs = [], []
    work = Path(tempfile.mkdtemp(prefix="attnlab-verify-"))
    for i, (folder, model, tok) in enumerate(jobs):
        vocab = min(model.cfg.vocab_size, tok.vocab_size)
        ids = torch.randint(0, vocab, (2, seq_len), generator=gen)
        prompt = tok.encode(text)[:8] or [tok.eos_id]
        with torch.no_grad():
            logits = model(ids).logits
        ref = generate(model, torch.tensor([prompt]), new_tokens, temperature=0, eos_id=tok.eos_id)
        refs.append((logits, ref[0].tolist(), tok.encode(text)))
        out = work / f"{i}.pt"
        specs.append(
            {
                "folder": str(Path(folder).resolve()),
                "ids": ids.tolist(),
                "prompt": prompt,
                "max_new_tokens": new_tokens,
                "text": text,
                "out": str(out),
            }
        )
    (work / "jobs.json").write_text(json.dumps(specs))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    env.pop("PYTHONPATH", None)  # a source checkout on the path would make attnlab importable
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_ATTNLAB + CHILD, str(work / "jobs.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise UserError(f"loading the export without attnlab failed:\n{proc.stderr[-3000:]}")
    checks = []
    for spec, (logits, tokens, text_ids) in zip(specs, refs):
        got = torch.load(spec["out"])
        checks.append(
            Check(
                folder=spec["folder"],
                max_abs_logits=float((logits - got["logits"]).abs().max()),
                greedy_equal=tokens == got["generated"],
                tokens_equal=text_ids == got["text_ids"],
                remote_module=got["module"],
                attnlab_tokens=tokens,
                transformers_tokens=got["generated"],
                prompt_tokens=len(spec["prompt"]),
            )
        )
    return checks
