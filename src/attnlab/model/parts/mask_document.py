"""The document mask for packed sequences: no attention across the documents of a row,
doc[b, i] == doc[b, j] (and j <= i in a causal stack).

The data pipeline records where each packed document ends (the end-of-text tokens of the token
stream, ``attnlab.data.documents``) and the training batch carries a document id per token
(``Batch.doc_ids``), which the family passes to the model and the model to this part
(``needs_doc_ids``). Without ids (``generate``, ``eval``: one text per row) a row is one
document, so the mask is the stack's causal or full one. No params; O(sum of squared document
lengths / 2) pairs: the engine skips every key block of another document (8 documents packed
in T tokens: about T^2 / 16 pairs instead of T^2 / 2).
"""

from __future__ import annotations

from torch import Tensor

from attnlab.model.engine import Causal, Document, Full, Mask
from attnlab.parts import MaskPart, register


@register("mask", "document")
class DocumentMask(MaskPart):
    """Attention stays inside each packed document."""

    needs_doc_ids = True
    cost = "params 0; pairs sum of L_doc^2 / 2"

    @classmethod
    def param_count(cls, opts, dims) -> int:
        return 0

    def forward(self, causal: bool, doc_ids: Tensor | None = None) -> Mask:
        if doc_ids is None:
            return Causal() if causal else Full()
        return Document(doc_ids, causal=causal)
