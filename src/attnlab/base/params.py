"""The one parameter counter: what ``attnlab params``, eval's model info, bench, the probe's
counts and the conformance battery's declared-count check all mean by "parameters"."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn


def n_params(source: nn.Module | Iterable[Tensor]) -> int:
    """Elements of a module's parameters (or of the given tensors), each tensor once: a weight
    tied in two places (input embedding and output head) counts once."""
    tensors = source.parameters() if isinstance(source, nn.Module) else source
    return sum(t.numel() for t in {id(t): t for t in tensors}.values())
