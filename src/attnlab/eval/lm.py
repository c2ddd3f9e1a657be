"""The one interface every evaluation talks to: a causal language model plus its tokenizer.

Perplexity, cloze, multiple choice and the lm-evaluation-harness adapter only ever call
``encode``, ``decode``, ``logits`` and read ``eos_id`` / ``prefix_id`` / ``max_length``, so an
attnlab run, a Hugging Face checkpoint (hub id, local dir or GGUF file) and a probed base with its
adapter are evaluated by the same code. Backends live in ``native.py`` and ``hf.py``; target
strings are resolved in ``targets.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from attnlab.base.errors import UserError


class LanguageModel(ABC):
    """A causal LM that scores token sequences.

    Contract of :meth:`logits`: ``input_ids`` is ``[B, T]`` and right-padded; ``attention_mask``
    (``[B, T]``, 1 = real token) marks the padding. Position ``t`` of row ``b`` must depend only on
    tokens ``<= t`` of that row, so right padding never changes a scored position. The result is
    float32 ``[B, T, V]`` on any device.
    """

    #: a short human-readable name (a run dir, ``hf:ID``, a GGUF file)
    name: str = "model"
    #: the directory evaluation results are stored under (``<dir>/eval/results.json``), if any
    results_dir: Path | None = None
    #: the prepared corpus this model was trained on (default of the ``perplexity`` task), if any
    data_dir: Path | None = None

    #: the sequence length the model was trained on (an attnlab run's ``data.seq_len``), when
    #: known: the perplexity tasks' window unless :meth:`limit_context` chose one
    trained_length: int | None = None

    #: the context window in tokens; backends set it, :meth:`limit_context` may lower it
    _max_length: int = 0
    _context_chosen: bool = False
    #: True when the model may be fed more than its context: its positions have no length
    #: limit (an attnlab model whose position part declares none), so evaluation past the
    #: training length is possible; ``limit_reason`` says why a limited model stops
    extrapolates: bool = False
    limit_reason: str = ""
    #: appended to every result key (an evaluation-time change of the model, e.g.
    #: ``+position.scaling=yarn``), so it never overwrites the results of the model as trained
    tag: str = ""

    @property
    def context_limit(self) -> int | None:
        """The longest input the model can be fed at all (None: no limit)."""
        return None if self.extrapolates else self.__dict__.get("_native_length", self._max_length)

    def can_take(self, length: int) -> bool:
        """Whether an input of ``length`` tokens can be fed."""
        limit = self.context_limit
        return limit is None or length <= limit

    @property
    def max_length(self) -> int:
        """Longest input fed to the model, in tokens."""
        return self._max_length

    @property
    def perplexity_length(self) -> int:
        """The window of the perplexity tasks: the length given to :meth:`limit_context`, else
        the length the model was trained on (positions past it were never trained, and a part
        whose cost or behaviour depends on the length is measured where it was trained), else
        :attr:`max_length`."""
        if self._context_chosen or not self.trained_length:
            return self.max_length
        return min(self.trained_length, self.max_length)

    def limit_context(self, max_length: int | None) -> LanguageModel:
        """Feed at most ``max_length`` tokens (saves memory and time; never above the model's
        own context). Returns ``self``."""
        if max_length is None:
            return self
        if max_length < 1 or not self.can_take(max_length):
            raise UserError(
                f"max_length={max_length} must be between 1 and the context of {self.name} "
                f"({self.context_limit} tokens){self.limit_reason}"
            )
        self.__dict__.setdefault("_native_length", self._max_length)
        self._max_length = int(max_length)
        self._context_chosen = True
        return self

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where input tensors must live."""

    @property
    @abstractmethod
    def eos_id(self) -> int:
        """End-of-text id; documents in a prepared corpus are separated by it."""

    @property
    def prefix_id(self) -> int:
        """The token that conditions the first token of a text (BOS if the tokenizer has one,
        else EOS), as lm-evaluation-harness does for empty contexts and rolling windows."""
        return self.eos_id

    @property
    @abstractmethod
    def tokenizer_name(self) -> str:
        """Identifies the tokenizer, so token files made with another one are re-tokenized."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without any special token added."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""

    @abstractmethod
    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Next-token logits, float32 ``[B, T, V]`` (see the class docstring for padding)."""

    def scored_logits(
        self, input_ids: Tensor, attention_mask: Tensor | None, scored_from: int
    ) -> Tensor:
        """:meth:`logits` for a caller that reads positions ``scored_from`` and later only (the
        logits before it may be anything): a model that computes a position's contract-keeping
        logits at a cost (a prefix LM's prefix) skips those no one reads."""
        return self.logits(input_ids, attention_mask)

    def info(self) -> dict[str, object]:
        """A JSON-able description stored next to results."""
        return {"name": self.name, "max_length": self.max_length, "tokenizer": self.tokenizer_name}

    @torch.no_grad()
    def greedy_generate(
        self,
        context: Sequence[int],
        max_new_tokens: int,
        should_stop: Callable[[list[int]], bool] | None = None,
    ) -> list[int]:
        """Greedy continuation of ``context`` (at most ``max_new_tokens`` ids, stopping after EOS
        or when ``should_stop(generated)`` is true).

        Cost: one full forward of up to ``max_length`` tokens per new token (no KV cache); a
        backend with a cache overrides this.
        """
        ids = list(context)
        out: list[int] = []
        for _ in range(max_new_tokens):
            window = ids[-self.max_length :]
            x = torch.tensor([window], dtype=torch.long, device=self.device)
            nxt = int(self.logits(x)[0, -1].argmax())
            if nxt == self.eos_id:
                break
            ids.append(nxt)
            out.append(nxt)
            if should_stop is not None and should_stop(out):
                break
        return out
