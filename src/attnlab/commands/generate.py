"""``attnlab generate RUN_DIR --prompt TEXT``: continue a prompt with a trained decoder."""

from __future__ import annotations

import argparse
import math

from attnlab.base import exitcodes
from attnlab.base.errors import UserError
from attnlab.commands._common import add_trust_argument, trusting

NAME = "generate"
HELP = "continue a prompt with the model of a training run (KV cache; temperature 0 = greedy)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `attnlab train`")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=100, metavar="N")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T", help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None, metavar="K")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--no-cache", action="store_true", help="recompute the prefix every token")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps or auto (default cpu)")
    p.add_argument(
        "--no-retrieval",
        action="store_true",
        help="a family that reads neighbours (model.family='retrieval'): decode without them "
        "(default: live retrieval from the run's database every chunk)",
    )
    add_trust_argument(p)


def _check_flags(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise UserError("--max-new-tokens must be at least 1")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise UserError(
            f"--temperature {args.temperature} must be a finite number >= 0 (0 = greedy)"
        )
    if args.top_k is not None and args.top_k < 1:
        raise UserError("--top-k must be at least 1")
    if not 0 <= args.seed < 2**63:
        raise UserError(f"--seed {args.seed} must be between 0 and 2^63 - 1")


def _prompt_text(prompt: str) -> str:
    """The prompt as text: bytes that are not UTF-8 (surrogate-escaped by Python) are refused."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = prompt.encode("utf-8", "surrogateescape")
        raise UserError(
            f"--prompt is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); give "
            "the prompt as UTF-8 text"
        ) from None
    return prompt


def run(args: argparse.Namespace) -> int:
    with trusting(args):  # a plugin file inside a received run directory: --trust-remote-code
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch

    from attnlab.base.devices import check_device
    from attnlab.base.finite import check_weights
    from attnlab.model import generate
    from attnlab.parts import families
    from attnlab.parts.family import NEIGHBOURS
    from attnlab.runs.device import resolve_device
    from attnlab.runs.load import load_run_model
    from attnlab.runs.runstate import require_weights

    _check_flags(args)
    prompt_text = _prompt_text(args.prompt)
    check_device(args.device)
    device = resolve_device(args.device, setting="--device")
    args.device = str(device)
    _preflight(args)
    require_weights(args.run_dir)
    model, cfg, tok = load_run_model(args.run_dir, device=device)
    family = families.of(cfg.model)
    if not family.continues_text:
        raise UserError(
            f"{args.run_dir} holds a model.family={cfg.model.family!r} model; `generate` continues "
            f"text with {families.where(lambda f: f.continues_text)} models only"
        )
    check_weights(model, str(args.run_dir))
    ids = list(tok.encode(prompt_text))
    if not ids:
        if tok.eos_id is None:
            raise UserError("the prompt is empty; give some text with --prompt")
        ids = [tok.eos_id]  # an empty prompt starts a new document
    limit = cfg.model.position_limit
    if limit is not None and len(ids) + args.max_new_tokens > limit:
        if len(ids) >= limit:
            fix = (
                f"shorten the prompt to at most {limit - args.max_new_tokens} tokens"
                if args.max_new_tokens < limit
                else f"shorten the prompt and use --max-new-tokens below {limit}"
            )
        else:
            fix = f"use --max-new-tokens {limit - len(ids)} or a shorter prompt"
        raise UserError(
            f"the prompt has {len(ids)} tokens; with --max-new-tokens {args.max_new_tokens} that "
            f"exceeds the model's {limit} {cfg.model.position_limit_noun}; {fix}"
        )
    gen = torch.Generator(device=device).manual_seed(args.seed)
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
    if family.needs(NEIGHBOURS):  # live retrieval: neighbours every chunk
        out = _generate_retrieval(args, model, cfg, prompt, tok, gen)
    else:
        out = generate(
            model,
            prompt,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            use_cache=not args.no_cache,
            eos_id=tok.eos_id,
            generator=gen,
        )
    new = out[0, len(ids) :].tolist()
    if tok.eos_id is not None and tok.eos_id in new:
        new = new[: new.index(tok.eos_id)]
    # ids above the tokenizer's vocabulary (mask/sentinel slots) are not text
    new = [i for i in new if i < tok.vocab_size]
    print(prompt_text + tok.decode(new))
    return exitcodes.OK


def _generate_retrieval(args, model, cfg, prompt, tok, gen):
    """Live retrieval (RETRO §2.6): each completed chunk of m tokens is queried against the
    database's stored index (loaded, not built; the database checked against its hashes and
    its data first), and every later token reads its neighbours. Retrieval time is reported
    apart from model time on stderr."""
    import sys
    import time

    from attnlab.data import TokenData
    from attnlab.data.retrieval_files import rebuild_command
    from attnlab.data.retrieval_index.integrity import open_run_database
    from attnlab.data.retrieval_index.live import import_backend
    from attnlab.model.retrieval import generate_with_retrieval

    retrieve = None
    spent, how, index_s, imports_s = [0.0], "", 0.0, 0.0
    if not args.no_retrieval:
        r = cfg.model.retrieval
        data = TokenData.open(cfg.data.dir)
        db = open_run_database(r, cfg.data.dir)
        t = time.perf_counter()
        import_backend(db.index)
        imports_s, t = time.perf_counter() - t, time.perf_counter()
        live = db.retriever(data)
        index_s = time.perf_counter() - t
        how = "loaded" if db.stored_index else "built"
        if not db.stored_index:
            print(
                f"attnlab generate: {db.directory} predates stored indices, so its BM25 index "
                f"was built now; `{rebuild_command(db.directory)}` stores it",
                file=sys.stderr,
            )

        def retrieve(chunk):
            t0 = time.perf_counter()
            try:
                return live(chunk)
            finally:
                spent[0] += time.perf_counter() - t0

    t = time.perf_counter()
    out, calls = generate_with_retrieval(
        model,
        prompt,
        args.max_new_tokens,
        retrieve,
        temperature=args.temperature,
        top_k=args.top_k,
        generator=gen,
        eos_id=tok.eos_id,
        use_cache=not args.no_cache,
    )
    total = time.perf_counter() - t
    if retrieve is not None:
        print(
            f"attnlab generate: {calls} retrievals took {spent[0]:.3f} s (index {how} in "
            f"{index_s:.3f} s, its library imported in {imports_s:.2f} s); the model "
            f"{total - spent[0]:.3f} s",
            file=sys.stderr,
        )
    return out


def _preflight(args: argparse.Namespace) -> None:
    """The run's weights and one step's logits against the device's free memory, before loading."""
    from attnlab.runs.load import run_config
    from attnlab.runs.preflight import check, inference_estimate, run_weight_bytes

    cfg = run_config(args.run_dir)
    weights = run_weight_bytes(args.run_dir)
    if cfg is None or weights is None:
        return  # load_run_model says what is missing
    m = cfg.model
    est = inference_estimate(
        m, batch_size=1, seq_len=m.max_seq_len, device=args.device, weights_bytes=weights
    )
    check(est, command="attnlab generate")
