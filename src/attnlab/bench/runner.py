"""``run_bench``: build the subjects, time training and inference interleaved, measure memory.

Order matters on a shared machine: the matmul peak is measured first, every subject is built and
warmed before any timing, training and inference rounds interleave all subjects, and the memory
probes (fresh processes) run last so they never overlap a timing.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from attnlab.base.errors import UserError
from attnlab.bench.inference import InferenceRow, measure_inference
from attnlab.bench.machine import MachineInfo, load_average, machine_info, measured_peak
from attnlab.bench.memory import MemoryRow, measure_memory
from attnlab.bench.peers import PEERS, PeerUnavailableError
from attnlab.bench.retrieval import RetrievalRow, measure_retrieval
from attnlab.bench.subjects import Subject, build_subject
from attnlab.bench.timing import error_text
from attnlab.bench.training import TrainingRow, measure_training
from attnlab.bench.variants import DEFAULT_VARIANTS, VARIANTS
from attnlab.config import Config, ConfigError, apply_overrides, validate
from attnlab.parts import families
from attnlab.parts.family import NEIGHBOURS
from attnlab.runs.device import resolve_device, resolve_precision

SECTIONS: tuple[str, ...] = ("training", "inference", "memory")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BenchSpec:
    """What to measure. ``steps`` timed optimizer steps per subject per round, ``repeats`` rounds
    (after ``warmup`` untimed ones); decoding uses ``decode_repeats`` rounds."""

    config: Config
    config_name: str = "config"
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    peers: list[str] = field(default_factory=lambda: list(PEERS))
    batch_size: int | None = None
    seq_len: int | None = None
    steps: int = 3
    warmup: int = 1
    repeats: int = 5
    threads: int | None = None
    device: str = "cpu"
    dtype: str | None = None
    compile: bool = False
    sections: tuple[str, ...] = SECTIONS
    prompt_len: int = 16
    new_tokens: int | None = None
    decode_batch: int = 1
    decode_repeats: int = 3
    decode_variants: list[str] | None = None
    memory_steps: int = 2
    #: retrieval configs: the prepared data folder whose training tokens the BM25 lookups search
    #: (None: a synthetic database)
    data: str | None = None

    def resolved(self) -> BenchSpec:
        """Fill defaults from the config and check everything a user could get wrong."""
        cfg = self.config
        dev = resolve_device(self.device, setting="--device")
        if dev.type not in ("cpu", "cuda"):
            raise UserError(f"--device {self.device}: choose cpu or cuda[:N]")
        dtype = self.dtype or resolve_precision("auto", dev).name  # the trainer's default
        if dtype not in DTYPES:
            raise UserError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
        family = families.of(cfg.model)
        if self.data is not None and not family.needs(NEIGHBOURS):
            raise UserError("--data is for a retrieval config (the database of its BM25 lookups)")
        if self.data is not None and not (Path(self.data) / "meta.json").is_file():
            raise UserError(
                f"--data {self.data}: not a prepared data folder (no meta.json); run attnlab "
                "data prepare first"
            )
        if not family.continues_text:
            raise UserError(
                f"attnlab bench times causal LMs; model.family={cfg.model.family!r}. "
                f"Use a {families.where(lambda f: f.continues_text)} config (e.g. --preset tiny)"
            )
        seq_len = self.seq_len or cfg.data.seq_len
        batch = self.batch_size or cfg.train.batch_size
        for what, n in (("--steps", self.steps), ("--repeats", self.repeats), ("batch", batch)):
            if n < 1:
                raise UserError(f"{what} must be at least 1 (got {n})")
        bad = [s for s in self.sections if s not in SECTIONS]
        if bad:
            raise UserError(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
        if not self.variants and not self.peers:
            raise UserError("nothing to measure: give at least one variant or peer")
        try:
            cfg = validate(apply_overrides(cfg.to_dict(), [f"data.seq_len={seq_len}"]))
        except ConfigError as e:
            raise UserError(f"--seq-len {seq_len} does not fit this config: {e}") from None
        limit = cfg.model.position_limit
        new = self.new_tokens
        if new is None:
            new = 64 if limit is None else max(1, min(64, limit - self.prompt_len))
        if new < 1 or self.prompt_len < 1:
            raise UserError("--new-tokens and --prompt-len must be at least 1")
        if limit is not None and self.prompt_len + new > limit:
            raise UserError(
                f"--prompt-len {self.prompt_len} + --new-tokens {new} exceeds the model's {limit} "
                f"{cfg.model.position_limit_noun}; lower --new-tokens or --set model.max_seq_len="
                f"{self.prompt_len + new}"
            )
        out = BenchSpec(**{**self.__dict__, "device": str(dev)})
        out.config, out.seq_len, out.batch_size, out.dtype, out.new_tokens = (
            cfg,
            seq_len,
            batch,
            dtype,
            new,
        )
        return out

    def summary(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "config"}
        d["model"] = self.config.model.model_dump(mode="json", exclude_defaults=True)
        return d


@dataclass
class BenchResult:
    machine: MachineInfo
    spec: dict
    training: list[TrainingRow] = field(default_factory=list)
    inference: list[InferenceRow] = field(default_factory=list)
    memory: list[MemoryRow] = field(default_factory=list)
    #: a retrieval config's BM25 lookup time, apart from the model's
    retrieval: RetrievalRow | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    #: every subject a section could not measure: {"section", "name", "reason"} ("build": the
    #: subject could not be built, so no section has it)
    failures: list[dict[str, str]] = field(default_factory=list)
    load_average_end: tuple[float, float, float] | None = None
    elapsed_s: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["machine"] = self.machine.to_dict()
        return d

    def row(self, section: str, name: str):
        return next((r for r in getattr(self, section) if r.name == name), None)

    def fail(self, section: str, name: str, reason: str) -> None:
        self.failures.append({"section": section, "name": name, "reason": reason})

    def failed(self, section: str) -> dict[str, str]:
        """Subjects that have no row in ``section`` because it failed for them (or their build
        did), with the reason."""
        return {
            f["name"]: f["reason"] if f["section"] == section else f"not built: {f['reason']}"
            for f in self.failures
            if f["section"] in (section, "build")
        }


def build_subjects(
    spec: BenchSpec, log: Callable[[str], None], failed: dict[str, str] | None = None
) -> tuple[list[Subject], dict[str, str], list[str]]:
    """The subjects, those skipped (a variant that does not apply to the config, a peer that
    cannot be built: name -> why) and the notes. With ``failed``, a subject whose build raises
    anything else (a part's own error) is recorded there instead of stopping the run."""
    subjects, skipped, notes = [], {}, []
    if spec.compile:  # inductor's on-disk caches: a second bench reads its kernels (as train)
        from attnlab.model.engine.compile_cost import use_inductor_cache

        use_inductor_cache()
    for name in [*spec.variants, *spec.peers]:
        try:
            s = build_subject(name, spec.config, spec.seq_len, spec.device, spec.compile)
        except (ConfigError, PeerUnavailableError) as e:
            skipped[name] = str(e).replace("\n", " ")
            log(f"  skip {name}: {skipped[name]}")
            continue
        except Exception as e:
            if failed is None:
                raise
            failed[name] = error_text(e)
            log(f"  {name} could not be built: {failed[name]}")
            continue
        subjects.append(s)
        notes.extend(s.notes)
    return subjects, skipped, notes


def _remeasure_peak(result: BenchResult, device: str, dtype: torch.dtype) -> None:
    """Measure the matmul peak again after training and keep the higher one (a busy spell during
    the first measurement would otherwise inflate MFU); rescale the training MFU accordingly."""
    m = result.machine
    again = measured_peak(device, dtype, iters=6)
    m.peak_flops_samples.append(again)
    if again > m.peak_flops_measured:
        for row in result.training:
            row.mfu_measured *= m.peak_flops_measured / again
        m.peak_flops_measured = again


def _busy_note(machine: MachineInfo) -> str | None:
    la, cpus = machine.load_average_start, machine.cpu_count or 1
    if machine.device.startswith("cpu") and la is not None and la[0] > 0.75 * cpus:
        return (
            f"the machine was busy (1-min load average {la[0]:.2f} on {cpus} CPUs at start): CPU "
            "timings are unreliable, and with more runnable threads than cores a multi-threaded "
            "step can be several times slower; rerun when the machine is quiet"
        )
    return None


def run_bench(spec: BenchSpec, log: Callable[[str], None] = print) -> BenchResult:
    """Measure everything ``spec`` asks for and return the numbers (no printing of tables)."""
    t_start = time.perf_counter()
    spec = spec.resolved()
    if spec.threads:
        torch.set_num_threads(spec.threads)
    dtype = DTYPES[spec.dtype]
    log(f"measuring the {spec.dtype} matmul peak on {spec.device} ...")
    machine = machine_info(spec.device, dtype, spec.compile)
    result = BenchResult(machine=machine, spec=spec.summary())
    busy = _busy_note(machine)
    if busy:
        result.notes.append(busy)
        log(f"warning: {busy}")
    log(f"building {len(spec.variants)} variants and {len(spec.peers)} peers ...")
    unbuilt: dict[str, str] = {}
    subjects, result.skipped, result.notes = build_subjects(spec, log, unbuilt)
    for name, why in unbuilt.items():
        result.fail("build", name, why)
    if not subjects:
        raise UserError(
            "no subject could be built: "
            + "; ".join(f"{n}: {why}" for n, why in {**result.skipped, **unbuilt}.items())
        )
    reference = "baseline" if any(s.name == "baseline" for s in subjects) else subjects[0].name
    if reference != "baseline":
        result.notes.append(f"ratios are relative to {reference!r} (baseline not measured)")
    if "training" in spec.sections:
        _training_section(spec, subjects, result, dtype, reference, log)
    decoders = [
        s
        for s in subjects
        if s.decodes and (spec.decode_variants is None or s.name in spec.decode_variants)
    ]
    if "inference" in spec.sections and decoders:
        _inference_section(spec, decoders, result, dtype, reference, log)
    if families.of(spec.config.model).needs(NEIGHBOURS) and "inference" in spec.sections:
        log("retrieval: BM25 lookups per chunk, timed apart from the model ...")
        result.retrieval = measure_retrieval(spec.config, spec.seq_len, spec.data)
    # what a fresh process needs to build each subject: its own config (a variant's overrides
    # applied, its plugins listed), or the base config of a peer
    configs = {s.name: (s.kind, (s.config or spec.config).to_dict()) for s in subjects}
    del subjects, decoders
    gc.collect()
    if "memory" in spec.sections:
        _memory_section(spec, configs, result, log)
    result.load_average_end = load_average()
    result.elapsed_s = time.perf_counter() - t_start
    return result


def _training_section(
    spec: BenchSpec,
    subjects: list[Subject],
    result: BenchResult,
    dtype: torch.dtype,
    reference: str,
    log: Callable[[str], None],
) -> None:
    """Training throughput of every subject (interleaved rounds); the matmul peak is measured
    again afterwards, so that a machine whose speed changed is noticed."""
    log(
        f"training: {len(subjects)} subjects x {spec.repeats} interleaved rounds of "
        f"{spec.steps} steps (B={spec.batch_size}, T={spec.seq_len}) ..."
    )
    failed: dict[str, str] = {}
    result.training = measure_training(
        subjects,
        batch=spec.batch_size,
        seq_len=spec.seq_len,
        vocab=spec.config.model.vocab_size,
        device=spec.device,
        dtype=dtype,
        steps=spec.steps,
        rounds=spec.repeats,
        warmup=spec.warmup,
        peak_measured=result.machine.peak_flops_measured,
        peak_datasheet=result.machine.peak_flops_datasheet,
        reference=reference,
        failed=failed,
    )
    for name, why in failed.items():
        result.fail("training", name, why)
    _remeasure_peak(result, spec.device, dtype)


def _inference_section(
    spec: BenchSpec,
    decoders: list[Subject],
    result: BenchResult,
    dtype: torch.dtype,
    reference: str,
    log: Callable[[str], None],
) -> None:
    """Prefill and greedy decoding of the decoding subjects, with and without the KV cache."""
    log(
        f"inference: prefill and greedy decode of {spec.new_tokens} tokens, with and without "
        f"the KV cache, {len(decoders)} variants x {spec.decode_repeats} rounds ..."
    )
    failed: dict[str, str] = {}
    result.inference = measure_inference(
        decoders,
        batch=spec.batch_size,
        seq_len=spec.seq_len,
        prompt_len=spec.prompt_len,
        new_tokens=spec.new_tokens,
        decode_batch=spec.decode_batch,
        vocab=spec.config.model.vocab_size,
        device=spec.device,
        dtype=dtype,
        rounds=spec.decode_repeats,
        warmup=0,  # the greedy-equality check has just run every decode once
        reference=reference,
        failed=failed,
    )
    for name, why in failed.items():
        result.fail("inference", name, why)


def _memory_section(
    spec: BenchSpec,
    configs: dict[str, tuple[str, dict]],
    result: BenchResult,
    log: Callable[[str], None],
) -> None:
    """Peak training memory of each subject, each in a fresh process built from its config."""
    log(f"memory: {len(configs)} fresh processes, {spec.memory_steps} training steps each ...")
    for name, (kind, config) in configs.items():
        row = measure_memory(
            name,
            config,
            kind=kind,
            seq_len=spec.seq_len,
            batch_size=spec.batch_size,
            device=spec.device,
            dtype=spec.dtype,
            threads=torch.get_num_threads(),
            steps=spec.memory_steps,
            compile=spec.compile,
        )
        result.memory.append(row)
        if row.error:
            result.fail("memory", name, row.error)


__all__ = ["SECTIONS", "VARIANTS", "BenchResult", "BenchSpec", "run_bench"]
