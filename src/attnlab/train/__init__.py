"""From-scratch pretraining: the loop, AdamW + schedule, objectives, checkpoints, torchrun.

``train(cfg, run_dir) -> RunResult`` is the Python API behind ``attnlab train``;
``load_run_model(run_dir)`` gives back a trained model, its config and tokenizer.
"""

from attnlab.train.checkpoint import load_run_model
from attnlab.train.progress import ProgressEvent
from attnlab.train.trainer import RunResult, train

__all__ = ["ProgressEvent", "RunResult", "load_run_model", "train"]
