"""Save and resume with torch.distributed.checkpoint (DCP): every rank writes its own shards.

Layout: CHECKPOINT_DIR/step-N/ holds DCP's files for the state after step N (model parts and one
optimizer per part, keyed by stage) and `trainer.json`, the step's manifest: the loss history, the
identity of the run that saved it and the name and size of every file DCP wrote. Rank 0 writes it
last, atomically (temporary name, then rename), after every rank has finished its shards: a step
counts only once its manifest exists, and is intact only while every file it lists is present with
its recorded size and DCP's metadata reads back (`step_problem`). Before any rank starts, the
launcher picks the latest intact step (`choose_resume_step`), moves damaged newer steps aside
(`step-N.damaged`) and says so on stderr.

When to save (`Cadence`): every step by default; with the plan's `checkpoint_interval_s` (the
goodput model's interval) whenever that much wall time has passed since the last save; with
`--checkpoint-every-steps N` every N steps; always after the last step. Rank 0 decides and
broadcasts, so every rank saves the same steps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist
from planner.errors import ConfigError

MANIFEST = "trainer.json"
DCP_METADATA = ".metadata"


class Cadence:
    """When to checkpoint: every `every_steps` steps, or once `interval_s` of wall time has passed
    since the last save (or the start), or every step when neither is given; always at the last."""

    def __init__(
        self,
        *,
        interval_s: float | None = None,
        every_steps: int | None = None,
        clock=time.monotonic,
    ):
        self.interval_s, self.every_steps, self.clock = interval_s, every_steps, clock
        self.last = clock()

    def due(self, step: int, *, last: bool) -> bool:
        if last:
            return True
        if self.every_steps:
            return (step + 1) % self.every_steps == 0
        if self.interval_s:
            return self.clock() - self.last >= self.interval_s
        return True

    def saved(self) -> None:
        self.last = self.clock()


def _steps(root: Path) -> list[int]:
    out = []
    for p in root.glob("step-*"):
        tail = p.name.split("-", 1)[1]
        if p.is_dir() and tail.isdigit():
            out.append(int(tail))
    return sorted(out)


def read_manifest(path: Path) -> dict | None:
    try:
        doc = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def step_problem(path: Path) -> str | None:
    """Why the step directory `path` cannot be resumed from, or None when it is intact: manifest
    present and readable, every file it lists present with the recorded size, DCP metadata readable."""
    doc = read_manifest(path)
    if doc is None:
        return (
            "trainer.json is unreadable"
            if (path / MANIFEST).exists()
            else "no trainer.json (the save did not finish)"
        )
    files = doc.get("files")
    if not isinstance(files, dict) or DCP_METADATA not in files:
        return "its trainer.json lists no files (saved by an older planner, or damaged)"
    for name, size in sorted(files.items()):
        f = path / name
        try:
            actual = f.stat().st_size
        except OSError:
            return f"{name} is missing"
        if actual != size:
            return f"{name} has {actual} bytes, {size} were written"
    try:
        from torch.distributed.checkpoint import FileSystemReader

        FileSystemReader(str(path)).read_metadata()
    except Exception as err:  # noqa: BLE001 - any unreadable metadata makes the step unusable
        return f"DCP metadata unreadable ({type(err).__name__})"
    return None


def latest_step(directory: str | Path) -> int | None:
    """The last intact step saved in `directory`, or None."""
    root = Path(directory)
    if not root.is_dir():
        return None
    for step in reversed(_steps(root)):
        if step_problem(root / f"step-{step}") is None:
            return step
    return None


def identity(spec) -> dict:
    """What a checkpoint must match to be resumed by `spec`: the model actually built, its parallel
    layout (DCP reshards nothing here: each rank reloads its own shards), seed, precision, optimizer."""
    cfg = spec.config
    return {
        "model": spec.model.name,
        "seed": spec.seed,
        "dtype": spec.dtype,
        "optimizer": cfg.optimizer,
        "dp": cfg.dp,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "cp": cfg.cp,
        "ep": cfg.ep,
        "dp_shard": cfg.dp_shard,
        "placement": cfg.placement,
        "virtual_stages": cfg.virtual_stages,
        "stages": list(cfg.stages),
        "zero": cfg.zero,
        "micro_batch": cfg.micro_batch,
        "global_batch": cfg.global_batch,
        "seq": cfg.seq,
        "schedule": cfg.schedule,
    }


def _set_aside(path: Path) -> Path:
    target = path.with_name(path.name + ".damaged")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged{n}")
    os.replace(path, target)
    return target


def choose_resume_step(directory: str | Path, *, say=None, set_aside: bool = True) -> int | None:
    """Before launching: the latest intact step of `directory` (None: start fresh). Damaged or
    unfinished steps newer than it are moved aside (step-N.damaged), each named on stderr. A
    directory with steps but none intact is bad input (ConfigError, exit 2)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    root = Path(directory)
    steps = _steps(root) if root.is_dir() else []
    problems = {}
    for step in reversed(steps):
        problem = step_problem(root / f"step-{step}")
        if problem is None:
            for bad, why in sorted(problems.items()):
                if not set_aside:
                    continue
                moved = _set_aside(root / f"step-{bad}")
                say(
                    f"warning: checkpoint step {bad} in {root} is unusable ({why}); moved it to {moved.name} "
                    f"and resuming from step {step}"
                )
            return step
        problems[step] = problem
    if problems:
        worst = max(problems)
        raise ConfigError(
            "--checkpoint-dir",
            str(root),
            "a directory with an intact step",
            message=(
                f"--checkpoint-dir {root}: no intact checkpoint (latest, step {worst}: {problems[worst]}); "
                f"use a fresh directory or restore the files"
            ),
        )
    return None


def check_resumable(directory: str | Path, spec, *, set_aside: bool = True) -> int | None:
    """Before launching: the checkpoint directory is usable by `spec`. Returns the step to resume
    from (None for a fresh directory); ConfigError when the path is a file, no step is intact, the
    saved run differs (model, layout, seed, ...) or it already holds every step asked for."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise ConfigError("--checkpoint-dir", str(root), "a directory (it is a file)")
    step = choose_resume_step(root, set_aside=set_aside)
    if step is None:
        return None
    saved = (read_manifest(root / f"step-{step}") or {}).get("run")
    mine = identity(spec)
    if saved is not None and saved != mine:
        diff = [f"{k} {saved.get(k)!r} -> {mine[k]!r}" for k in mine if saved.get(k) != mine[k]]
        raise ConfigError(
            "--checkpoint-dir",
            str(root),
            "a checkpoint of this run",
            message=(
                f"--checkpoint-dir {root}: step {step} was saved by a different run ({'; '.join(diff)}); "
                f"use a fresh directory"
            ),
        )
    if spec.steps <= step + 1:
        raise ConfigError(
            "--steps",
            spec.steps,
            f"more than {step + 1}",
            message=(
                f"--steps {spec.steps}: {root} already holds steps 0..{step}; ask for more than {step + 1} steps "
                f"to resume, or use a fresh directory"
            ),
        )
    return step


def _state(parts: list[tuple[int, object]], optimizers: list) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state = {}
    for (stage, module), optimizer in zip(parts, optimizers):
        model_sd, optim_sd = get_state_dict(module, optimizer)
        state[f"model.stage{stage}"] = model_sd
        state[f"optim.stage{stage}"] = optim_sd
    return state


def save(
    directory: str | Path,
    step: int,
    parts,
    optimizers,
    losses: list[float],
    run: dict | None = None,
) -> None:
    """Collective: save the state after `step` (0-based), then (rank 0) the manifest: loss history up
    to it, the run's identity (checked on resume) and every file's size."""
    import torch.distributed.checkpoint as dcp

    path = Path(directory) / f"step-{step}"
    if dist.get_rank() == 0 and (path / MANIFEST).exists():
        (path / MANIFEST).unlink()  # re-saving a step: it is incomplete until the new manifest
    dist.barrier()
    dcp.save(_state(parts, optimizers), checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        write_manifest(path, step, losses, run)
    dist.barrier()


def write_manifest(path: Path, step: int, losses: list[float], run: dict | None) -> None:
    """The step's trainer.json: loss history, run identity and every file's size, written atomically."""
    files = {
        p.name: p.stat().st_size
        for p in sorted(path.iterdir())
        if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")
    }
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(
        json.dumps({"step": step, "losses": losses[: step + 1], "run": run, "files": files})
    )
    os.replace(tmp, path / MANIFEST)


def load(directory: str | Path, step: int, parts, optimizers) -> tuple[int, list[float]]:
    """Collective: restore step `step` (chosen and validated by the launcher); returns (next step to
    run, loss history)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(directory) / f"step-{step}"
    state = _state(parts, optimizers)
    dcp.load(state, checkpoint_id=str(path))
    for (stage, module), optimizer in zip(parts, optimizers):
        set_state_dict(
            module,
            optimizer,
            model_state_dict=state[f"model.stage{stage}"],
            optim_state_dict=state[f"optim.stage{stage}"],
        )
    losses = json.loads((path / MANIFEST).read_text())["losses"]
    return step + 1, list(losses)
