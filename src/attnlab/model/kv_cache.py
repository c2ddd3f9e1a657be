"""A preallocated key/value cache for incremental decoding.

Per layer it holds K and V of shape [B, H_kv, max_len, d_h]; cost 2 * L * H_kv * d_h elements per
token. Parts that act before or after attention (pre-projection, content skip, nonlinear query,
identity head) add nothing to it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class KVCache:
    """Keys and values for ``n_slots`` attention layers (loops of a universal layer count apart)."""

    def __init__(
        self,
        n_slots: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_slots)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_slots)]
        self.max_len = max_len
        self.length = 0
        self.cross: dict[int, tuple[Tensor, Tensor]] = {}
        #: what a family keeps across decoding steps besides keys and values (retrieval: the
        #: encoded neighbours of each completed chunk, each CCA layer's keys and values of them)
        self.store: dict[str, Any] = {}

    def update(self, slot: int, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Write k, v at positions [start, start+T) and return all keys/values up to there."""
        end = start + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; asked for {end}")
        T = k.shape[2]
        kc, vc = self.k[slot], self.v[slot]
        kc.narrow(2, start, T).copy_(k)
        vc.narrow(2, start, T).copy_(v)
        return kc.narrow(2, 0, end), vc.narrow(2, 0, end)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)
