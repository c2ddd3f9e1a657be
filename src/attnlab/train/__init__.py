"""From-scratch pretraining: the protocol (model, batches, objectives) on the shared run engine.

``train(cfg, run_dir) -> RunResult`` is the Python API behind ``attnlab train``; a trained model
comes back with :func:`attnlab.runs.load.load_run_model`.
"""

from attnlab.train.trainer import RunResult, train

__all__ = ["RunResult", "train"]
