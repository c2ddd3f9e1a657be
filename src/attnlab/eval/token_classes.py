"""Token classes of a validation split, for losses per class: where a task says which tokens
carry its answer, a retrieval gain is read on them (a model can gain on separators by reading
that a neighbour exists, but only on the answer tokens by reading what it says).

The planted-fact corpus (``attnlab data synth-facts``) defines ``answer``: the value letters of
every recorded statement ``key=value;`` (``[value_start, value_end)`` of
``facts/statements-val.npy``); ``rest``: every other token; and ``key``, a part of ``rest``: the
key's letters (``[key_start, value_start - 1)``; a neighbour's continuation can hold a key's later
letters too, so a gain there shows copying that is not yet the answer). Other data define none.
A class is a boolean mask over the split's token positions; the loss of predicting token ``t``
(the target at input position ``t - 1``) belongs to the class of ``t``. Cost O(tokens).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def token_classes(data_dir: str | Path, split: str, n_tokens: int) -> dict[str, np.ndarray]:
    """``{name: bool mask [n_tokens]}`` of the split's token classes; ``{}`` when none is defined."""
    from attnlab.data.synth_facts import load_statements

    if not (Path(data_dir) / "facts" / f"statements-{split}.npy").is_file():
        return {}
    answer = np.zeros(n_tokens, dtype=bool)
    key = np.zeros(n_tokens, dtype=bool)
    for _, ks, vs, ve in load_statements(data_dir, split):
        answer[vs:ve] = True
        key[ks : vs - 1] = True
    return {"answer": answer, "rest": ~answer, "key": key & ~answer}
