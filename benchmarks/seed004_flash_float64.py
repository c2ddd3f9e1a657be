"""The float64 half of the seed004-flash research check (issue 14): train the materialised and the
fused virtual heads side by side in float64 and compare their losses step by step.

    python benchmarks/seed004_flash_float64.py [--steps 30] [--variant fused]

Both models are built from ``configs/experiments/seed004-flash.toml``'s base config (its
``--set`` overrides for the fused variant), with the same seed, so they start from the same
weights; each step trains both on the same batch (uniform random bytes, a fixed generator) with
AdamW at the experiment's peak learning rate. Prints the largest |loss difference| over the steps
and the two losses at the first and last step. The float32 half is ``attnlab compare`` on the
experiment file itself (losses within seed noise; see the experiment's report).
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--variant", default="fused", help="the fused variant of the experiment")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import torch

    from attnlab.experiments import load_experiment
    from attnlab.model import build_model

    torch.set_num_threads(args.threads)
    exp = load_experiment("configs/experiments/seed004-flash.toml")
    ref_cfg = exp.variants["materialised"].config
    fused_cfg = exp.variants[args.variant].config
    models, opts = [], []
    for cfg in (ref_cfg, fused_cfg):
        torch.manual_seed(0)
        m = build_model(cfg.model).to(torch.float64).train()
        models.append(m)
        opts.append(torch.optim.AdamW(m.parameters(), lr=cfg.train.lr, betas=(0.9, 0.95)))
    gen = torch.Generator().manual_seed(0)
    B, T, V = ref_cfg.train.batch_size, ref_cfg.data.seq_len, ref_cfg.model.vocab_size
    worst, first, last, times = 0.0, None, None, [0.0, 0.0]
    for _ in range(args.steps):
        ids = torch.randint(0, V, (B, T + 1), generator=gen)
        losses = []
        for i, (m, opt) in enumerate(zip(models, opts, strict=True)):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = m(ids[:, :-1], ids[:, 1:]).loss
            loss.backward()
            opt.step()
            times[i] += time.perf_counter() - t0
            losses.append(loss.item())
        first = first or losses
        last = losses
        worst = max(worst, abs(losses[0] - losses[1]))
    print(f"float64, {args.steps} AdamW steps, materialised vs {args.variant}:")
    print(f"  step 1 losses   {first[0]:.15f} {first[1]:.15f}")
    print(f"  step {args.steps} losses  {last[0]:.15f} {last[1]:.15f}")
    print(f"  max |loss difference| over the steps: {worst:.3e}")
    print(f"  time: materialised {times[0]:.1f} s, {args.variant} {times[1]:.1f} s")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
