"""``attnlab inspect RUN [RUN2] --prompt TEXT | --data-dir DIR --index N --out PAGE.html``:
one self-contained HTML page of what each layer, head and part does on one prompt."""

from __future__ import annotations

import argparse

from attnlab.base import exitcodes
from attnlab.commands._common import add_trust_argument

NAME = "inspect"
HELP = (
    "look inside one model (or two, side by side) on a prompt: attention per layer and head, "
    "the mask, per-token loss and predictions, each part's own quantities (one HTML file)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "targets",
        nargs="+",
        metavar="RUN",
        help="a run directory, checkpoint, probe directory, exported folder or hf:DIR; a second "
        "one is shown side by side, with the difference of their maps",
    )
    p.add_argument("--prompt", default=None, help="the text to look at")
    p.add_argument(
        "--data-dir", default=None, metavar="DIR", help="or: prepared data (attnlab data)"
    )
    p.add_argument("--index", type=int, default=0, metavar="N", help="which validation window")
    p.add_argument(
        "--length", type=int, default=64, metavar="L", help="tokens per --data-dir window"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=128,
        metavar="M",
        help="positions drawn (the last M of a longer prompt; the rest is summarised)",
    )
    p.add_argument("--out", required=True, metavar="PAGE.html", help="the page to write")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier page of attnlab's at --out (never a file it did not write, "
        "nor one edited since)",
    )
    add_trust_argument(p)


def run(args: argparse.Namespace) -> int:
    from attnlab.base.errors import UserError
    from attnlab.inspection import inspect_targets

    if len(args.targets) > 2:
        raise UserError(f"attnlab inspect takes one or two runs, got {len(args.targets)}")
    if args.length < 1:
        raise UserError("--length must be at least 1")
    path, caps = inspect_targets(
        args.targets,
        args.out,
        prompt=args.prompt,
        data_dir=args.data_dir,
        index=args.index,
        length=args.length,
        max_tokens=args.max_tokens,
        trust_remote_code=args.trust_remote_code,
        force=args.force,
    )
    for c in caps:
        views = sum(len(lv.maps) for lv in c.layers)
        print(
            f"{c.name}: {c.n_tokens} tokens ({len(c.tokens)} shown), {len(c.layers)} attention "
            f"calls, {views} maps, {len(c.parts)} parts with views"
        )
        for n in c.notes:
            print(f"  note: {n}")
    print(f"wrote {path}")
    return exitcodes.OK
