"""Run directories for the Hugging Face export tests, made without training: a model built from a
config, its weights spread out (so logits differ clearly between tokens and greedy decoding has
no near-ties), written as a checkpoint with the config it was "trained" with."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from attnlab.config import dump_toml, load_config
from attnlab.model import build_model
from attnlab.runs import checkpoint, rundir
from attnlab.runs.records import ConfigRecord

#: a meta-path finder that makes attnlab unimportable (prepended in a subprocess)
BLOCK_ATTNLAB = """
import importlib.abc, sys
class _NoAttnlab(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "attnlab" or name.startswith("attnlab."):
            raise ImportError(f"attnlab is blocked in this test ({name})")
sys.meta_path.insert(0, _NoAttnlab())
"""


def spread_weights(model: torch.nn.Module, seed: int = 0, std: float = 0.15) -> None:
    """Every parameter += N(0, std): a random model whose tokens get clearly different logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)


def fake_run(
    run_dir: Path,
    overrides: list[str] = (),
    *,
    preset: str = "tiny",
    plugins: list[str] = (),
    seed: int = 0,
    step: int = 5,
) -> Path:
    """A run directory with one checkpoint of a randomly initialised, spread-out model."""
    cfg = load_config(preset, [*overrides, "train.device=cpu"], plugins=plugins)
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    spread_weights(model, seed)
    return write_run(run_dir, cfg, model, step, final_val_loss=3.21)


def write_run(
    run_dir: Path, cfg, model: torch.nn.Module, step: int, *, final_val_loss: float
) -> Path:
    """A finished run directory holding ``model`` as its one checkpoint, at ``step``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    text = dump_toml(cfg)
    (run_dir / "config.toml").write_text(text, encoding="utf-8")
    record = ConfigRecord(file="config.toml", text=text)
    empty_optim = {"state": {}, "param_groups": []}
    checkpoint.write_checkpoint(run_dir, step, model.state_dict(), empty_optim, {}, config=record)
    status = {"status": "finished", "step": step, "final_val_loss": final_val_loss}
    rundir.write_status(run_dir, status)
    return run_dir


def python_without_attnlab(code: str) -> list[str]:
    """argv that runs ``code`` in a fresh interpreter where ``import attnlab`` fails."""
    return [sys.executable, "-c", BLOCK_ATTNLAB + code]


def alternation_batch(n: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """Rows ``a b a b ...`` of two different random lowercase bytes: the next token is the one two
    back, which the newest token alone does not tell."""
    a = torch.randint(97, 123, (n, 1), generator=generator)
    b = torch.randint(97, 123, (n, 1), generator=generator)
    b = torch.where(b == a, (b - 97 + 1) % 26 + 97, b)
    return torch.cat([a, b], 1).repeat(1, length // 2)


def alternation_run(run_dir: Path, *, steps: int = 150, length: int = 48) -> Path:
    """A run directory whose ``tiny`` model was trained (about 2 s) to continue ``a b a b`` with
    ``a``: its greedy tokens depend on the prompt beyond its last token, so a decoder whose cache
    sees only the newest token gives other tokens and other logits."""
    cfg = load_config("tiny", ["train.device=cpu"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = alternation_batch(32, length, gen)
        logits = model(x).logits[:, 1:-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 2:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return write_run(run_dir, cfg, model, steps, final_val_loss=float(loss.detach()))
