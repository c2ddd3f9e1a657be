"""Preflight: refuse, before allocating anything, a job whose memory cannot fit the device.

The estimate is a floor, not a forecast: it counts what a job must hold at once and leaves out
allocator slack, kernels' workspaces and the Python process, so a refusal is certain to be right.

* weights: ``P`` parameters (from :func:`attnlab.model.params.count`, on the meta device) at 4
  bytes (float32 master weights; inference may load them in 16 bits);
* training adds gradients (``4P``) and AdamW's two moments (``8P``);
* activations kept for backward, per token and layer: the block's inputs and outputs
  (``6d``), and the outputs of every matrix of the layer (q/k/v/attention output ``4 H d_h``,
  an MLP's ``2f``, a routed part's active experts: the layer's active parameters / d), plus the
  ``2 H T`` scores and probabilities when a part materialises the attention matrix
  (the fused kernels never form it); inference keeps one layer of these and the logits
  ``B T V`` (twice: logits and log-probabilities).

A stack deeper than :data:`DIRECT_COUNT_LAYERS` is counted at one and two layers and extrapolated
(every count is affine in the depth), so a 10^8-layer typo is refused in milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.base.errors import UserError
from attnlab.config import Config, ModelConfig
from attnlab.runs.device import device_name, torchrun_local_rank

if TYPE_CHECKING:
    from attnlab.model.params import ParamReport

#: deeper stacks are counted by extrapolation from one and two layers
DIRECT_COUNT_LAYERS = 64


class PreflightError(UserError):
    """A job that cannot fit the device's free memory; the message gives the numbers and fix."""


def fmt_bytes(n: float) -> str:
    """``1.29 TB``, ``512.0 MB``: decimal units, three significant figures."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB"):
        if abs(n) < 1000 or unit == "EB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} EB"  # pragma: no cover


# ---------------------------------------------------------------------------- parameter count


def param_count(cfg: ModelConfig) -> ParamReport:
    """:func:`attnlab.model.params.count` for any depth, or a :class:`PreflightError` when a
    weight would have more elements than a tensor can index (int64)."""
    from attnlab.model.params import ParamReport, count

    def at(layers: int, dec: int | None) -> ParamReport:
        c = cfg.model_copy(update={"n_layers": layers, "n_decoder_layers": dec})
        try:
            return count(c)
        except (RuntimeError, OverflowError, TypeError) as e:  # torch: "... overflow ..."
            if "overflow" not in str(e).lower():
                raise
            raise PreflightError(
                f"the model is too large to exist: one of its weights would need more bytes than "
                f"a tensor can address (model.d_model={cfg.d_model}, model.vocab_size="
                f"{cfg.vocab_size}, FFN hidden {cfg.ffn_hidden}); use realistic widths"
            ) from None

    _check_widths(cfg)
    dec = cfg.n_decoder_layers
    if cfg.n_layers + (dec or 0) <= DIRECT_COUNT_LAYERS:
        return at(cfg.n_layers, dec)
    base = at(1, 1 if dec else dec)
    steps = [(cfg.n_layers - 1, at(2, 1 if dec else dec))]
    if dec:
        steps.append((dec - 1, at(1, 2)))
    return _extrapolate(base, steps, ParamReport)


def _num(n: int) -> str:
    return f"{n:,}" if n < 10**15 else f"{n:.3g}"


def _check_widths(cfg: ModelConfig) -> None:
    """Refuse widths whose weight matrices no tensor can hold, before torch is asked to."""
    d = cfg.d_model
    widths = {
        "model.vocab_size": cfg.vocab_size,
        "FFN hidden": cfg.ffn_hidden,
        "model.max_seq_len": cfg.max_seq_len,
        "attention width": cfg.attention.n_heads * cfg.head_dim,
    }
    # a part's numeric options may set widths (an int) or multiples of d_model (a float)
    for slot, opts in cfg.slots().items():
        for name, value in opts.model_dump().items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                n = int(min(abs(value) * d, 2**63)) if isinstance(value, float) else abs(value)
                widths[f"model.{slot}.{name}"] = n
    for name, n in widths.items():
        if n * d * 8 > 2**63 - 1:
            raise PreflightError(
                f"the model is too large to exist: {name} {_num(n)} x model.d_model {_num(d)} is "
                "more than a tensor can hold; use realistic sizes"
            )


def _extrapolate(
    base: ParamReport, steps: list[tuple[int, ParamReport]], report_type: type
) -> ParamReport:
    """``base + sum(k * (r - base))`` for every integer field of a :class:`ParamReport`."""
    values = {}
    for f in fields(report_type):
        v = getattr(base, f.name)
        if isinstance(v, int):
            values[f.name] = v + sum(k * (getattr(r, f.name) - v) for k, r in steps)
        elif isinstance(v, dict):
            keys = set(v).union(*(getattr(r, f.name) for _, r in steps))
            out = {
                p: v.get(p, 0)
                + sum(k * (getattr(r, f.name).get(p, 0) - v.get(p, 0)) for k, r in steps)
                for p in keys
            }
            values[f.name] = dict(sorted(out.items(), key=lambda kv: -kv[1]))
        else:
            values[f.name] = getattr(steps[0][1], f.name)
    return replace(base, **values)


# ------------------------------------------------------------------------------- free memory


def _cgroup_free() -> int | None:
    """Bytes left under a cgroup (v2, then v1) memory limit, if the process has one."""
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            lim = Path(limit).read_text().strip()
            used = int(Path(usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if lim.isdigit() and int(lim) < 2**60:
            return max(0, int(lim) - used)
    return None


def _address_space_free() -> int | None:
    """Bytes of address space left under ``RLIMIT_AS`` (``ulimit -v``), if the process has one:
    the soft limit less what the process maps already (``VmSize``). Allocations past it fail
    however much RAM is free."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    mapped = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        mapped = 0
    return max(0, soft - mapped)


def _ram_free() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    return 0


def host_free() -> tuple[int, str]:
    """(bytes this process can still allocate on the host, what bounds it): the smallest of the
    available RAM, the cgroup's memory limit and the address-space limit (``ulimit -v``); 0 when
    none can be known."""
    bounds = [
        (_ram_free(), "available RAM"),
        (_cgroup_free(), "the cgroup's memory limit"),
        (_address_space_free(), "the address-space limit, ulimit -v"),
    ]
    known = [(n, why) for n, why in bounds if n is not None and (n > 0 or "limit" in why)]
    return min(known, key=lambda b: b[0]) if known else (0, "")


def _host_free() -> int:
    return host_free()[0]


def free_memory(device: str) -> int | None:
    """Free bytes where ``device`` allocates: the GPU's (``mem_get_info``) or the host's
    available memory (cgroup limit included); None when it cannot be known."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        index = device.partition(":")[2]
        idx = int(index) if index.isdigit() else (torchrun_local_rank() or 0)
        try:
            return int(torch.cuda.mem_get_info(idx)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.startswith("cpu"):
        return _host_free() or None
    return None  # mps and others: no reliable figure


# ---------------------------------------------------------------------------------- estimates


@dataclass
class Estimate:
    """Bytes a job must hold at once, by item (item -> (bytes, how it was computed))."""

    what: str
    device: str
    items: dict[str, tuple[float, str]] = field(default_factory=dict)
    knobs: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(b for b, _ in self.items.values())

    def largest(self) -> str:
        return max(self.items, key=lambda k: self.items[k][0])


def _depth(m: ModelConfig) -> int:
    return m.n_layers * m.loops + (m.n_decoder_layers or 0)


def _per_token_layer(m: ModelConfig, seq_len: int) -> int:
    """Activation elements per token and layer (module docstring): the outputs of the layer's
    matrices, read from the parts' active parameters (a d x k matrix makes k outputs per token),
    plus the attention tensors and the norms' inputs."""
    attn = m.attention.n_heads * m.head_dim
    layers = m.n_layers + (m.n_decoder_layers or 0)
    widths = param_count(m).active_non_embedding // max(layers, 1) // m.d_model
    ffn = widths - 4 * attn  # beyond the baseline's four d x d projections
    scores = 2 * m.attention.n_heads * seq_len
    materialised = m.needs_attention_matrix or m.attention.backend == "math"
    parts = sum(_part_elements(m, seq_len).values())
    return 6 * m.d_model + 4 * attn + ffn + (scores if materialised else 0) + parts


def _part_elements(m: ModelConfig, seq_len: int) -> dict[str, int]:
    """slot -> the elements per token and layer its part declares (non-zero ones only)."""
    from attnlab.parts import registry
    from attnlab.parts.part import Dims

    dims = Dims.from_config(m)
    out = {}
    for slot, opts in m.slots().items():
        spec = registry.get(slot, opts.kind)
        if spec.kind == "none":
            continue
        n = int(spec.cls.activation_elements(opts, dims, seq_len))
        if n:
            out[slot] = n
    return out


def _part_knobs(m: ModelConfig, seq_len: int) -> str:
    """``, or model.score.kernel_size=1000000``: the size options of the parts that add
    activations, for the advice of a refusal."""
    slots = m.slots()
    names = [
        f"model.{slot}.{k}={v}"
        for slot in _part_elements(m, seq_len)
        for k, v in slots[slot].model_dump().items()
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    return f", or {', '.join(names)}" if names else ""


def _weights_item(m: ModelConfig, bytes_per: int) -> tuple[int, tuple[float, str]]:
    n = param_count(m).total
    return n, (float(n) * bytes_per, f"{n:,} parameters x {bytes_per} bytes")


def training_estimate(
    cfg: Config, *, batch_size: int | None = None, seq_len: int | None = None, device: str = "cpu"
) -> Estimate:
    """Weights, gradients, AdamW moments and activations of one micro-batch of ``cfg``."""
    m, t = cfg.model, cfg.train
    b = batch_size or t.batch_size
    T = seq_len or cfg.data.seq_len
    act_bytes = 2 if device.startswith("cuda") and t.dtype in ("auto", "bfloat16", "float16") else 4
    shard = int(os.environ.get("WORLD_SIZE", "1")) if t.parallel == "fsdp" else 1
    n, weights = _weights_item(m, 4)
    per = 4 * n / max(shard, 1)
    depth = _depth(m)
    acts = float(b) * T * (depth * _per_token_layer(m, T) + 4 * m.d_model) * act_bytes
    est = Estimate("training", device)
    est.items["parameters"] = (per, weights[1])
    est.items["gradients"] = (per, "one float32 per parameter")
    est.items["AdamW moments"] = (2 * per, "two float32 states per parameter")
    est.items["activations"] = (
        acts,
        f"batch {b} x {T} tokens x {depth} layers, {act_bytes}-byte values",
    )
    est.items["token batch"] = (float(b) * T * 8 * 2, "int64 inputs and targets")
    est.knobs = {
        "parameters": _model_knobs(m),
        "gradients": _model_knobs(m),
        "AdamW moments": _model_knobs(m),
        "activations": (
            "lower train.batch_size (train.tokens_per_step keeps the tokens per step through "
            "gradient accumulation), data.seq_len or model.n_layers" + _part_knobs(m, T)
        ),
        "token batch": "lower train.batch_size or data.seq_len",
    }
    return est


def run_weight_bytes(run_dir: str | Path) -> int | None:
    """Size of the newest checkpoint's weights file of a run (what loading it costs), if any."""
    from attnlab.runs.checkpoint import MODEL_FILE, complete_checkpoints

    for _, path in complete_checkpoints(Path(run_dir)):
        try:
            return (path / MODEL_FILE).stat().st_size
        except OSError:
            continue
    return None


def inference_estimate(
    m: ModelConfig,
    *,
    batch_size: int,
    seq_len: int,
    device: str = "cpu",
    weights_bytes: float | None = None,
) -> Estimate:
    """Weights (``weights_bytes``, e.g. :func:`run_weight_bytes`, else counted at float32) plus
    one layer's activations and the logits of a ``batch_size x seq_len`` batch."""
    if weights_bytes is None:
        _, weights = _weights_item(m, 4)
    else:
        weights = (float(weights_bytes), "the checkpoint's weights file")
    est = Estimate("inference", device)
    est.items["parameters"] = weights
    est.items["logits"] = (
        float(batch_size) * seq_len * m.vocab_size * 4 * 2,
        f"batch {batch_size} x {seq_len} tokens x {m.vocab_size:,} vocabulary x 2 float32",
    )
    est.items["activations"] = (
        float(batch_size) * seq_len * _per_token_layer(m, seq_len) * 4,
        f"one layer of batch {batch_size} x {seq_len} tokens",
    )
    est.knobs = {
        "parameters": _model_knobs(m),
        "logits": "lower the batch size (--batch-size) or the context (--max-length)",
        "activations": "lower the batch size (--batch-size) or the context (--max-length)"
        + _part_knobs(m, seq_len),
    }
    return est


def _model_knobs(m: ModelConfig) -> str:
    return (
        f"shrink the model: model.d_model={m.d_model}, model.n_layers={m.n_layers}, "
        f"model.vocab_size={m.vocab_size}, FFN hidden {m.ffn_hidden}"
    )


def check(est: Estimate, free: int | None = None, command: str = "this job") -> Estimate:
    """Raise :class:`PreflightError` when ``est`` exceeds the free memory of its device."""
    if free is None:
        free = free_memory(est.device)
    if free is None or est.total <= free:
        return est
    bound = host_free()[1] if est.device.startswith("cpu") else ""
    lines = [
        f"{command} needs at least {fmt_bytes(est.total)} of memory on {est.device} for "
        f"{est.what}, but {fmt_bytes(free)} is free" + (f" ({bound})" if bound else "") + ":"
    ]
    for name, (n, how) in sorted(est.items.items(), key=lambda kv: -kv[1][0]):
        if n >= 0.01 * est.total:
            lines.append(f"  {name:<14} {fmt_bytes(n):>10}  ({how})")
    lines.append(f"To fit: {est.knobs.get(est.largest(), 'use a smaller configuration')}")
    raise PreflightError("\n".join(lines))


def check_concurrent(
    configs: list[Config], concurrent: int, command: str, device: str | None = None
) -> None:
    """``concurrent`` trainings at once (``compare --jobs``): the largest estimate times the
    number running together, against one device's free memory (one GPU each when several)."""
    if not configs:
        return
    dev = device_name(device or configs[0].train.device, setting="train.device")
    ests = [training_estimate(c, device=dev) for c in configs]
    est = max(ests, key=lambda e: e.total)
    n = max(1, concurrent)
    if dev.startswith("cuda"):
        import torch

        n = max(1, -(-n // max(1, torch.cuda.device_count())))
    if n > 1:
        est.items = {k: (b * n, f"{how}; x{n} runs at once") for k, (b, how) in est.items.items()}
        est.knobs = {k: f"{v}, or lower --jobs" for k, v in est.knobs.items()}
    check(est, command=command)


def check_training(cfg: Config, command: str = "attnlab train", **kw) -> Estimate:
    """:func:`training_estimate` of ``cfg`` on its ``train.device``, checked (with its thread
    count)."""
    from attnlab.base.devices import check_threads

    check_threads(cfg.train.threads, "train.threads")
    device = device_name(kw.pop("device", None) or cfg.train.device, setting="train.device")
    return check(training_estimate(cfg, device=device, **kw), command=command)
