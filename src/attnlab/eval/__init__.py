"""Evaluation: perplexity, LAMBADA-style cloze, multiple choice, and an lm-eval adapter.

Every task scores a :class:`LanguageModel` (an attnlab run, a Hugging Face model or GGUF file, a
probed base + adapter), so all of them are compared by the same code::

    from attnlab.eval import evaluate
    evaluate("runs/tiny", ["perplexity", "cloze:cloze.jsonl"], limit=200)

The lm-evaluation-harness model ``attnlab`` lives in :mod:`attnlab.eval.harness` (imported on
demand, as it imports lm_eval).
"""

from attnlab.eval.cloze import ClozeItem, evaluate_cloze, load_cloze_file
from attnlab.eval.cloze_build import build_cloze_set
from attnlab.eval.evaluate import evaluate
from attnlab.eval.hf import HFCausalLM
from attnlab.eval.lm import LanguageModel
from attnlab.eval.multiple_choice import MCItem, evaluate_multiple_choice, load_mc_file
from attnlab.eval.native import AttnlabLM
from attnlab.eval.perplexity import Document, PerplexityResult, perplexity
from attnlab.eval.registry import TASKS
from attnlab.eval.scoring import ContinuationScore, encode_pair, score_continuations
from attnlab.eval.targets import TargetKind, load_language_model, register_target_kind

__all__ = [
    "TASKS",
    "AttnlabLM",
    "ClozeItem",
    "ContinuationScore",
    "Document",
    "HFCausalLM",
    "LanguageModel",
    "MCItem",
    "PerplexityResult",
    "TargetKind",
    "build_cloze_set",
    "encode_pair",
    "evaluate",
    "evaluate_cloze",
    "evaluate_multiple_choice",
    "load_cloze_file",
    "load_language_model",
    "load_mc_file",
    "perplexity",
    "register_target_kind",
    "score_continuations",
]
