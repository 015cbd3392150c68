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


def _state(parts: list[tuple[int, object]], optimizers: list) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state = {}
    for (stage, module), optimizer in zip(parts, optimizers):
        model_sd, optim_sd = get_state_dict(module, optimizer)
        state[f"model.stage{stage}"] = model_sd
        state[f"optim.stage{stage}"] = optim_sd
    return state


def save(directory: str | Path, step: int, parts, optimizers, losses: list[float]) -> None:
    """Collective: save the state after `step` (0-based) and the loss history up to it."""
    import torch.distributed.checkpoint as dcp

    path = Path(directory) / f"step-{step}"
    dcp.save(_state(parts, optimizers), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = path / "trainer.json.tmp"
        tmp.write_text(json.dumps({"step": step, "losses": losses[:step + 1]}))
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
