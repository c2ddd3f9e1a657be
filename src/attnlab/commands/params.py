"""attnlab params: parameter counts of a preset or config file, from the config alone."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnlab.base import exitcodes
from attnlab.commands._common import add_config_arguments, config_from_args

NAME = "params"
HELP = "Count parameters (total, non-embedding, per part) and K/V-cache bytes per token."


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _m(n: int) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 10_000 else f"{n:,}"


def run(args: argparse.Namespace) -> int:
    from attnlab.runs.preflight import param_count

    cfg = config_from_args(args)
    rep = param_count(cfg.model)  # count(), extrapolated for very deep stacks
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
        return exitcodes.OK
    table = Table(title=f"{escape(args.config)}: parameters by part")  # a path, as text
    table.add_column("part")
    table.add_column("params", justify="right")
    table.add_column("exact", justify="right")
    table.add_column("share of non-emb.", justify="right")
    for part, n in rep.by_part.items():
        emb = part in ("embedding", "position", "lm_head")
        share = "" if emb else f"{100 * n / max(rep.non_embedding, 1):.1f}%"
        table.add_row(escape(part), _m(n), f"{n:,}", share)
    con = Console()
    con.print(table)
    con.print(f"total                      {_m(rep.total):>10}  ({rep.total:,})")
    con.print(f"non-embedding              {_m(rep.non_embedding):>10}  ({rep.non_embedding:,})")
    if rep.active_non_embedding != rep.non_embedding:
        con.print(f"active non-embedding/token {_m(rep.active_non_embedding):>10}")
    con.print(f"KV cache per token (16-bit) {rep.kv_cache_bytes_per_token:,} bytes")
    con.print(
        f"forward FLOPs per token     {rep.flops_per_token / 1e6:,.1f}M at T={cfg.model.max_seq_len}"
    )
    for note in rep.notes:
        con.print(f"note: {note}", markup=False)
    return exitcodes.OK
