"""The run engine that pretraining, the probe, evaluation and benchmarks share.

One place for what every protocol needs from a run directory and a device:

- ``atomic``      crash-safe writes of bytes/text/JSON/directories, the one JSON NaN policy, sha256
- ``lock``        one writer per run or experiment directory (``fcntl.flock``, released on death)
- ``records``     typed models of ``status.json``, ``metrics.jsonl`` rows and ``state.json``
- ``rundir``      the config file, ``status.json``, ``metrics.jsonl``; config check and repair
- ``checkpoint``  safetensors checkpoints with per-file sha256 and the training config
- ``rng``         RNG states as JSON
- ``load``        ``load_run_model(run_dir)``: a trained model back from its newest intact checkpoint
- ``device``      ``device = "auto"`` and the precision (autocast, float16 loss scaling)
- ``peak``        measured peak FLOP/s and MFU
- ``distributed`` torchrun ranks, DDP/FSDP2 wrapping
- ``optim``       AdamW grouping (decay on >= 2-D weights) and the warmup + cosine schedule
- ``divergence``  NaN/inf and loss-spike detection
- ``progress``    progress events and their console reporters
- ``loop``        the one training loop; a protocol plugs in a ``TrainTask``

Nothing here imports a protocol (``train``, ``probe``, ``eval``, ``bench``, ``experiments``).
Importing the package itself is free; import the module you need.
"""
