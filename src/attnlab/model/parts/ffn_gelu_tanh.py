"""GPT-2's MLP: GELU in its tanh approximation (``gelu_new``), so GPT-2 checkpoints map exactly
(``attnlab train --init-from``, :mod:`attnlab.hf.arch_gpt2`)."""

from __future__ import annotations

from attnlab.model.parts.ffn import MLP
from attnlab.parts import register


@register("ffn", "gelu_tanh")
class GeluTanhMLP(MLP):
    """GELU_tanh(x W_in) W_out, GELU_tanh(z) = z/2 (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))."""

    activation = "gelu_tanh"
