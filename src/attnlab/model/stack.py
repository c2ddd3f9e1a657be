"""A stack: blocks of one attention direction (causal or bidirectional), looped ``model.loops``
times with shared weights (a universal transformer, with a fixed sinusoidal per-loop step
signal), with the position part that acts inside attention built for that direction. A family
(``attnlab.model.families``) builds its stacks from :class:`~attnlab.parts.family.StackPlan`s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.block import Block
from attnlab.model.context import AttnContext
from attnlab.model.kv_cache import KVCache
from attnlab.model.masks import allowed_keys, stack_mask
from attnlab.model.positions import SinusoidalPositions
from attnlab.parts import Dims, Part, PositionPart
from attnlab.parts.registry import build


def parts_of(module: nn.Module) -> list[Part]:
    """The registered parts inside ``module``, outermost first, in module order."""
    return [m for m in module.modules() if isinstance(m, Part)]


def position_class(cfg: ModelConfig) -> type[PositionPart] | None:
    """The class of the configured position part (None: no positions, NoPE)."""
    return cfg.position_class


def norm(cfg: ModelConfig, dim: int | None = None) -> nn.Module:
    """The configured norm (``model.norm``) over ``dim`` features (default d_model)."""
    dims = Dims.from_config(cfg)
    return build(cfg.norm, dims if dim is None else dims.with_(d_model=dim), "norm")


class Stack(nn.Module):
    """Blocks of one attention direction (causal or bidirectional), with the part of the position
    slot that acts inside attention (a logit bias, a rotation), built for this direction."""

    def __init__(self, cfg: ModelConfig, n_layers: int, *, causal: bool, cross: bool) -> None:
        super().__init__()
        self.cfg, self.causal = cfg, causal
        cls = position_class(cfg)
        inside = cls is not None and (cls.logit_bias or cls.rotary)
        dims = Dims.from_config(cfg).with_(causal=causal)
        self.position = build(cfg.position, dims, "position") if inside else None
        self.loops = cfg.loops
        depth = n_layers * self.loops
        rates = [cfg.stochastic_depth * i / max(depth - 1, 1) for i in range(n_layers)]
        self.blocks = nn.ModuleList(Block(cfg, cross=cross, drop_path=r) for r in rates)
        # a fixed sinusoidal timestep signal per loop (Universal Transformers): no parameters, so
        # the parameter count does not depend on the number of loops
        sig = math.sqrt(2) * cfg.init_std  # per-dimension RMS = the embeddings' init std
        self.step_signal = SinusoidalPositions(cfg.d_model, scale=sig) if self.loops > 1 else None
        self.final_norm = norm(cfg) if cfg.norm_position == "pre" else None
        self._aux_parts = [
            p for p in parts_of(self) if type(p).pop_aux_losses is not Part.pop_aux_losses
        ]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints written before positions were a slot kept a relative bias as ``t5_bias``
        for key in [k for k in state_dict if k.startswith(f"{prefix}t5_bias.")]:
            state_dict[f"{prefix}position.{key[len(prefix) + 8 :]}"] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def n_slots(self) -> int:
        return len(self.blocks) * self.loops

    def context(
        self,
        T: int,
        start: int,
        device: torch.device,
        need_weights: bool,
        dtype: torch.dtype = torch.float32,
        padding: Tensor | None = None,
    ) -> AttnContext:
        a = self.cfg.attention
        q_pos = torch.arange(start, start + T, device=device)
        k_pos = torch.arange(0, start + T, device=device)
        mask = stack_mask(a, self.causal)
        simple = mask in ("causal", "bidirectional")
        if simple and start == 0:
            allowed, is_causal = None, mask == "causal"
        elif simple and T == 1:
            allowed, is_causal = None, False
        else:
            allowed, is_causal = allowed_keys(a, q_pos, k_pos, self.causal), False
        bias = rotate = None
        pos = self.position
        if pos is not None and pos.logit_bias:
            bias = pos.bias(q_pos, k_pos)
        if pos is not None and pos.rotary:
            tables = pos.rotation(q_pos, dtype)
            rotate = partial(pos.rotate, tables=tables)
        return AttnContext(
            q_pos, k_pos, allowed, is_causal, bias, rotate, start, need_weights, padding
        )

    def forward(
        self,
        x: Tensor,
        ctx: AttnContext,
        *,
        cache: KVCache | None = None,
        memory: Tensor | None = None,
        after: dict[int, Callable[[Tensor], Tensor]] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Run the blocks (``loops`` times when looped). Auxiliary losses of routed parts are
        summed over every pass into ``self.aux_loss`` (each loop counts as its own layer).
        ``after[i](x)`` is added to the residual stream after block i (retrieval's CCA)."""
        maps: list[Tensor] = []
        aux: list[Tensor] = []
        slot = 0
        for step in range(self.loops):
            if self.step_signal is not None:
                step_t = torch.tensor([step], device=x.device)
                x = x + self.step_signal(step_t).to(x.dtype)[0]
            for block in self.blocks:
                x, probs = block(x, ctx, cache=cache, slot=slot, memory=memory)
                if after is not None and slot in after:
                    x = x + after[slot](x)
                slot += 1
                if probs is not None:
                    maps.append(probs)
        for part in self._aux_parts:
            aux.extend(part.pop_aux_losses())
        self.aux_loss = torch.stack(aux).sum() if aux else None
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, maps
