"""Peak training memory per subject, each measured in a fresh Python process.

A process's peak resident set only grows, so measuring several models in one process would charge
each one with the peaks of those before it. Here every subject runs in its own child
(``python -m attnlab.bench.memory SPEC_JSON``), which imports what it needs, records its RSS, builds
the model, runs a few training steps and reports:

- CPU: ``peak_rss``, the child's high-water mark (Linux ``VmHWM``, reset after the imports through
  ``/proc/self/clear_refs`` so it covers building and training only; ``ru_maxrss`` elsewhere, which
  a forked child inherits from its parent) and ``growth`` = peak - RSS after imports (model,
  gradients, AdamW state and one step's activations);
- CUDA: ``torch.cuda.max_memory_allocated`` over those steps (tensors only, no allocator slack).

Variants that materialise the attention matrix (virtual heads, the explicit path) hold
B x H x T x T probabilities per layer for the backward pass: O(T^2 H) memory, which the table
states next to the measurement.

The child is given the subject's own config (a variant's overrides already applied, its
``plugins`` listed), not a variant name: names added in the parent (``--variant NAME:...``, a
plugin's parts) do not exist in a fresh process, and the config loads its plugins there.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import asdict, dataclass


@dataclass
class MemoryRow:
    name: str
    peak_rss_mib: float | None
    growth_mib: float | None
    cuda_max_allocated_mib: float | None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _mib(n: float) -> float:
    return n / 2**20


def _reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """Bytes: VmHWM of this process where /proc has it, else ru_maxrss (KiB on Linux)."""
    try:
        with open("/proc/self/status") as f:
            status = f.read()
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _page_in_runtime(device, dtype) -> None:
    """One tiny training step first, so lazily loaded kernels and thread pools are not charged to
    the model measured next."""
    import torch

    from attnlab.bench.training import autocast

    lin = torch.nn.Linear(64, 64).to(device)
    opt = torch.optim.AdamW(lin.parameters())
    with autocast(device, dtype):
        out = torch.nn.functional.scaled_dot_product_attention(
            *(lin(torch.randn(2, 2, 16, 64, device=device)),) * 3, is_causal=True
        )
    out.float().pow(2).mean().backward()
    opt.step()
    del lin, opt, out


def _import_peer(name: str) -> None:
    """Import a peer's code before the baseline RSS is taken: its import is not its memory."""
    from attnlab.bench import peers

    if name == "hf_gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401
    elif name == "x_transformers":
        import x_transformers  # noqa: F401
    elif name == "nanogpt":
        peers.load_nanogpt()


def probe(spec: dict) -> dict:
    """Run in the child: build the subject (``spec['kind']`` ``variant``: the model of
    ``spec['config']``; ``peer``: peer ``spec['name']`` at that config's shapes), train
    ``spec['steps']`` steps, report memory."""
    import psutil
    import torch

    from attnlab.bench.subjects import peer_subject, variant_subject
    from attnlab.bench.training import make_train_step, random_batch
    from attnlab.config import validate

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    cfg = validate(spec["config"])  # loads the config's plugins in this process
    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    peer = spec.get("kind") == "peer"
    if peer:
        _import_peer(spec["name"])
    _page_in_runtime(device, dtype)
    _reset_peak_rss()
    rss0 = psutil.Process().memory_info().rss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    name, seq_len, compile = spec["name"], spec["seq_len"], spec.get("compile", False)
    if peer:
        subject = peer_subject(name, cfg, seq_len, device, compile)
    else:
        subject = variant_subject(name, cfg, "", seq_len, device, compile)
    x, y = random_batch(cfg.model.vocab_size, spec["batch_size"], spec["seq_len"], device)
    step = make_train_step(subject, x, y, dtype)
    for _ in range(spec["steps"]):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    peak = _peak_rss()
    return {
        "peak_rss": peak,
        "rss_after_imports": rss0,
        "cuda_max_allocated": torch.cuda.max_memory_allocated(device)
        if device.type == "cuda"
        else None,
    }


def measure_memory(
    name: str,
    config: dict,
    *,
    kind: str = "variant",
    seq_len: int,
    batch_size: int,
    device: str,
    dtype: str,
    threads: int | None,
    steps: int = 2,
    compile: bool = False,
    timeout: float = 600.0,
) -> MemoryRow:
    """Peak memory of training ``name`` for ``steps`` steps, measured in a fresh process.

    ``config`` is the subject's own config: a variant's (its overrides applied), or the base
    config a peer (``kind="peer"``) is built at."""
    spec = dict(
        name=name,
        kind=kind,
        config=config,
        seq_len=seq_len,
        batch_size=batch_size,
        device=device,
        dtype=dtype,
        threads=threads,
        steps=steps,
        compile=compile,
    )
    env = dict(os.environ, PYTHONWARNINGS="ignore", TRANSFORMERS_VERBOSITY="error")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "attnlab.bench.memory", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return MemoryRow(name, None, None, None, error=f"timed out after {timeout:.0f} s")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    r = json.loads(lines[-1]) if lines else {}
    if out.returncode != 0 or not lines or "error" in r:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        why = r.get("error") or f"the measuring process failed: {tail[0]}"
        return MemoryRow(name, None, None, None, error=why[:300])
    cuda = r.get("cuda_max_allocated")
    return MemoryRow(
        name=name,
        peak_rss_mib=_mib(r["peak_rss"]),
        growth_mib=_mib(r["peak_rss"] - r["rss_after_imports"]),
        cuda_max_allocated_mib=_mib(cuda) if cuda is not None else None,
    )


def main(argv: list[str]) -> int:
    """The child: one JSON line, the measurement or ``{"error": ...}`` (exit 1)."""
    try:
        print(json.dumps(probe(json.loads(argv[0]))))
    except Exception as e:  # reported in the parent's table, the command then exits 1
        print(json.dumps({"error": f"{type(e).__name__}: {e}".replace("\n", " ")}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
