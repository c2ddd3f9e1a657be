"""Frozen probe (SPEC 2.2, seed 000): attnlab's parts injected into a pretrained Hugging Face causal
LM whose own weights stay frozen, trained alone and compared with PEFT LoRA at a matched count.

    from attnlab.probe import load_probe_config, train_probe, load_probed_model
    cfg = load_probe_config("configs/probe/smollm2.toml", ["method=preproj+skip"])
    train_probe(cfg, "runs/probe-preproj-skip")
    model, tokenizer = load_probed_model("runs/probe-preproj-skip")

Pieces: ``methods`` (method strings), ``config`` (typed TOML config), ``base`` (hub id / local dir /
GGUF), ``arch`` (where each architecture keeps its attention parts), ``inject`` (hooks),
``lora`` (PEFT, rank solved on actual counts), ``build`` (assembly and freezing), ``data``
(corpus in the base's tokens), ``trainer`` (the probe's side of the shared run loop),
``artifacts`` (adapter files and re-attachment), ``target`` (probe dirs as evaluation targets),
``evaluation``, ``layer_stats``, ``report``, ``experiment`` (all methods, one table).
Heavy imports (transformers, peft) happen inside functions.
"""

from attnlab.probe.artifacts import load_probed, load_probed_model
from attnlab.probe.build import ProbedModel, build_probed_model
from attnlab.probe.config import ProbeConfig, load_experiment, load_probe_config
from attnlab.probe.inject import Injection, inject
from attnlab.probe.methods import Method, MethodError, parse_method
from attnlab.probe.target import PROBE_TARGET  # registers probe dirs as evaluation targets

__all__ = [
    "PROBE_TARGET",
    "Injection",
    "Method",
    "MethodError",
    "ProbeConfig",
    "ProbedModel",
    "build_probed_model",
    "inject",
    "load_experiment",
    "load_probe_config",
    "load_probed",
    "load_probed_model",
    "parse_method",
    "run_experiment",
    "train_probe",
]


def __getattr__(name: str):  # the trainer pulls in the run engine and tasks: load on use
    if name == "train_probe":
        from attnlab.probe.trainer import train_probe

        return train_probe
    if name == "run_experiment":
        from attnlab.probe.experiment import run_experiment

        return run_experiment
    raise AttributeError(name)
