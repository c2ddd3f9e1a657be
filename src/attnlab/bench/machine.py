"""What machine a benchmark ran on, and its peak FLOP/s: measured now, and the datasheet's.

MFU = training FLOPs per second / peak. The *measured* peak is the best dense square matmul this
device runs right now in the compute dtype (``attnlab.runs.peak``, taken over a few sizes), so MFU
speaks about the model code on this machine as configured (threads, clocks, load). On a GPU the
*datasheet* peak is reported beside it, with the SKU it assumed, because that is what papers quote;
nanoGPT divides by a hard-coded A100 figure (312 TFLOP/s bf16), which reads 104% on an H100.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnlab.runs.peak import measure_peak_flops

#: dense (no sparsity) tensor-core peaks in FLOP/s for 16-bit inputs, by SKU; the first pattern
#: that matches torch.cuda.get_device_name() wins, so more specific names come first.
DATASHEET_BF16: tuple[tuple[str, str, float], ...] = (
    (r"H200", "H200 SXM (bf16 dense 989 TFLOP/s)", 989e12),
    (r"H100.*PCIe", "H100 PCIe (bf16 dense 756 TFLOP/s)", 756e12),
    (r"H100.*NVL", "H100 NVL (bf16 dense 835 TFLOP/s)", 835e12),
    (r"H100", "H100 SXM (bf16 dense 989 TFLOP/s)", 989e12),
    (r"GH200", "GH200 (bf16 dense 989 TFLOP/s)", 989e12),
    (r"A100", "A100 (bf16 dense 312 TFLOP/s)", 312e12),
    (r"L40S", "L40S (bf16 dense 362 TFLOP/s)", 362e12),
    (r"L4\b", "L4 (bf16 dense 121 TFLOP/s)", 121e12),
    (r"A10\b", "A10 (bf16 dense 125 TFLOP/s)", 125e12),
    (r"4090", "RTX 4090 (bf16 dense 165 TFLOP/s, fp32 accumulate)", 165e12),
)


def datasheet_peak(device_name: str, dtype: torch.dtype) -> tuple[str, float] | None:
    """(assumed SKU, FLOP/s) for 16-bit matmuls on a known GPU; None for CPUs, fp32, or unknown."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    for pattern, sku, flops in DATASHEET_BF16:
        if re.search(pattern, device_name):
            return sku, flops
    return None


def measured_peak(device: torch.device | str, dtype: torch.dtype, iters: int = 5) -> float:
    """Best dense-matmul FLOP/s over a few square sizes (larger ones reach closer to the ceiling).

    ``attnlab.runs.peak`` caches per (device, dtype, n, iters, threads); a different ``iters``
    takes a fresh measurement (the runner measures again after training, when load may differ).
    """
    device = torch.device(device)
    sizes = (4096, 8192) if device.type == "cuda" else (512, 1024)
    return max(measure_peak_flops(device, dtype, n=n, iters=iters) for n in sizes)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def _git_commit() -> str | None:
    """The attnlab checkout's commit: from the package's folder (editable install) or the working
    directory, and only from a repository that holds ``src/attnlab`` (a non-editable install sits
    in site-packages, which may be inside some other repository, e.g. a pyenv checkout)."""
    for where in (Path(__file__).resolve().parent, Path.cwd()):
        try:
            out = subprocess.run(
                ["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
                cwd=where,
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        lines = out.stdout.split()
        if out.returncode == 0 and len(lines) == 2 and (Path(lines[0]) / "src/attnlab").is_dir():
            return lines[1]
    return None


@dataclass
class MachineInfo:
    """The facts a result file records about where and how it was measured."""

    device: str
    device_name: str
    hostname: str
    date: str
    torch_version: str
    python_version: str
    threads: int
    cpu_count: int | None
    dtype: str
    compile: bool
    load_average_start: tuple[float, float, float] | None
    git_commit: str | None
    peak_flops_measured: float
    peak_flops_samples: list[float]
    datasheet_sku: str | None
    peak_flops_datasheet: float | None

    def to_dict(self) -> dict:
        return asdict(self)

    def slug(self) -> str:
        """``cpu-<cpu-model>-<date>`` / ``cuda-<gpu-name>-<date>`` for result file names."""
        name = re.sub(r"[^a-z0-9]+", "-", self.device_name.lower()).strip("-") or self.hostname
        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        name = re.sub(r"^(nvidia-)", "", name)[:40].strip("-")
        return f"{kind}-{name}-{self.date[:10]}"


def machine_info(device: torch.device | str, dtype: torch.dtype, compile: bool) -> MachineInfo:
    """Describe this machine and measure its matmul peak in ``dtype`` (about a second)."""
    device = torch.device(device)
    name = device_name(device)
    sheet = datasheet_peak(name, dtype) if device.type == "cuda" else None
    peak = measured_peak(device, dtype)
    return MachineInfo(
        device=str(device),
        device_name=name,
        hostname=socket.gethostname(),
        date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        dtype=str(dtype).removeprefix("torch."),
        compile=compile,
        load_average_start=load_average(),
        git_commit=_git_commit(),
        peak_flops_measured=peak,
        peak_flops_samples=[peak],
        datasheet_sku=sheet[0] if sheet else None,
        peak_flops_datasheet=sheet[1] if sheet else None,
    )
