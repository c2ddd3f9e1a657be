"""``attnlab generate RUN_DIR --prompt TEXT``: continue a prompt with a trained decoder."""

from __future__ import annotations

import argparse

from attnlab.errors import UserError

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


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab.model import generate
    from attnlab.runs.device import resolve_device
    from attnlab.runs.load import load_run_model

    if args.max_new_tokens < 1:
        raise UserError("--max-new-tokens must be at least 1")
    if args.temperature < 0:
        raise UserError("--temperature must be >= 0 (0 = greedy)")
    if args.top_k is not None and args.top_k < 1:
        raise UserError("--top-k must be at least 1")
    device = resolve_device(args.device, setting="--device")
    model, cfg, tok = load_run_model(args.run_dir, device=device)
    if cfg.model.family != "decoder":
        raise UserError(
            f"{args.run_dir} holds a model.family={cfg.model.family!r} model; `generate` continues "
            "text with decoders only"
        )
    ids = list(tok.encode(args.prompt))
    if not ids:
        if tok.eos_id is None:
            raise UserError("the prompt is empty; give some text with --prompt")
        ids = [tok.eos_id]  # an empty prompt starts a new document
    limit = cfg.model.max_seq_len if cfg.model.position.kind == "learned" else None
    if limit is not None and len(ids) + args.max_new_tokens > limit:
        raise UserError(
            f"the prompt has {len(ids)} tokens; with --max-new-tokens {args.max_new_tokens} that "
            f"exceeds the model's {limit} learned positions; use --max-new-tokens "
            f"{max(1, limit - len(ids))} or a shorter prompt"
        )
    gen = torch.Generator(device=device).manual_seed(args.seed)
    prompt = torch.tensor([ids], dtype=torch.long, device=device)
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
    print(args.prompt + tok.decode(new))
    return 0
