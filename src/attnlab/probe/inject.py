"""Inject registered parts into a transformers causal LM (the frozen probe of seed 000).

Per decoder layer, with x^ the attention module's input (the layer's Norm(x)), one hook per slot:

- a ``feature_map`` part (pre-projection): a forward pre-hook on the attention module replaces x^
  by x~ = F(x^), so Q, K and V (however the module computes them) read x~;
- a ``side_branch`` part (content skip): a forward hook on the attention module adds S(x~) to its
  output. In a sequential block that is x + attn + S(x~) before the MLP's norm, as in the seed; in
  GPT-NeoX's parallel block it is x + attn + mlp + S(x~);
- a ``query`` part with ``pretrained_delta`` (anchored query): a forward hook on the q projection
  adds the part's delta to the query columns only, e.g. q = u W_Q + f(u) with f's LN affine at 0.

Only hooks are used (no forward method is replaced), so the base's own code, caches, attention
kernels and gradient checkpointing (hooks re-run in the recompute) work unchanged. The parts live in
one ``ModuleList`` attached to the model as ``attnlab_probe`` (so ``.to()`` and ``.parameters()``
see them); :meth:`Injection.remove` takes hooks and parts away and leaves the base as it was.
Cost per layer: pre-projection 2 e d^2 params, 4 e d^2 FLOPs/token; skip d^2, 2 d^2; anchored query
2 d r + O(d), 4 d r. No K/V-cache cost: cached keys and values keep the base's shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from attnlab.base.errors import UserError
from attnlab.base.params import n_params
from attnlab.parts import Dims, Init, Part, QueryPart
from attnlab.parts.registry import build
from attnlab.probe.arch import ArchSpec, QLayout, add_to_q, arch_of, dims_of
from attnlab.probe.config import ProbeConfig
from attnlab.probe.methods import Component, Method, parse_method

ATTR = "attnlab_probe"


def _run(part: nn.Module, x: Tensor) -> Tensor:
    """``part(x)`` in the part's own dtype (float32 master weights), returned in ``x``'s dtype."""
    dtype = next(part.parameters()).dtype
    return part(x.to(dtype)).to(x.dtype)


class ProbeLayer(nn.Module):
    """The parts injected into one attention block, one per slot (any of them may be absent)."""

    def __init__(self, dims: Dims, components: list[Component], cfg: ProbeConfig) -> None:
        super().__init__()
        self.feature_map: Part | None = None
        self.side_branch: Part | None = None
        self.query: QueryPart | None = None
        for comp in components:
            setattr(self, comp.slot, build(cfg.part_options(comp), dims, comp.slot))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Each part's declared init at the default std, outputs too (its own options may set
        another)."""
        for part in self.parts():
            part.init_weights(Init())

    def x_tilde(self, x_hat: Tensor) -> Tensor:
        return x_hat if self.feature_map is None else _run(self.feature_map, x_hat)

    def parts(self) -> list[Part]:
        """The injected parts of this layer."""
        return [p for p in (self.feature_map, self.side_branch, self.query) if p is not None]

    def stats(self) -> dict[str, float]:
        """The parts' declared layer statistics (``Part.layer_stats``)."""
        out: dict[str, float] = {}
        for part in self.parts():
            out.update(part.layer_stats())
        return out


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _feature_map_hook(layer: ProbeLayer) -> Callable:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (layer.x_tilde(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": layer.x_tilde(kwargs["hidden_states"])}

    return hook


def _side_branch_hook(layer: ProbeLayer) -> Callable:
    assert layer.side_branch is not None
    skip = layer.side_branch

    def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        # the forward's arguments after the pre-hook: x~ with a pre-projection, else x^
        extra = _run(skip, _hidden(args, kwargs))
        if isinstance(output, tuple):
            return (output[0] + extra, *output[1:])
        return output + extra

    return hook


def _q_slice(out: Tensor, layout: QLayout, d_q: int, n_heads: int) -> Tensor:
    if layout == "whole":
        return out
    if layout == "first":
        return out[..., :d_q]
    per_head = out.view(*out.shape[:-1], n_heads, -1)
    return per_head[..., : d_q // n_heads].reshape(*out.shape[:-1], d_q)


def _query_hook(layer: ProbeLayer, layout: QLayout, dims: Dims) -> Callable:
    assert layer.query is not None
    part = layer.query
    dtype = next(part.parameters()).dtype

    def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        u = args[0]
        q_base = _q_slice(output, layout, dims.d_q, dims.n_heads)
        delta = part.pretrained_delta(u.to(dtype), q_base.to(dtype)).to(output.dtype)
        return add_to_q(output, delta, layout, dims.n_heads)

    return hook


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


class Injection:
    """Handle on the injected parts: their parameters, adapter state, layer statistics, and
    removal."""

    def __init__(
        self,
        host: nn.Module,
        spec: ArchSpec,
        dims: Dims,
        method: Method,
        layers: nn.ModuleList,
        handles: list[RemovableHandle],
    ) -> None:
        self.host, self.spec, self.dims, self.method = host, spec, dims, method
        self.layers = layers
        self._handles = handles

    @property
    def active(self) -> bool:
        return getattr(self.host, ATTR, None) is self.layers

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.layers.parameters()

    def num_parameters(self) -> int:
        return n_params(self.layers)

    def state_dict(self) -> dict[str, Tensor]:
        """The adapter: only the injected tensors, keyed ``<layer>.<part>.<tensor>``."""
        return {k: v.detach() for k, v in self.layers.state_dict().items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        try:
            self.layers.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise UserError(
                f"the adapter weights do not fit this base/method ({str(e)[:400]}); load them onto "
                "the base and method they were trained with"
            ) from None

    def layer_stats(self) -> dict[str, list[float | None]]:
        """Every statistic the injected parts declare (``Part.layer_stats``, e.g. the content
        skip's ||W_skip||_F): key -> one value per layer (None where a layer lacks it)."""
        per_layer = [layer.stats() for layer in self.layers]
        keys = list(dict.fromkeys(k for stats in per_layer for k in stats))
        return {k: [_float(stats.get(k)) for stats in per_layer] for k in keys}

    def layer_stats_doc(self) -> dict[str, str]:
        """Per statistic, its part's sentence on what it measures (``Part.layer_stats_doc``)."""
        out: dict[str, str] = {}
        if len(self.layers):
            for part in self.layers[0].parts():
                out.update(type(part).layer_stats_doc(part.opts, self.dims.d_model))
        return out

    def remove(self) -> None:
        """Detach every hook and part; the base computes exactly what it did before."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.active:
            delattr(self.host, ATTR)

    def __enter__(self) -> Injection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def unwrap(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def inject(model: nn.Module, method: Method | str, cfg: ProbeConfig | None = None) -> Injection:
    """Attach ``method``'s attnlab parts (e.g. pre-projection, content skip, anchored query) to
    every attention block of ``model`` (a transformers causal LM, possibly wrapped by PEFT).

    The parts are created in float32 on the device of each layer's weights. LoRA is not handled
    here (see :mod:`attnlab.probe.lora`); a method with only LoRA injects nothing.
    """
    method = parse_method(method) if isinstance(method, str) else method
    cfg = cfg or ProbeConfig()
    host = unwrap(model)
    if getattr(host, ATTR, None) is not None:
        raise UserError("this model already carries an attnlab probe injection; remove it first")
    spec, dims = arch_of(host), dims_of(host)
    blocks = spec.layer_list(host)
    layers = nn.ModuleList()
    handles: list[RemovableHandle] = []
    for block in blocks:
        device = next(block.parameters()).device
        layer = ProbeLayer(dims, method.injects, cfg).to(device)
        layers.append(layer)
        attn = spec.attention_of(block)
        if layer.feature_map is not None:
            handles.append(
                attn.register_forward_pre_hook(_feature_map_hook(layer), with_kwargs=True)
            )
        if layer.side_branch is not None:
            handles.append(attn.register_forward_hook(_side_branch_hook(layer), with_kwargs=True))
        if layer.query is not None:
            q_module = getattr(attn, spec.q_module)
            handles.append(q_module.register_forward_hook(_query_hook(layer, spec.q_layout, dims)))
    setattr(host, ATTR, layers)
    return Injection(host, spec, dims, method, layers, handles)


def injected_count(dims: Dims, method: Method, cfg: ProbeConfig | None = None) -> int:
    """Parameters ``method``'s attnlab parts add to a base of shape ``dims`` (LoRA excluded),
    counted on one layer built on the meta device: exact for any options, no memory used."""
    if not method.injects:
        return 0
    with torch.device("meta"):
        layer = ProbeLayer(dims, method.injects, cfg or ProbeConfig())
    return dims.n_layers * n_params(layer)
