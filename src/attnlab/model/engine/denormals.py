"""Flush float32 denormals to zero on CPU, on every intra-op thread.

A bias or fold sends the logits of far keys 87-104 below their row's maximum, where exp lands in
float32's denormal range, which x86 computes about 100 times slower (measured: causal ALiBi's
SDPA backward 2.8x the baseline with denormals, 1.5x without). A weight below 1.2e-38 is 0
either way. ``torch.set_flush_denormal`` sets the flag (MXCSR's FTZ/DAZ) on the calling thread
only; torch's intra-op threads are an OpenMP team, each with its own flag, so with 2 threads
half of every kernel still ran on denormals (measured: ALiBi's whole-model step 1.74x the
baseline, 2 threads). So the flag is also set inside one OpenMP parallel region of torch's own
``libgomp`` (whose threads torch's kernels reuse; threads created later inherit the flag from
the thread that creates them, as POSIX threads inherit the floating-point environment).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

log = logging.getLogger("attnlab.attention")
_done: list[int] = []


def _every_omp_thread(threads: int, on: bool = True) -> bool:
    """Run ``torch.set_flush_denormal(on)`` on each thread of torch's OpenMP team (False when
    torch has no bundled libgomp, e.g. another platform's build)."""
    lib = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    if not lib.exists():
        return False
    gomp = ctypes.CDLL(str(lib))  # the instance torch already loaded (same file)
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: torch.set_flush_denormal(on))
    gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    gomp.GOMP_parallel(ctypes.cast(callback, ctypes.c_void_p), None, threads, 0)
    return True


def flush_denormals() -> None:
    """Denormals flushed on this thread and torch's intra-op threads, once per thread count,
    logged."""
    threads = torch.get_num_threads()
    if threads in _done:
        return
    _done.append(threads)
    torch.set_flush_denormal(True)
    every = threads > 1 and _every_omp_thread(threads)
    where = f"on {threads} intra-op threads" if every else "on the calling thread"
    log.info(f"attention engine: float32 denormals flushed to zero on CPU {where} (flush_denormal)")


def reset_denormals() -> None:
    """Back to torch's default (denormals kept) on every thread this module flushed, so that a
    model built later in the same process (compare's next run, its evaluation) computes as in a
    fresh process, whatever ran before it. Does nothing where nothing was flushed (a baseline's
    process never sets the flag)."""
    if not _done:
        return
    torch.set_flush_denormal(False)
    for threads in _done:
        if threads > 1:
            _every_omp_thread(threads, on=False)
    _done.clear()
