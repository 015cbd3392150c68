"""What a run records for `--verify` (worker side) and how the parent reads it back.

Per step, after the gradients are final (reduced, sharded) and before the optimizer uses them, every
parameter's full gradient (DTensor shards gathered: a collective over the parameter's mesh) is kept
by the first rank holding that parameter (dp, cp, tp index 0; for a routed expert the first rank of
its expert data-parallel group), in WORKDIR/verify-grads-STEP-rRANK.pt
or, without a work directory (torchrun), in the result gathered on rank 0. Before the first step and
after each step every rank reads a fixed sample of each parameter's elements (`sample_indices`)
from its own shard, without any collective (`local_sample`): every replica and every shard is
checked, at the cost of a few thousand values. A resumed run also keeps the full parameters and
optimizer state it resumed from.
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


def _unravel(flat: torch.Tensor, shape) -> torch.Tensor:
    """(k, ndim) coordinates of flat indices in a row-major tensor of `shape`."""
    coords = []
    for size in reversed(shape):
        coords.append(flat % size)
        flat = flat // size
    return torch.stack(list(reversed(coords)), dim=1) if coords else flat.view(-1, 0)


def _shard_rows(p) -> list[torch.Tensor]:
    """Per dimension, the global indices held by this rank's local shard of DTensor `p`, in local
    order (DTensor's own layout rule, torch.distributed.tensor._utils, which also orders the strided
    shards FSDP2 makes of tensor-parallel shards)."""
    from torch.distributed.tensor._utils import _get_shard_size_and_offsets
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh, shape = p.device_mesh, list(p.shape)
    rows: dict[int, torch.Tensor] = {}
    for mesh_dim, placement in enumerate(p.placements):
        if not (placement.is_shard() or isinstance(placement, _StridedShard)):
            continue
        dim = placement.dim
        size, index = _get_shard_size_and_offsets(
            shape[dim],
            mesh.size(mesh_dim),
            mesh.get_local_rank(mesh_dim),
            placement,
            rows.get(dim),
            p.shape[dim],
            False,
        )
        shape[dim] = size
        rows[dim] = index[:size] if size else index[:0]
    return [rows.get(d, torch.arange(p.shape[d])) for d in range(p.dim())]


def local_sample(name: str, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat indices, values) of `name`'s sampled elements that this rank holds, read from its local
    shard without communication."""
    from torch.distributed.tensor import DTensor

    idx = sample_indices(name, p.numel())
    if not isinstance(p, DTensor):
        return idx, p.detach().reshape(-1)[idx].float().cpu().clone()
    local = p.to_local().detach()
    coords = _unravel(idx, tuple(p.shape))
    inside = torch.ones(idx.numel(), dtype=torch.bool)
    local_coords = []
    for dim, rows in enumerate(_shard_rows(p)):
        position = torch.full((p.shape[dim],), -1, dtype=torch.long)
        position[rows] = torch.arange(rows.numel())
        where = position[coords[:, dim]]
        inside &= where >= 0
        local_coords.append(where)
    picked = tuple(c[inside] for c in local_coords)
    return idx[inside], local[picked].float().cpu().clone()


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
    """One rank's records. `gradients` and `resumed_state` are collective over the ranks that share a
    stage (each gathers DTensors in the same parameter order); a rank stores the gradients of the
    parameters `keep(name)` assigns to it."""

    def __init__(self, workdir: str | None, rank: int, keep, name_of):
        self.workdir = Path(workdir) if workdir else None
        self.rank, self.keep, self.name_of = rank, keep, name_of
        self.samples: dict[int, dict] = {}
        """Step -> name -> (flat indices, values) this rank holds after that step; -1: before the first."""
        self.memory: dict = {}
        """Step -> name -> full gradient, when there is no work directory."""
        self.start_state: dict | None = None

    def _named(self, parts):
        for _, module in parts:
            for name, p in module.named_parameters():
                yield self.name_of(name), p

    def params(self, step: int, parts) -> None:
        """This rank's sampled parameter values after `step` (-1: before the first)."""
        self.samples[step] = {name: local_sample(name, p) for name, p in self._named(parts)}

    def gradients(self, step: int, parts) -> None:
        """Every parameter's full gradient as the optimizer is about to use it."""
        copy = self.workdir is None
        out = {}
        for name, p in self._named(parts):
            out[name] = (
                full_tensor(p.grad, copy=copy) if p.grad is not None else torch.zeros(p.shape)
            )
        out = {name: g for name, g in out.items() if self.keep(name)}
        if not out:
            return
        if self.workdir is not None:
            save_atomic(out, self.workdir / f"verify-grads-{step}-r{self.rank}.pt")
        else:
            self.memory[step] = out

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
        params = {n: v for n, v in params.items() if self.keep(n)}
        if params:
            self.start_state = {"params": params, "state": {n: state[n] for n in params}}

    def result(self) -> dict:
        return {"samples": self.samples, "memory": self.memory, "start_state": self.start_state}


def load_gradients(step: int, ranks: list[dict], workdir: str | Path | None) -> dict:
    """The run's full gradients of `step`, merged over the stages (files, or the gathered results)."""
    out: dict = {}
    for r in ranks:
        out.update(((r.get("verify") or {}).get("memory") or {}).get(step, {}))
    if workdir is not None:
        for path in sorted(Path(workdir).glob(f"verify-grads-{step}-r*.pt")):
            out.update(torch.load(path, weights_only=True, mmap=True))
            path.unlink()  # hundreds of MB each: free them as the check goes (mapped pages stay)
    return out


def samples_by_rank(ranks: list[dict], step: int) -> list[tuple[int, dict]]:
    """(rank, name -> (indices, values)) of every rank's samples after `step`."""
    return [
        (r["rank"], ((r.get("verify") or {}).get("samples") or {}).get(step, {})) for r in ranks
    ]


def start_state(ranks: list[dict]) -> dict:
    """The resumed run's full parameters and optimizer state, merged over the stages."""
    params, state = {}, {}
    for r in ranks:
        start = (r.get("verify") or {}).get("start_state")
        if start:
            params.update(start["params"])
            state.update(start["state"])
    return {"params": params, "state": state} if params else {}
