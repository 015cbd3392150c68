"""Context parallelism: every sequence split over the cp ranks of a group; attention exchanges keys and values.

torch's own `torch.distributed.tensor.experimental.context_parallel` does not run here: on CPU, SDPA
dispatches to `aten._scaled_dot_product_flash_attention_for_cpu`, which it does not shard (torch
2.13 raises "does not have a sharding strategy registered"; it handles the CUDA flash, efficient and
cuDNN kernels only). So the executor has its own attention core, differentiable end to end: autograd
runs the backward through the exchanges (each one's backward is the reverse exchange), on any device.

The load-balanced causal split (Megatron-Core and Transformer Engine's context parallelism; the
"zigzag" ring attention of Brandon et al. 2023 / Liu et al. 2023's ring attention made causal-balanced):
each sequence is cut into 2 cp chunks of seq / (2 cp) tokens and cp rank i holds chunks i and
2cp-1-i, so every rank's queries see the same number of causal keys. The plan's cp_comm picks the
exchange:
- p2p (ring attention, Liu et al. 2023, arXiv 2310.01889): cp steps; at step j a rank attends to the
  KV block of rank (i - j) mod cp, then passes it on to rank i+1 (isend/irecv) and receives the next
  from rank i-1; the partial results are merged with their log-sum-exps (the online softmax of
  Milakov & Gimelshein 2018, as FlashAttention merges tiles);
- all_gather: every rank gathers every rank's KV block at once, then the same per-chunk merge;
- a2a (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509): an all-to-all trades the sequence
  split for a split of the heads, each rank attends over the whole sequence for heads/cp of the heads,
  and a second all-to-all trades back.

Per pair (query chunk A, key chunk C) of the causal split: C < A attends fully, C = A is the causal
diagonal, C > A is skipped (wholly in the future), so no partial result is ever empty.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from planner.models.transformer import Attention, LatentAttention


def chunk_ids(cp: int, cp_rank: int) -> tuple[int, int]:
    """The two chunks (of 2 cp) cp rank i holds: i and 2cp-1-i."""
    return cp_rank, 2 * cp - 1 - cp_rank


def cp_positions(seq: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Sequence positions of cp rank i's tokens, in the order it holds them (chunk i, then chunk
    2cp-1-i). seq must divide by 2 cp (ParallelConfig.check_sequence)."""
    size = seq // (2 * cp)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunk_ids(cp, cp_rank)])


class _RingShift(torch.autograd.Function):
    """Send x to the next rank of the ring, return the previous rank's; backward: the reverse shift."""

    @staticmethod
    def forward(ctx, x, group, send_to, recv_from):
        ctx.group, ctx.send_to, ctx.recv_from = group, send_to, recv_from
        return _exchange(x, group, send_to, recv_from)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group, ctx.recv_from, ctx.send_to), None, None, None


def _exchange(x: torch.Tensor, group, send_to: int, recv_from: int) -> torch.Tensor:
    out = torch.empty_like(x)
    ops = [
        dist.P2POp(dist.isend, x.contiguous(), send_to, group),
        dist.P2POp(dist.irecv, out, recv_from, group),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return out


class _AllGather(torch.autograd.Function):
    """Every rank's x stacked on a new dim 0 (rank order); backward: the sum over ranks of the gradient
    of this rank's slot (an all-reduce, then this rank's slice: gloo has no reduce-scatter of tensors)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


class AllToAll(torch.autograd.Function):
    """all_to_all_single over `group` along dim 0 with the given split sizes (rows sent to / received
    from each rank); backward: the same exchange with the splits swapped (expert dispatch and combine
    use it too, planner.executor.experts)."""

    @staticmethod
    def forward(ctx, x, send_counts: list[int], recv_counts: list[int], group):
        ctx.send_counts, ctx.recv_counts, ctx.group = send_counts, recv_counts, group
        return _all_to_all(x, send_counts, recv_counts, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.recv_counts, ctx.send_counts, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, send_counts, recv_counts, group) -> torch.Tensor:
    out = x.new_empty((sum(recv_counts),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(recv_counts), list(send_counts), group=group)
    return out


def _ulysses_swap(x: torch.Tensor, group, cp: int, *, heads_to_seq: bool) -> torch.Tensor:
    """Ulysses' all-to-all on (b, h, s, d): heads_to_seq trades the local sequence (s) for heads / cp
    of the heads over the whole gathered sequence (cp s, rank-major); the reverse trades back."""
    if heads_to_seq:
        send = torch.stack(x.chunk(cp, dim=1))  # (cp, b, h/cp, s, d): piece j to rank j
    else:
        send = torch.stack(x.chunk(cp, dim=2))  # (cp, b, h/cp, s/cp, d)
    shape = send.shape
    counts = [1] * cp
    out = AllToAll.apply(send.reshape(cp, -1), counts, counts, group).reshape(shape)
    return torch.cat(out.unbind(0), dim=2 if heads_to_seq else 1)


def _partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, diagonal: bool):
    """softmax(q k^T scale) v over one key chunk (causal within the chunk when `diagonal`), in fp32,
    with its log-sum-exp per query: (out, lse)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if diagonal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v.float(), lse


def _merge(parts: list) -> torch.Tensor:
    """Combine partial attentions over disjoint key sets: sum_k exp(lse_k - LSE) out_k, LSE = log sum_k exp(lse_k)."""
    if len(parts) == 1:
        return parts[0][0]
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)
    return sum(torch.exp(p_lse - lse) * out for out, p_lse in parts)


def _chunk_attention(
    q, blocks, mine: tuple[int, int], *, causal: bool, scale: float
) -> torch.Tensor:
    """Attention of this rank's two query chunks over key/value `blocks` [(k, v, (chunk, chunk))]."""
    outs = []
    for a, q_a in zip(mine, q.chunk(2, dim=2)):
        parts = []
        for k, v, theirs in blocks:
            for c, k_c, v_c in zip(theirs, k.chunk(2, dim=2), v.chunk(2, dim=2)):
                if causal and c > a:
                    continue  # wholly in this query chunk's future
                parts.append(_partial(q_a, k_c, v_c, scale, diagonal=causal and c == a))
        outs.append(_merge(parts))
    return torch.cat(outs, dim=2)


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query K/V repeated to the query heads (autograd sums the copies back)."""
    rep = heads // x.shape[1]
    return x.repeat_interleave(rep, dim=1) if rep > 1 else x


def context_parallel_core(
    q,
    k,
    v,
    *,
    group,
    cp: int,
    cp_rank: int,
    causal: bool,
    comm: str,
    positions: torch.Tensor,
    bug: str | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries (b, h, s/cp, d) over the whole sequence's keys and values,
    whose chunks live on the cp ranks of `group` (module docstring). Output as SDPA's, in q's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    heads = q.shape[1]
    if comm == "a2a":
        q, k, v = (_ulysses_swap(t, group, cp, heads_to_seq=True) for t in (q, k, v))
        k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
        order = torch.cat([cp_positions(positions.numel() * cp, cp, r) for r in range(cp)]).to(
            q.device
        )
        scores = (q.float() @ k.float().transpose(-1, -2)) * scale
        if causal:
            scores = scores.masked_fill(order[None, :] > order[:, None], float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v.float()
        return _ulysses_swap(out, group, cp, heads_to_seq=False).to(q.dtype)
    ranks = [dist.get_global_rank(group, r) for r in range(cp)]
    width = k.shape[-1]
    kv = torch.cat(
        [k, v], dim=-1
    )  # one exchange per step (d_k may differ from d_v), K/V heads only
    if comm == "all_gather":
        gathered = _AllGather.apply(kv, group)
        sources = list(range(cp))
        blocks_kv = [gathered[r] for r in sources]
    else:  # p2p ring
        sources, blocks_kv, block = [], [], kv
        for step in range(cp):
            if step:
                block = _RingShift.apply(
                    block, group, ranks[(cp_rank + 1) % cp], ranks[(cp_rank - 1) % cp]
                )
            sources.append((cp_rank - step) % cp)
            blocks_kv.append(block)
        if (
            bug == "cp_drop_kv_block"
        ):  # planted: the last block to arrive around the ring is never used
            sources, blocks_kv = sources[:-1], blocks_kv[:-1]
    blocks = [
        (_repeat_kv(b[..., :width], heads), _repeat_kv(b[..., width:], heads), chunk_ids(cp, src))
        for src, b in zip(sources, blocks_kv)
    ]
    return _chunk_attention(q, blocks, chunk_ids(cp, cp_rank), causal=causal, scale=scale).to(
        q.dtype
    )


def apply_cp(
    module: nn.Module, cp_mesh, *, seq: int, comm: str, bug: str | None = None
) -> torch.Tensor:
    """Context parallelism on one (stage) module: its tokens' positions (the Transformer's
    `positions`, used by learned and rotary position encodings) and every attention module's core
    replaced by `context_parallel_core` over the cp group. Returns this rank's positions."""
    cp, cp_rank = cp_mesh.size(), cp_mesh.get_local_rank()
    positions = cp_positions(seq, cp, cp_rank)
    module.positions = positions
    group = cp_mesh.get_group()
    for sub in module.modules():
        if isinstance(sub, (Attention, LatentAttention)):
            sub._core = partial(
                context_parallel_core,
                group=group,
                cp=cp,
                cp_rank=cp_rank,
                causal=sub.causal,
                comm=comm,
                positions=positions,
                bug=bug,
            )
    return positions


def cp_shard(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """This rank's columns (sequence positions) of a (batch, seq) tensor of tokens or targets."""
    return x[:, positions.to(x.device)].contiguous()
