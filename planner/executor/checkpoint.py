"""Save and resume with torch.distributed.checkpoint (DCP): every rank writes its own shards.

Layout: CHECKPOINT_DIR/step-N/ holds DCP's files for the state after step N (model parts and one
optimizer per part, keyed by stage) and `trainer.json` (the loss history), written by rank 0 after
every rank has finished saving; a step directory without trainer.json is incomplete and ignored.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist


def latest_step(directory: str | Path) -> int | None:
    """The last complete step saved in `directory`, or None."""
    root = Path(directory)
    if not root.is_dir():
        return None
    done = [int(p.name.split("-", 1)[1]) for p in root.glob("step-*") if (p / "trainer.json").exists()]
    return max(done) if done else None


def identity(spec) -> dict:
    """What a checkpoint must match to be resumed by `spec`: the model actually built, its parallel
    layout (DCP reshards nothing here: each rank reloads its own shards), seed, precision, optimizer."""
    cfg = spec.config
    return {"model": spec.model.name, "seed": spec.seed, "dtype": spec.dtype, "optimizer": cfg.optimizer,
            "dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp, "virtual_stages": cfg.virtual_stages,
            "stages": list(cfg.stages), "zero": cfg.zero, "micro_batch": cfg.micro_batch,
            "global_batch": cfg.global_batch, "seq": cfg.seq, "schedule": cfg.schedule}


def check_resumable(directory: str | Path, spec) -> int | None:
    """Before launching: the checkpoint directory is usable by `spec`. Returns the latest saved step
    (None for a fresh directory); ConfigError when the path is a file, the saved run differs (model,
    layout, seed, ...) or it already holds every step asked for."""
    from planner.errors import ConfigError

    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise ConfigError("--checkpoint-dir", str(root), "a directory (it is a file)")
    step = latest_step(root)
    if step is None:
        return None
    saved = json.loads((root / f"step-{step}" / "trainer.json").read_text()).get("run")
    mine = identity(spec)
    if saved is not None and saved != mine:
        diff = [f"{k} {saved.get(k)!r} -> {mine[k]!r}" for k in mine if saved.get(k) != mine[k]]
        raise ConfigError("--checkpoint-dir", str(root), "a checkpoint of this run", message=(
            f"--checkpoint-dir {root}: step {step} was saved by a different run ({'; '.join(diff)}); "
            f"use a fresh directory"))
    if spec.steps <= step + 1:
        raise ConfigError("--steps", spec.steps, f"more than {step + 1}", message=(
            f"--steps {spec.steps}: {root} already holds steps 0..{step}; ask for more than {step + 1} steps "
            f"to resume, or use a fresh directory"))
    return step


def _state(parts: list[tuple[int, object]], optimizers: list) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state = {}
    for (stage, module), optimizer in zip(parts, optimizers):
        model_sd, optim_sd = get_state_dict(module, optimizer)
        state[f"model.stage{stage}"] = model_sd
        state[f"optim.stage{stage}"] = optim_sd
    return state


def save(directory: str | Path, step: int, parts, optimizers, losses: list[float], run: dict | None = None) -> None:
    """Collective: save the state after `step` (0-based), the loss history up to it and the run's
    identity (checked on resume)."""
    import torch.distributed.checkpoint as dcp

    path = Path(directory) / f"step-{step}"
    dcp.save(_state(parts, optimizers), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = path / "trainer.json.tmp"
        tmp.write_text(json.dumps({"step": step, "losses": losses[:step + 1], "run": run}))
        os.replace(tmp, path / "trainer.json")
    dist.barrier()


def load(directory: str | Path, parts, optimizers) -> tuple[int, list[float]]:
    """Collective: restore the latest complete step; returns (next step to run, loss history)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    step = latest_step(directory)
    if step is None:
        return 0, []
    path = Path(directory) / f"step-{step}"
    state = _state(parts, optimizers)
    dcp.load(state, checkpoint_id=str(path))
    for (stage, module), optimizer in zip(parts, optimizers):
        set_state_dict(module, optimizer, model_state_dict=state[f"model.stage{stage}"],
                       optim_state_dict=state[f"optim.stage{stage}"])
    losses = json.loads((path / "trainer.json").read_text())["losses"]
    return step + 1, list(losses)
