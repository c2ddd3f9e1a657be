"""The options both virtual-heads score parts take (``virtual_heads`` on the materialised map,
``virtual_heads_fused`` through fused attention), with the checks they share."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from attnlab.parts import Dims, PartOptions, families


class VirtualHeadsOptions(PartOptions):
    """K taps, H' virtual heads, logits or probabilities, 1-D (causal) or 2-D (encoder)."""

    kernel_size: int = Field(3, ge=1)
    n_virtual: int | None = Field(None, ge=1, description="H'; None = n_heads")
    on: Literal["logits", "probs"] = "logits"
    conv: Literal["1d", "2d"] = "1d"

    def heads_out(self, dims: Dims) -> int:
        """H', the heads the score part hands on."""
        return self.n_virtual or dims.n_heads

    def check(self, model) -> list[str]:
        out = []
        if self.conv == "2d" and families.of(model).causal_lm:
            out.append(
                "model.score.conv='2d' looks at later queries and keys; it is only allowed in "
                f"{families.where(lambda f: not f.causal_lm)}. Use conv='1d' in causal stacks"
            )
        n = self.n_virtual or model.attention.n_heads
        if n % model.n_kv_heads:
            out.append(
                f"model.score.n_virtual={n} must be a multiple of the {model.n_kv_heads} K/V "
                "heads (each virtual head reads one K/V group's values)"
            )
        return out
