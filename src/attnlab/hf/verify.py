"""Check exported folders the way a user without attnlab loads them: in a fresh interpreter where
``import attnlab`` fails, through ``AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)``
and ``AutoTokenizer``, against the run's own model.

For each folder:

- max |attnlab logits - transformers logits| on a fixed batch of token ids;
- transformers' own ``model.generate()`` (greedy, with its KV cache): the logits of every decoding
  step against a full forward of the generated sequence without a cache (``max_abs_step_logits``;
  tokens alone can tie on a weak model, logits cannot hide a cache that sees only the new token),
  and whether its tokens equal ``attnlab.model.generate``'s (greedy, stopping at end-of-text);
- transformers' ``pipeline("text-generation")`` on a text: whether its tokens equal greedy
  decoding by full forwards without a cache;
- a model that reads neighbours (``family = "retrieval"``): the checks above run its decoder
  without neighbours (its database is not exported), and ``forward(neighbours=)`` is compared
  with attnlab's on the stored neighbours of validation windows (``stored_neighbours``:
  ``neighbour_logits``); the sentence says which is which.

Several folders share one child process (imports cost most of its time).
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

from attnlab.base.errors import UserError

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
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
torch.set_num_threads(1)

def greedy_without_cache(model, ids, n, eos):
    for _ in range(n):
        nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
        if eos is not None and int(nxt) == eos:
            break
    return ids[0].tolist()

for job in json.load(open(sys.argv[1])):
    model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=True)
    n, eos = job["max_new_tokens"], model.generation_config.eos_token_id
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(job["ids"]), use_cache=False).logits
        nb_logits = None
        if job.get("nb_ids") is not None:  # a retrieval model's neighbour path
            nb_logits = model(input_ids=torch.tensor(job["nb_ids"]),
                              neighbours=torch.tensor(job["neighbours"]), use_cache=False).logits
        prompt = torch.tensor([job["prompt"]])
        gen = model.generate(prompt, max_new_tokens=n, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        steps = torch.stack([step[0] for step in gen.logits])
        full = model(input_ids=gen.sequences, use_cache=False).logits[0]
        start = prompt.shape[1] - 1
        step_diff = float((steps - full[start : start + len(steps)]).abs().max())
        text_ids = tok(job["text"], add_special_tokens=False).input_ids
        piped = reference = []
        if job["pipeline"]:
            pipe = pipeline("text-generation", model=model, tokenizer=tok)
            piped = pipe(job["text"], max_new_tokens=n, do_sample=False, return_tensors=True)
            piped = [int(t) for t in piped[0]["generated_token_ids"]]
            reference = greedy_without_cache(model, torch.tensor([text_ids]), n, eos)
    torch.save({"logits": logits, "nb_logits": nb_logits, "generated": gen.sequences[0].tolist(), "step_diff": step_diff,
                "steps": len(steps), "piped": piped, "piped_reference": reference,
                "module": type(model).__module__, "text_ids": text_ids}, job["out"])
"""


@dataclass(frozen=True)
class Neighbours:
    """Inputs of a retrieval model's neighbour path: ``ids`` [B, T], their ``neighbours``
    [B, C, k, r] token ids, and where they come from (one line)."""

    ids: torch.Tensor
    neighbours: torch.Tensor
    source: str


def stored_neighbours(cfg, windows: int = 2) -> Neighbours:
    """The first ``windows`` validation windows of a retrieval run's data and their neighbours
    from its stored database (checked against its hashes and its data first)."""
    import numpy as np

    from attnlab.data import TokenData
    from attnlab.data.retrieval import sequence_neighbours
    from attnlab.data.retrieval_index.integrity import open_run_database

    r, T = cfg.model.retrieval, cfg.data.seq_len
    data = TokenData.open(cfg.data.dir)
    db = open_run_database(r, cfg.data.dir)
    windows = max(1, min(windows, (len(data.val) - 1) // T))
    offsets, nb = sequence_neighbours(db, data, "val", np.arange(windows) * T, T)
    ids = np.stack([np.asarray(data.val[o : o + T], dtype=np.int64) for o in offsets])
    source = (
        f"the stored neighbours of {windows} validation windows ({windows * (T // r.chunk_size)} "
        f"chunks of {r.chunk_size} tokens, {r.neighbours} neighbours each) from {db.directory}"
    )
    return Neighbours(torch.as_tensor(ids), torch.as_tensor(nb), source)


@dataclass
class Check:
    """One folder's result."""

    folder: str
    max_abs_logits: float
    #: max over generate()'s decoding steps of |step logits - full-forward logits| (KV cache check)
    max_abs_step_logits: float
    #: how many decoding steps generate() made (it stops at end-of-text)
    steps: int
    greedy_equal: bool
    #: pipeline("text-generation") gave the tokens of greedy full forwards without a cache
    pipeline_equal: bool
    tokens_equal: bool
    remote_module: str
    attnlab_tokens: list[int]
    transformers_tokens: list[int]
    prompt_tokens: int
    #: whether pipeline("text-generation") was run (``check_exports(pipeline=False)`` skips it)
    pipeline_checked: bool = True
    #: a model that reads neighbours: max |logits - attnlab logits| of ``forward(neighbours=)``
    #: on the neighbours ``neighbour_source`` names (None: not checked)
    neighbour_logits: float | None = None
    neighbour_source: str = ""
    reads_neighbours: bool = False

    #: float32 logits of the same weights through two code paths agree far closer than this
    TOLERANCE = 1e-4

    @property
    def passed(self) -> bool:
        """Logits, cached decoding, greedy tokens and the pipeline all agree."""
        return (
            self.max_abs_logits < self.TOLERANCE
            and self.max_abs_step_logits < self.TOLERANCE
            and self.greedy_equal
            and self.pipeline_equal
            and (self.neighbour_logits is None or self.neighbour_logits < self.TOLERANCE)
        )

    def sentence(self) -> str:
        """What the check found, in one line."""
        cached = "equal" if self.max_abs_step_logits < self.TOLERANCE else "NOT equal"
        same = "the same" if self.greedy_equal else "DIFFERENT"
        piped = "the same" if self.pipeline_equal else "DIFFERENT"
        piped = (
            f"pipeline('text-generation') gives {piped} tokens as greedy full forwards"
            if self.pipeline_checked
            else "pipeline() not run"
        )
        without = " without neighbours" if self.reads_neighbours else ""
        line = (
            f"verified without attnlab: max |logits - attnlab logits| = {self.max_abs_logits:.3g}"
            f"{without}; transformers' generate() with its KV cache{without}: step logits "
            f"{cached} to a full forward (max |difference| {self.max_abs_step_logits:.3g} over "
            f"{self.steps} steps), {same} {len(self.attnlab_tokens) - self.prompt_tokens} new "
            f"tokens as attnlab generate; {piped}"
        )
        if not self.reads_neighbours:
            return line
        if self.neighbour_logits is None:
            return f"{line}; the neighbour path forward(neighbours=) NOT checked"
        return (
            f"{line}; the neighbour path forward(neighbours=) on {self.neighbour_source}: max "
            f"|logits - attnlab logits| = {self.neighbour_logits:.3g} (the database is not "
            "exported: generate() and pipeline() decode without neighbours)"
        )


def check_exports(
    jobs: list[tuple[Path, torch.nn.Module, object]],
    *,
    seq_len: int = 24,
    new_tokens: int = 24,
    text: str = "The history of attention, in brief.",
    timeout: float = 600,
    pipeline: bool = True,
    neighbours: list[Neighbours | None] | None = None,
) -> list[Check]:
    """``jobs``: (exported folder, the run's model, the run's tokenizer) triples. ``pipeline``:
    also decode ``text`` with transformers' ``pipeline()`` (``attnlab check`` leaves it out).
    ``neighbours``: per job, the inputs on which a retrieval model's neighbour path is compared
    (:func:`stored_neighbours`), or None."""
    from attnlab.model import generate
    from attnlab.parts import families
    from attnlab.parts.family import NEIGHBOURS

    gen = torch.Generator().manual_seed(0)
    specs, refs = [], []
    work = Path(tempfile.mkdtemp(prefix="attnlab-verify-"))
    for i, (folder, model, tok) in enumerate(jobs):
        vocab = min(model.cfg.vocab_size, tok.vocab_size)
        ids = torch.randint(0, vocab, (2, seq_len), generator=gen)
        prompt = tok.encode(text)[:8] or [tok.eos_id]
        nb = neighbours[i] if neighbours is not None else None
        with torch.no_grad():
            logits = model(ids).logits
            nb_logits = None if nb is None else model(nb.ids, neighbours=nb.neighbours).logits
        ref = generate(model, torch.tensor([prompt]), new_tokens, temperature=0, eos_id=tok.eos_id)
        reads = families.of(model.cfg).needs(NEIGHBOURS)
        refs.append((logits, ref[0].tolist(), tok.encode(text), nb_logits, nb, reads))
        out = work / f"{i}.pt"
        specs.append(
            {
                "folder": str(Path(folder).resolve()),
                "ids": ids.tolist(),
                "nb_ids": None if nb is None else nb.ids.tolist(),
                "neighbours": None if nb is None else nb.neighbours.tolist(),
                "prompt": prompt,
                "max_new_tokens": new_tokens,
                "text": text,
                "pipeline": pipeline,
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
    for spec, (logits, tokens, text_ids, nb_logits, nb, reads) in zip(specs, refs):
        got = torch.load(spec["out"], weights_only=True)
        nb_diff = None
        if nb_logits is not None:
            nb_diff = float((nb_logits - got["nb_logits"]).abs().max())
        checks.append(
            Check(
                folder=spec["folder"],
                max_abs_logits=float((logits - got["logits"]).abs().max()),
                max_abs_step_logits=got["step_diff"],
                steps=got["steps"],
                greedy_equal=tokens == got["generated"],
                pipeline_equal=got["piped"] == got["piped_reference"],
                tokens_equal=text_ids == got["text_ids"],
                remote_module=got["module"],
                attnlab_tokens=tokens,
                transformers_tokens=got["generated"],
                prompt_tokens=len(spec["prompt"]),
                pipeline_checked=pipeline,
                neighbour_logits=nb_diff,
                neighbour_source="" if nb is None else nb.source,
                reads_neighbours=reads,
            )
        )
    return checks
