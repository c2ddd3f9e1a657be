"""``attnlab export RUN_OR_CHECKPOINT --out DIR``: a Hugging Face model folder (weights,
tokenizer, generation config, model card and the model's own code)."""

from __future__ import annotations

import argparse

from attnlab.base import exitcodes
from attnlab.commands._common import add_trust_argument, trusting

NAME = "export"
HELP = "write a run or checkpoint as a Hugging Face model folder (AutoModelForCausalLM)"

EPILOG = """\
load the folder:
  from transformers import AutoModelForCausalLM, AutoTokenizer
  model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
  tokenizer = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)
  (with attnlab installed, `import attnlab.hf` first and trust_remote_code is not needed,
  unless the model has plugin parts: their code, in plugins/, runs only with it)

--force replaces an earlier export of attnlab's, never one holding a file it did not write or a
file edited since (the model card included); the new folder is swapped in atomically.

evaluate it with lm-evaluation-harness's own model:
  lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --tasks ...

a quantized directory (attnlab quantize, int8-weight or int8-dynamic) exports with its torchao
quantization_config: transformers (and lm_eval --model hf) load it quantized.

--verify loads the folder in a fresh Python where attnlab cannot be imported and compares its
logits with the run's model (a quantized directory's: to its scheme's tolerance), the step logits of transformers' own generate() (KV cache) with a
full forward, and the tokens of generate() and pipeline() with greedy decoding.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument(
        "source",
        metavar="RUN_OR_CHECKPOINT",
        help="a run dir, RUN/checkpoints/step_N or a quantized dir (attnlab quantize)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument(
        "--verify", action="store_true", help="load the export without attnlab and compare"
    )
    add_trust_argument(p)


def run(args: argparse.Namespace) -> int:
    with trusting(args):  # a plugin file inside a received run directory: --trust-remote-code
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from attnlab.base.extras import require

    require("hf", "transformers", "safetensors", what="attnlab export")
    from attnlab.hf.export import export, load_source

    result = export(args.source, args.out, force=args.force)
    size = sum((result.out / f).stat().st_size for f in result.files)
    step = f" at step {result.step}" if result.step is not None else ""
    print(
        f"exported {result.source}{step} to {result.out} ({len(result.files)} files, {size:,} bytes)"
    )
    code = [f for f in result.files if f.endswith(".py") and "/" not in f]
    print("  weights   model.safetensors; config.json (model_type attnlab, auto_map)")
    print(f"  tokenizer {', '.join(f for f in result.files if f.startswith('tokenizer'))}")
    print(
        f"  code      modeling_attnlab.py, configuration_attnlab.py + {len(code) - 2} attnlab modules"
    )
    for p in result.plugins:
        parts = ", ".join(f"{s}.{k}" for s, k, _ in p["parts"])
        print(f"  plugin    {p['spec']} ({parts}) -> {p.get('file') or p['flat_module'] + '.py'}")
    if args.verify:
        from attnlab.hf.verify import check_exports, stored_neighbours
        from attnlab.parts import families
        from attnlab.parts.family import NEIGHBOURS
        from attnlab.quant.store import is_quantized_dir

        tolerance = None
        if is_quantized_dir(args.source):  # against the quantized attnlab model, to its scheme
            from attnlab.quant.schemes import get_scheme
            from attnlab.quant.store import load

            q = load(args.source)
            model, cfg, tok = q.model, q.config, q.tokenizer
            tolerance = get_scheme(q.info["scheme"]).verify_tolerance
        else:
            model, cfg, tok, _, _ = load_source(args.source)
        nb = stored_neighbours(cfg) if families.of(cfg.model).needs(NEIGHBOURS) else None
        (check,) = check_exports(
            [(result.out, model, tok)],
            neighbours=[nb],
            **({"tolerance": tolerance} if tolerance else {}),
        )
        print(check.sentence())
        if not check.passed:
            return exitcodes.FAILED
    return exitcodes.OK
