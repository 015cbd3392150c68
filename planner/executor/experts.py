"""Expert parallelism: the routed experts of every MoE block sharded over the ep ranks of a group,
tokens dispatched to their experts' ranks and combined back with all-to-all (GShard, Lepikhin et al.
2020; Megatron-Core's alltoall token dispatcher).

Groups (Megatron-Core's expert rank generator, MoE parallel folding, Liu et al. 2025, arXiv
2504.14960, with expert_tp = 1): the ranks of one pipeline stage, numbered in the placement's order
with P taken out, are regrouped as (expert_dp, ep) with ep innermost: an ep group is ep consecutive
numbers, an expert data-parallel group the numbers equal modulo ep. With tp = 1 the stage's ranks are
its dp x cp ranks, so ep groups are carved from dp x cp (planner.parallel's rule; planner.placement
costs the same groups).

The forward is dropless and exact: every token reaches its top-k experts (the reference
MoEFeedForward's routing, `route`), rows are sorted by expert (so by owner rank), counts are
exchanged, rows dispatched with one all-to-all, each local expert multiplies exactly its rows, the
results return with a second all-to-all and are weighted and summed per token in expert order, as the
reference sums them. Every local expert runs on every step, on zero rows if none reach it, so each
expert parameter always has a gradient (data parallelism reduces the same tensors on every rank).

Gradients: the loss of a rank is the mean over its own tokens and the global loss the mean over the
dp x cp ranks of a stage, so a dense gradient is averaged over dp x cp; an expert's gradient on its
rank already sums the contributions of the ep group's tokens (the combine's backward brings them
home), so it is summed over the expert data-parallel group and divided by dp x cp.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from planner.executor.context import AllToAll
from planner.models.transformer import MoEFeedForward


def expert_groups(layout: np.ndarray, pp_axis: int, ep: int) -> tuple[np.ndarray, np.ndarray]:
    """(ep groups, expert data-parallel groups) as arrays of global ranks, one row per group, from the
    device mesh's rank layout (placement order) and the position of its pp axis (module docstring)."""
    stages = np.moveaxis(layout, pp_axis, 0).reshape(layout.shape[pp_axis], -1)  # (pp, stage ranks)
    folded = stages.reshape(stages.shape[0], -1, ep)  # (pp, expert_dp, ep)
    return folded.reshape(-1, ep), np.swapaxes(folded, 1, 2).reshape(-1, folded.shape[1])


def new_groups(rows: np.ndarray, rank: int):
    """Create a process group for every row (collective: every rank creates all of them, in order);
    returns (this rank's group, its index in the row, the row)."""
    mine = None
    for row in rows:
        members = [int(r) for r in row]
        group = dist.new_group(members)
        if rank in members:
            mine = (group, members.index(rank), members)
    return mine


class ExpertParallelMoE(MoEFeedForward):
    """MoEFeedForward holding only its ep rank's experts (`experts` keyed by global expert index, so
    parameter names stay those of the full model), dispatching tokens with all-to-all (module
    docstring). With ep = 1 it holds every expert and exchanges nothing."""

    group = None
    ep = 1
    ep_rank = 0
    bug: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        index, weight = self.route(x)
        k = index.shape[1]
        experts = self.moe.experts
        per_rank = experts // self.ep
        flat = index.reshape(-1)
        if (
            self.bug == "ep_wrong_rank"
        ):  # planted: each assignment goes to the next rank's same-slot expert
            flat = (flat + per_rank) % experts
        order = torch.argsort(flat, stable=True)  # expert order, hence owner-rank order
        token = order // k
        chosen = flat[order]
        send = torch.bincount(chosen // per_rank, minlength=self.ep)
        rows = x[token]
        if self.ep > 1:
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=self.group)
            send_counts, recv_counts = send.tolist(), recv.tolist()
            rows = AllToAll.apply(rows, send_counts, recv_counts, self.group)
            ids = chosen.new_empty(sum(recv_counts))
            dist.all_to_all_single(ids, chosen, recv_counts, send_counts, group=self.group)
        else:
            ids = chosen
        done = rows.new_zeros(rows.shape)
        for key, expert in self.experts.items():
            where = torch.where(ids == int(key))[0]
            done = done.index_add(0, where, expert(rows[where]))
        if self.ep > 1:
            done = AllToAll.apply(done, recv_counts, send_counts, self.group)
        gate = weight.reshape(-1)[order]
        out = torch.zeros_like(x).index_add(0, token, done * gate[:, None])
        return self.add_shared(x, out).view(shape)


def apply_ep(
    module: nn.Module, *, group, ep: int, ep_rank: int, bug: str | None = None
) -> list[nn.Parameter]:
    """Expert parallelism on one (stage) module: every MoE block keeps experts ep_rank x E/ep ..
    (ep_rank + 1) x E/ep - 1 and dispatches with all-to-all (`ExpertParallelMoE`). Returns the routed
    experts' parameters (reduced over the expert data-parallel group, not the dense one)."""
    routed: list[nn.Parameter] = []
    for sub in list(module.modules()):
        if not isinstance(sub, MoEFeedForward):
            continue
        per_rank = sub.moe.experts // ep
        keep = range(ep_rank * per_rank, (ep_rank + 1) * per_rank)
        sub.experts = nn.ModuleDict({str(e): sub.experts[e] for e in keep})
        sub.__class__ = ExpertParallelMoE
        sub.group, sub.ep, sub.ep_rank, sub.bug = group, ep, ep_rank, bug
        routed.extend(sub.experts.parameters())
    return routed


def is_routed_expert(name: str) -> bool:
    """A routed expert's parameter (held by one ep rank), by its name in the Transformer."""
    return ".feed_forward.experts." in name
