"""One rank of a run: process group, mesh, model, the plan's parallelism, training steps, results.

Entry points: `train(spec, rank=..., world_size=..., local_rank=...)` (used under torchrun by
`planner run` itself) and `python -m planner.executor.worker RUNSPEC.json WORKDIR` (the local
launcher; rank and world size from the environment). Rank 0 gathers every rank's timings and the
full parameters; the launcher reads them from WORKDIR/result.pt, written before teardown.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from planner.executor import checkpoint
from planner.executor.faults import LIVENESS_PERIOD_S, Heartbeat, bug, inject_fault
from planner.executor.context import apply_cp, cp_shard
from planner.executor.experts import apply_ep, expert_groups, is_routed_expert, new_groups
from planner.executor.parallelize import (
    GradAllReduce,
    apply_ac,
    apply_ddp,
    apply_fsdp,
    apply_tp,
    build_device_mesh,
    build_schedule,
    build_stage_module,
    stage_block_counts,
    stage_ids,
)
from planner.executor.record import Recorder
from planner.executor.reference import dp_shard, make_optimizer, synthetic_tokens
from planner.parallel import offload_kinds
from planner.executor.runspec import RunSpec
from planner.models.transformer import build_model, lm_loss
from planner.executor.lifecycle import die_with_parent
from planner.executor.record import full_tensor, save_atomic

PREBUILT: dict = {}
"""(model spec, seed) -> the initialized full model, built once by a forking launcher before the
ranks start (each forked rank takes it copy-on-write instead of initializing 124M parameters again)."""

_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_orig_mod")


def clean_name(name: str) -> str:
    """Parameter FQN without DDP / checkpoint-wrapper / compile prefixes (the reference model's name)."""
    parts = name.split(".")
    if parts[0] == "module":
        parts = parts[1:]
    return ".".join(p for p in parts if p not in _WRAPPER_PARTS)


def _autocast(spec: RunSpec):
    if spec.dtype in ("amp-bf16", "amp-fp16") and spec.device_type == "cuda":
        return torch.autocast(
            "cuda", dtype=torch.bfloat16 if spec.dtype == "amp-bf16" else torch.float16
        )
    return contextlib.nullcontext()


class _Run:
    """State of one rank's training run."""

    def __init__(
        self, spec: RunSpec, rank: int, local_rank: int, workdir: str | None, heartbeat: Heartbeat
    ):
        self.spec, self.rank, self.cfg = spec, rank, spec.config
        self.workdir = workdir
        self.heartbeat = heartbeat
        self.bug = bug(spec.fault)
        if spec.device_type == "cuda":
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device("cpu")
        self.mesh = build_device_mesh(self.cfg, spec.device_type)
        self.coords = {
            "dp": self.mesh.dp.get_local_rank(),
            "pp": self.mesh.pp.get_local_rank(),
            "tp": self.mesh.tp.get_local_rank(),
            "cp": self.mesh.cp.get_local_rank(),
        }
        self.heartbeat.beat("build")
        self._build()
        self.recorder = Recorder(workdir, rank, self._keeps, clean_name) if spec.verify else None

    def _keeps(self, name: str) -> bool:
        """Whether this rank is the one that reports `name`'s full gradient and final value: the first
        rank of the ranks holding it (dp, cp and tp index 0 for a dense parameter; expert data-parallel
        index 0 and tp index 0 for a routed expert's)."""
        if self.cfg.ep > 1 and is_routed_expert(name):
            return self.expert_dp_rank == 0 and self.coords["tp"] == 0
        return self.coords["dp"] == 0 and self.coords["cp"] == 0 and self.coords["tp"] == 0

    def _expert_groups(self) -> None:
        """This rank's ep group and expert data-parallel group (experts.expert_groups; collective)."""
        self.ep_group, self.ep_rank, self.expert_dp_group, self.expert_dp_rank = None, 0, None, 0
        if self.cfg.ep == 1:
            return
        layout = self.mesh.root.mesh.cpu().numpy()
        ep_rows, edp_rows = expert_groups(
            layout, self.mesh.root.mesh_dim_names.index("pp"), self.cfg.ep
        )
        self.ep_group, self.ep_rank, _ = new_groups(ep_rows, self.rank)
        self.expert_dp_group, self.expert_dp_rank, _ = new_groups(edp_rows, self.rank)
        self.coords["ep"] = self.ep_rank

    def _parallelize(self, module: torch.nn.Module) -> tuple[torch.nn.Module, list]:
        """The plan's parallelism on one stage module, in order EP -> CP -> TP -> AC -> DP; returns it
        and the parameters whose gradients this rank reduces itself after the step (GradAllReduce):
        (dense, routed experts)."""
        spec, cfg, mesh = self.spec, self.cfg, self.mesh
        if spec.dtype == "bf16":
            module = module.to(torch.bfloat16)
        module = module.to(self.device)
        routed = []
        if spec.model.moe is not None:
            routed = apply_ep(
                module, group=self.ep_group, ep=cfg.ep, ep_rank=self.ep_rank, bug=self.bug
            )
        if cfg.cp > 1:
            self.positions = apply_cp(module, mesh.cp, seq=cfg.seq, comm=cfg.cp_comm, bug=self.bug)
        if cfg.tp > 1:
            apply_tp(module, mesh.tp, sequence_parallel=cfg.sequence_parallel, bug=self.bug)
        apply_ac(module, cfg.recompute, cfg.recompute_layers)
        experts = (
            routed if cfg.ep > 1 else []
        )  # with ep = 1 experts are replicated like dense weights
        replicas = mesh.grad_size
        if replicas > 1 and cfg.zero > 0:
            return apply_fsdp(
                module,
                mesh.grad,
                zero=cfg.zero,
                ignored=experts,
                offload_optimizer="optimizer" in offload_kinds(spec.offload),
            ), ([], experts)
        if replicas > 1 and cfg.tp == 1 and cfg.pp == 1 and cfg.ep == 1:
            return apply_ddp(module, mesh.grad, device=self.device), ([], [])
        # DDP takes no DTensor parameters, and its reducer asserts ("rebuilt parameter indices") when
        # torch.distributed.pipelining runs several micro-batch backwards: all-reduce after the step
        ids = {id(p) for p in experts}
        return module, ([p for p in module.parameters() if id(p) not in ids], experts)

    def _gradient_reductions(self, dense: list, routed: list) -> list[GradAllReduce]:
        """Dense gradients averaged over the dp x cp ranks; a routed expert's gradient, which already
        sums its ep group's tokens (experts.py), summed over its expert data-parallel group and
        divided by the same dp x cp (the ranks whose mean losses are averaged)."""
        replicas = self.mesh.grad_size
        out = []
        if dense and replicas > 1:
            out.append(GradAllReduce(dense, self.mesh.grad.get_group(), divide_by=replicas))
        if routed:
            out.append(GradAllReduce(routed, self.expert_dp_group, divide_by=replicas))
        return out

    def _build(self) -> None:
        spec, cfg = self.spec, self.cfg
        full = PREBUILT.pop((spec.model, spec.seed), None) if spec.device_type == "cpu" else None
        if full is None:
            full = build_model(spec.model, device="cpu", seed=spec.seed)
        counts = stage_block_counts(cfg, spec.model.total_blocks)
        self.stage_ids = stage_ids(cfg, self.coords["pp"]) if cfg.pp > 1 else [0]
        num_stages = len(counts) if cfg.pp > 1 else 1
        self.parts: list[tuple[int, torch.nn.Module]] = []
        self.positions = None
        self._expert_groups()
        dense, routed = [], []
        for sid in self.stage_ids:
            module, (own_dense, own_routed) = self._parallelize(
                build_stage_module(full, counts, sid) if cfg.pp > 1 else full
            )
            self.parts.append((sid, module))
            dense += own_dense
            routed += own_routed
        self.grad_syncs = self._gradient_reductions(dense, routed)
        del full
        self.optimizers = [make_optimizer(m.parameters(), spec) for _, m in self.parts]
        self.has_first = 0 in self.stage_ids
        self.has_last = (num_stages - 1) in self.stage_ids
        self.schedule = None
        if cfg.pp > 1:
            from torch.distributed.pipelining import PipelineStage

            group = self.mesh.pp.get_group()
            stages = [
                PipelineStage(m, sid, num_stages, self.device, group=group) for sid, m in self.parts
            ]
            self.schedule = build_schedule(
                cfg, stages, self._loss, lockstep=spec.device_type == "cpu"
            )
        self._first_target_ptr = None

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The pipeline's loss per micro-batch (lm_loss); the planted drop_microbatch bug keeps the
        value of micro-batch 0's loss but none of its gradient (micro-batch 0: the target that starts
        where the step's targets start; the schedule's micro-batches are views of them)."""
        loss = lm_loss(output, target)
        if self.bug == "drop_microbatch" and target.data_ptr() == self._first_target_ptr:
            return loss * 0.0 + loss.detach()
        return loss

    def _step_pipeline(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        losses: list[torch.Tensor] = []
        if self.bug == "double_microbatch":
            rows = x.shape[0] // self.cfg.num_microbatches
            x, y = x.clone(), y.clone()
            x[rows : 2 * rows], y[rows : 2 * rows] = x[:rows], y[:rows]
        self._first_target_ptr = y.data_ptr()
        args = (x,) if self.has_first else ()
        kwargs = {"target": y, "losses": losses} if self.has_last else {}
        with _autocast(self.spec):
            self.schedule.step(*args, return_outputs=False, **kwargs)
        return torch.stack([l.detach().float() for l in losses]).mean() if self.has_last else None

    def _step_accumulate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ((_, module),) = self.parts
        n = self.cfg.num_microbatches
        total = torch.zeros((), device=self.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):
            last = i == n - 1
            sync = contextlib.nullcontext()
            if hasattr(module, "no_sync") and (not last or self.bug == "skip_dp_reduce"):
                sync = module.no_sync()
            if hasattr(module, "set_requires_gradient_sync"):
                module.set_requires_gradient_sync(last)
                if (
                    self.bug == "hsdp_skip_replica_reduce"
                ):  # planted: HSDP replicas never average their shards
                    module.set_requires_all_reduce(False)
            offload = (
                torch.autograd.graph.save_on_cpu(pin_memory=True)
                if "activations" in offload_kinds(self.spec.offload)
                else contextlib.nullcontext()
            )
            with sync, offload:
                with _autocast(self.spec):
                    loss = lm_loss(module(xm), ym)
                (loss / n).backward()
            total += loss.detach().float()
        return total / n

    def global_loss(self, local: torch.Tensor | None) -> float:
        """Mean over the ranks holding the last stage (tp peers hold the same value, dp replicas
        equal shares of the global batch)."""
        buf = torch.zeros(2, device=self.device, dtype=torch.float64)
        if local is not None:
            buf[0], buf[1] = local.double(), 1.0
        dist.all_reduce(buf)
        return (buf[0] / buf[1]).item()

    def train(self) -> dict:
        spec, cfg = self.spec, self.cfg
        start, losses = 0, []
        if spec.checkpoint_dir and spec.resume_step is not None:
            self.heartbeat.beat("resume")
            start, losses = checkpoint.load(
                spec.checkpoint_dir, spec.resume_step, self.parts, self.optimizers
            )
        if self.recorder is not None:
            if start:
                self.recorder.resumed_state(self.parts, self.optimizers)
            else:
                self.recorder.params(-1, self.parts)
        cadence = checkpoint.Cadence(
            interval_s=spec.checkpoint_interval_s, every_steps=spec.checkpoint_every_steps
        )
        times: list[float] = []
        saved: list[int] = []
        for step in range(start, spec.steps):
            self.heartbeat.beat("step", step)
            inject_fault(spec.fault, self.rank, step)
            tokens = dp_shard(synthetic_tokens(spec, step), cfg.dp, self.coords["dp"]).to(
                self.device
            )
            x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            if (
                self.positions is not None
            ):  # context parallelism: this rank's chunks of every sequence
                x, y = cp_shard(x, self.positions), cp_shard(y, self.positions)
            dist.barrier()
            t0 = time.perf_counter()
            local = (
                self._step_pipeline(x, y)
                if self.schedule is not None
                else self._step_accumulate(x, y)
            )
            if self.bug != "skip_dp_reduce":
                for sync in self.grad_syncs:
                    sync()
            t_grad = time.perf_counter()
            if self.recorder is not None:
                self.recorder.gradients(step, self.parts)
            t_record = time.perf_counter()
            if self.bug == "zero_shard_offset" and self.coords["dp"] == 1:
                _shift_gradient_shards(self.parts)
            for opt in self.optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if spec.device_type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0 - (t_record - t_grad))
            losses.append(self.global_loss(local))
            if self.recorder is not None:
                self.recorder.params(step, self.parts)
            if spec.checkpoint_dir and self._decide(cadence.due(step, last=step == spec.steps - 1)):
                self.heartbeat.beat("checkpoint", step)
                checkpoint.save(
                    spec.checkpoint_dir,
                    step,
                    self.parts,
                    self.optimizers,
                    losses,
                    run=checkpoint.identity(spec),
                )
                cadence.saved()
                saved.append(step)
        self.heartbeat.beat("gather", spec.steps)
        return {
            "rank": self.rank,
            "coords": self.coords,
            "stages": self.stage_ids,
            "start_step": start,
            "step_times_s": times,
            "losses": losses,
            "params": self.full_params(),
            "checkpoints": saved,
            "verify": self.recorder.result() if self.recorder is not None else None,
        }

    def _decide(self, due: bool) -> bool:
        """Rank 0's decision, broadcast: every rank saves the same steps even when their clocks differ."""
        flag = torch.tensor([1 if due else 0], device=self.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def full_params(self) -> dict | None:
        """Full fp32 parameters of this rank's stages (collective over each DTensor's mesh); kept
        by the first rank holding each parameter (`_keeps`): in WORKDIR/params-rRANK.pt when there
        is a work directory (pickling hundreds of MB through gather_object costs more than the
        training steps of a small model), else in the result."""
        out = {
            clean_name(name): full_tensor(p, copy=self.workdir is None)
            for _, module in self.parts
            for name, p in module.named_parameters()
        }
        out = {name: value for name, value in out.items() if self._keeps(name)}
        if not out:
            return None
        if self.workdir is not None:
            path = Path(self.workdir) / f"params-r{self.rank}.pt"
            save_atomic(out, path)
            return {"file": str(path)}
        return out


def _shift_gradient_shards(parts) -> None:
    """Planted bug zero_shard_offset: this rank's gradient shards, as its optimizer sees them, come
    from one row further on (wrapping), as if its shard offset were off by one."""
    from torch.distributed.tensor import DTensor

    for _, module in parts:
        for p in module.parameters():
            if isinstance(p.grad, DTensor):
                local = p.grad.to_local()
                if local.dim() and local.shape[0] > 1:
                    local.copy_(local.roll(1, 0))


def train(
    spec: RunSpec,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    workdir: str | None = None,
    heartbeat: Heartbeat | None = None,
) -> list | None:
    """Run one rank; returns every rank's results on rank 0 (None elsewhere). Collective."""
    heartbeat = heartbeat or Heartbeat(workdir, rank)
    heartbeat.beat("init")
    if not dist.is_initialized():
        dist.init_process_group(
            spec.backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=spec.timeout_s),
        )
    run = _Run(spec, rank, local_rank, workdir, heartbeat)
    result = run.train()
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    return gathered


def main(argv: list[str], *, parent: int | None = None) -> int:
    """A launched rank. `parent`: the launcher's pid (this rank ends when that process is gone)."""
    spec_path, workdir = argv
    rank = int(os.environ["RANK"])
    parent = die_with_parent(parent)
    faulthandler.enable(all_threads=True)  # a native crash leaves its Python stack in the log
    heartbeat = Heartbeat(workdir, rank)
    try:
        spec = RunSpec.from_json(Path(spec_path).read_text())
        heartbeat.start(period_s=min(LIVENESS_PERIOD_S, spec.timeout_s / 5), parent=parent)
        results = train(
            spec,
            rank=rank,
            world_size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ.get("LOCAL_RANK", rank)),
            workdir=workdir,
            heartbeat=heartbeat,
        )
        if rank == 0:
            save_atomic(results, Path(workdir) / "result.pt")
        heartbeat.beat("done", spec.steps)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as err:  # noqa: BLE001 - any failure of a rank becomes its one-line report
        line = (str(err).strip().splitlines() or [type(err).__name__])[0][:400]
        error_file = Path(workdir) / f"error-{rank}.json"
        error_file.with_suffix(".tmp").write_text(
            json.dumps(
                {"message": f"{type(err).__name__}: {line}", "traceback": traceback.format_exc()}
            )
        )
        os.replace(error_file.with_suffix(".tmp"), error_file)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    sys.exit(
        main(
            sys.argv[1:],
            parent=int(os.environ["PLANNER_LAUNCHER_PID"])
            if "PLANNER_LAUNCHER_PID" in os.environ
            else None,
        )
    )
