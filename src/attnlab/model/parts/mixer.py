"""Head mixing: concatenated head outputs [.., n_in] -> d.

- linear:    o W_O                                   params n_in * d (+ d)
- nonlinear: W_b act(W_a o) (seed 004): an MLP whose hidden width m is chosen so that its params
  equal W_O's plus those of the MLP blocks removed from the layer:
  m = (n_in*d + P_mlp) / (n_in + d) (biases included when the model has them), P_mlp = the
  removed FFN block's params with its norm. FLOPs 2m(n_in + d)/token.
  In training and prefill it multiplies with W_a, W_b zero-padded to a hidden width that is a
  multiple of 16 (``HIDDEN_MULTIPLE``): the padded units have zero input and output weights, so
  the output and the gradients are those of the m-unit MLP, and the matmuls get a shape the CPU's
  GEMM kernels run faster (m = 1100 -> 1104 at d = 256: W_a's forward 8% faster on one thread,
  at 0.4% more FLOPs).
Both end in the branch's output projection, initialised N(0, out_std).
"""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from attnlab.base.params import n_params
from attnlab.base.schema import Activation
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear, uses_layout
from attnlab.parts import Dims, Init, MixerPart, PartOptions, register
from attnlab.parts.part import default_init
from attnlab.parts.tp import TPPlan

#: the nonlinear mixer computes with its hidden width padded up to a multiple of this
HIDDEN_MULTIPLE = 16


def removed_mlp_params(cfg) -> int:
    """Parameters of one FFN block and its norm (what ``mlp = false`` removes per layer)."""
    d, h = cfg.d_model, cfg.ffn_hidden
    glu = cfg.ffn.kind in ("swiglu", "geglu")
    mats = (3 if glu else 2) * d * h
    biases = ((2 * h if glu else h) + d) if cfg.bias else 0
    from attnlab.parts import registry

    norm = registry.get("norm", cfg.norm.kind).cls.param_count(cfg.norm, Dims.from_config(cfg))
    return mats + biases + (norm or 0)


@register("mixer", "linear")
class LinearMixer(MixerPart):
    """o -> o W_O (+ b)."""

    param_label = "output"
    cost = "params n_in*d; FLOPs 2*n_in*d per token"

    @classmethod
    def param_count(cls, opts: PartOptions, dims: Dims) -> int:
        return dims.mixer_in * dims.d_model + (dims.d_model if dims.bias else 0)

    def __init__(self, opts: PartOptions, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_o = Linear(dims.mixer_in, dims.d_model, bias=dims.bias)

    def init_weights(self, init: Init) -> None:
        default_init(self.w_o, init.out_std)

    def tp_plan(self) -> TPPlan:
        return TPPlan(linears={"w_o": "rowwise"})  # rank r: its heads' columns, summed

    def forward(self, o: Tensor) -> Tensor:
        return self.w_o(o)


@register("mixer", "nonlinear")
class NonlinearMixer(MixerPart):
    """o -> W_b act(W_a o)."""

    param_label = "nonlinear_mixer"
    width_option = "hidden"
    cost = "params m*(n_in + d); FLOPs 2*m*(n_in + d) per token (m sized to the removed MLP)"
    check_config = ("model.mlp=false",)
    unchecked: ClassVar[dict[str, str]] = {
        "flops": "it declares the FLOPs of its m hidden units (model FLOPs, for MFU) but runs its "
        "training matmuls zero-padded to a multiple of 16 units (HIDDEN_MULTIPLE: faster CPU "
        "GEMMs), which FlopCounterMode counts: +18.5% at the check's d=32 (m = 81 -> 96; "
        "0.4% at d=256 by the module docstring)"
    }

    class Options(PartOptions):
        activation: Activation = "gelu"
        hidden: int | None = Field(None, ge=1, description="None = sized to the removed MLP params")

        def check(self, model) -> list[str]:
            if model.mlp and self.hidden is None:
                return [
                    "model.mixer.kind='nonlinear' sizes itself to the removed MLP blocks, but "
                    "model.mlp=true keeps them; set model.mlp=false or give model.mixer.hidden"
                ]
            return []

    @staticmethod
    def hidden_width(opts: Options, dims: Dims) -> int:
        """m: its params m(n_in + d) (+ m + d biases) match a linear W_O plus the removed MLP
        block as closely as a whole width allows."""
        if opts.hidden is not None:
            return opts.hidden
        d, b, n_in = dims.d_model, int(dims.bias), dims.mixer_in
        target = n_in * d + b * d + removed_mlp_params(dims.model)
        return max(1, round((target - b * d) / (n_in + d + b)))

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        m, d = cls.hidden_width(opts, dims), dims.d_model
        return m * (dims.mixer_in + d) + (m + d if dims.bias else 0)

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.hidden = self.hidden_width(opts, dims)
        self.n_in = dims.mixer_in
        self.w_a = Linear(dims.mixer_in, self.hidden, bias=dims.bias)
        self.act = make_activation(opts.activation)
        self.w_b = Linear(self.hidden, dims.d_model, bias=dims.bias)
        self._removed = removed_mlp_params(dims.model) if dims.model is not None else 0

    def init_weights(self, init: Init) -> None:
        default_init(self.w_a, init.std)
        default_init(self.w_b, init.out_std)

    def tp_plan(self) -> TPPlan:
        return TPPlan.whole(
            "it multiplies zero-padded copies of W_a and W_b (F.linear on the weights), which a "
            "split Linear's hooks never see"
        )

    def forward(self, o: Tensor) -> Tensor:
        pad = -self.hidden % HIDDEN_MULTIPLE
        a, b = self.w_a, self.w_b
        # decoding a few rows: the Linears' own layout; a quantized weight (a tensor subclass,
        # attnlab quantize) cannot be padded: its Linear multiplies it unpadded, the same math
        if pad == 0 or uses_layout(o) or type(a.weight.data) is not Tensor:
            return self.w_b(self.act(self.w_a(o)))
        bias_a = F.pad(a.bias, (0, pad)) if a.bias is not None else None
        hdn = F.linear(o, F.pad(a.weight, (0, 0, 0, pad)), bias_a)
        return F.linear(self.act(hdn), F.pad(b.weight, (0, pad)), b.bias)

    def notes(self) -> list[str]:
        n = n_params(self)
        return [
            f"nonlinear_mixer: hidden {self.hidden}, {n} params per layer = a linear W_O "
            f"({self.n_in * self.w_b.out_features}) + the removed MLP block ({self._removed}), "
            "rounded to a whole hidden width"
        ]
