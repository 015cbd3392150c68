"""What a run records for `--verify` (worker side) and how the parent reads it back.

Per step, after the gradients are final (reduced, sharded) and before the optimizer uses them, every
parameter's full gradient (DTensor shards gathered: a collective over the parameter's mesh) is kept
by the rank that keeps that stage's parameters (dp 0, tp 0); after the step, the full parameters
(except after the last step: the run gathers those anyway). They go to
WORKDIR/verify-{grads,params}-STEP-rRANK.pt, or, without a work directory (torchrun), into the result
gathered on rank 0. Before the first step a fixed sample of each parameter's elements
(`sample_indices`) is kept, to check the initialization; a resumed run keeps instead the full
parameters and optimizer state it resumed from.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

import torch

SAMPLES_PER_TENSOR = 4096
"""Elements of each parameter whose values are recorded after every step (all of a smaller one)."""


def sample_indices(name: str, numel: int, k: int = SAMPLES_PER_TENSOR) -> torch.Tensor:
    """The flat indices of `name`'s recorded elements: a fixed pseudo-random choice (seeded by the
    name's CRC-32), the same in every process."""
    if numel <= k:
        return torch.arange(numel)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randint(0, numel, (k,), generator=gen)


def full_tensor(t: torch.Tensor, *, copy: bool = True) -> torch.Tensor:
    """A tensor's full value (a DTensor's gathered: a collective over its mesh), fp32 on the CPU.
    copy=True: never a view of the live tensor, which the optimizer updates in place (copy=False
    is for values serialized at once)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.full_tensor().detach().float().cpu()
    out = t.detach().float().cpu()
    return out.clone() if copy and out.data_ptr() == t.data_ptr() else out


def save_atomic(obj, path: Path) -> None:
    """torch.save to a temporary name, then rename: a reader never sees half a file. Without the
    archive's CRC-32 (a third of the time for hundreds of MB; these files live minutes on one host)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch < 2.6: always computes it
        config = None
    previous = config.save.compute_crc32 if config is not None else None
    try:
        if config is not None:
            config.save.compute_crc32 = False
        torch.save(obj, tmp)
    finally:
        if config is not None:
            config.save.compute_crc32 = previous
    os.replace(tmp, path)


class Recorder:
    """One rank's records. Every method is collective over the ranks that share a stage (each
    gathers DTensors in the same parameter order); only `keep` ranks store anything."""

    def __init__(self, workdir: str | None, rank: int, keep: bool, name_of):
        self.workdir = Path(workdir) if workdir else None
        self.rank, self.keep, self.name_of = rank, keep, name_of
        self.initial: dict = {}
        """Name -> sampled values before the first step."""
        self.memory: dict = {}
        """(kind, step) -> name -> full tensor, when there is no work directory."""
        self.start_state: dict | None = None

    def _named(self, parts):
        for _, module in parts:
            for name, p in module.named_parameters():
                yield self.name_of(name), p

    def _store(self, kind: str, step: int, values: dict) -> None:
        if not self.keep:
            return
        if self.workdir is not None:
            save_atomic(values, self.workdir / f"verify-{kind}-{step}-r{self.rank}.pt")
        else:
            self.memory[(kind, step)] = values

    def initial_params(self, parts) -> None:
        """Sampled parameter values before the first step (the initialization)."""
        for name, p in self._named(parts):
            full = full_tensor(p)
            if self.keep:
                self.initial[name] = full.reshape(-1)[sample_indices(name, full.numel())].clone()

    def gradients(self, step: int, parts) -> None:
        """Every parameter's full gradient as the optimizer is about to use it."""
        copy = self.workdir is None
        out = {}
        for name, p in self._named(parts):
            out[name] = full_tensor(p.grad, copy=copy) if p.grad is not None else torch.zeros(p.shape)
        self._store("grads", step, out)

    def params(self, step: int, parts) -> None:
        """Every parameter's full value after `step`."""
        copy = self.workdir is None
        self._store("params", step, {name: full_tensor(p, copy=copy) for name, p in self._named(parts)})

    def resumed_state(self, parts, optimizers) -> None:
        """Full parameters and optimizer state at the resumed step (the replay's starting point)."""
        params, state = {}, {}
        for (_, module), optimizer in zip(parts, optimizers):
            for name, p in module.named_parameters():
                clean = self.name_of(name)
                params[clean] = full_tensor(p)
                saved = {}
                for key, value in sorted(optimizer.state.get(p, {}).items()):
                    saved[key] = full_tensor(value) if torch.is_tensor(value) else value
                state[clean] = saved
        if self.keep:
            self.start_state = {"params": params, "state": state}

    def result(self) -> dict:
        return {"initial": self.initial, "memory": self.memory, "start_state": self.start_state}


def load_record(kind: str, step: int, ranks: list[dict], workdir: str | Path | None) -> dict:
    """The run's full `kind` ('grads' or 'params') of `step`, merged over the stages."""
    out: dict = {}
    for r in ranks:
        out.update(((r.get("verify") or {}).get("memory") or {}).get((kind, step), {}))
    if workdir is not None:
        for path in sorted(Path(workdir).glob(f"verify-{kind}-{step}-r*.pt")):
            out.update(torch.load(path, weights_only=True, mmap=True))
            path.unlink()                 # hundreds of MB each: free them as the check goes (mapped pages stay)
    return out


def merged(ranks: list[dict], key: str) -> dict:
    """Merge a per-rank record over the stages: 'initial' (name -> samples) or 'start_state'."""
    if key == "initial":
        out: dict = {}
        for r in ranks:
            out.update((r.get("verify") or {}).get("initial") or {})
        return out
    params, state = {}, {}
    for r in ranks:
        start = (r.get("verify") or {}).get("start_state")
        if start:
            params.update(start["params"])
            state.update(start["state"])
    return {"params": params, "state": state} if params else {}
