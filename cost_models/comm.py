"""Collective and point-to-point communication times (alpha-beta models), numbers or numpy arrays.

Conventions (nccl-tests, doc/PERFORMANCE.md, "bus bandwidth"): for a collective over n ranks
moving a buffer of S bytes per rank,

    all-reduce      t = 2 (n-1)/n * S / B_bus + 2 (n-1) alpha            (ring)
    reduce-scatter  t =   (n-1)/n * S / B_bus +   (n-1) alpha            (ring, S = full buffer)
    all-gather      t =   (n-1)/n * S / B_bus +   (n-1) alpha            (ring, S = full buffer)

where B_bus is the per-rank link bandwidth times a bus efficiency (Thakur, Rabenseifner & Gropp
2005, "Optimization of Collective Communication Operations in MPICH", Sec. 4; Patarasuk & Yuan
2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations": the ring reaches
the 2 (n-1)/n S / B lower bound). The tree (double binary tree in NCCL) has the same bandwidth term
with a latency of 2 log2(n) alpha instead of 2 (n-1) alpha; NCCL picks the faster, so we take the
minimum.

A group spread over several nodes is costed hierarchically (Megatron/NCCL style): reduce-scatter
inside each node over NVLink, all-reduce of the 1/k shard across nodes over the network (each of
the k local ranks drives its own share of the node's NICs), all-gather inside the node.

`relative_allreduce_cost` is the seed's "Latent Space" relative model, where an all-reduce over n
nodes costs log2(n) steps.
"""

from __future__ import annotations

import numpy as np

from cost_models.compute import eff, recompute_passes
from cost_models.experts import mlp_tp_pair
from cost_models.pipeline import p2p_transfers_on_critical_path
from hardware_profiles import HardwareProfile
from hardware_profiles.efficiency import efficiency
from planner.parallel import CP_COMMS


def relative_allreduce_cost(nodes, devices_per_node):
    """Relative cost of an all-reduce over `nodes` nodes of `devices_per_node` devices, against a
    one-step reference: half the work stays inside the node (cost 1/2 on the fast links) and half
    crosses the network, where a tree over n nodes needs log2(n) steps, each carrying 1/log2(n) of
    the data at the node's share:  1/2 + 1/2 * 1/log2(n).

    Seed worked example: 16 nodes of 8 GPUs -> 1/2 + 1/2 * 1/4 = 0.625.
    With one node there is nothing to cross: 1.0 (the whole reduction is local).
    """
    nodes = np.asarray(nodes, dtype=float)
    steps = np.log2(np.maximum(nodes, 2.0))
    return np.where(nodes > 1, 0.5 + 0.5 / steps, 1.0)


COLLECTIVE_EFFICIENCY_KEY = {
    "allreduce": "allreduce_bus_efficiency",
    "allgather": "allgather_bus_efficiency",
    "reduce_scatter": "reducescatter_bus_efficiency",
    "alltoall": "alltoall_bus_efficiency",
    "p2p": "p2p_bus_efficiency",
}
"""Which efficiency key (hardware_profiles.efficiency) gives each collective's bus bandwidth over the
link rate; `planner hardware calibrate` measures each one."""


def bus_efficiency(hw: HardwareProfile, collective: str = "allreduce") -> float:
    """Bus bandwidth of `collective` over the link rate, from the profile (nccl-tests' busbw)."""
    return efficiency(hw, COLLECTIVE_EFFICIENCY_KEY[collective])


def intra_bus_Bps(hw: HardwareProfile, collective: str = "allreduce") -> float:
    """Achievable per-device bus bandwidth of `collective` inside a node, bytes/s."""
    return hw.intra_node_GBps_per_device * 1e9 * bus_efficiency(hw, collective)


def inter_bus_Bps_per_node(hw: HardwareProfile, collective: str = "allreduce") -> float:
    """Achievable network bandwidth of `collective` out of one node, bytes/s."""
    return hw.inter_node_Gbps_per_node / 8.0 * 1e9 * bus_efficiency(hw, collective)


def ring_allreduce_seconds(size_bytes, n, bw_Bps, latency_s):
    """Ring all-reduce of `size_bytes` per rank over n ranks (Patarasuk & Yuan 2009):
    2 (n-1)/n S / B + 2 (n-1) alpha; 0 when n == 1."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, 2 * (n - 1) / n * size_bytes / bw_Bps + 2 * (n - 1) * latency_s, 0.0)


def tree_allreduce_seconds(size_bytes, n, bw_Bps, latency_s):
    """Double-binary-tree all-reduce (NCCL >= 2.4; Sanders, Speck & Traeff 2009): bandwidth term
    as the ring, latency 2 log2(n) alpha."""
    n = np.asarray(n, dtype=float)
    return np.where(
        n > 1,
        2 * (n - 1) / n * size_bytes / bw_Bps + 2 * np.log2(np.maximum(n, 1)) * latency_s,
        0.0,
    )


def allreduce_seconds(size_bytes, n, bw_Bps, latency_s):
    """Flat all-reduce: the faster of ring and tree (what NCCL's tuner does)."""
    return np.minimum(
        ring_allreduce_seconds(size_bytes, n, bw_Bps, latency_s),
        tree_allreduce_seconds(size_bytes, n, bw_Bps, latency_s),
    )


def reduce_scatter_seconds(size_bytes, n, bw_Bps, latency_s):
    """Ring reduce-scatter of a `size_bytes` buffer: (n-1)/n S / B + (n-1) alpha."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, (n - 1) / n * size_bytes / bw_Bps + (n - 1) * latency_s, 0.0)


allgather_seconds = reduce_scatter_seconds
"""Ring all-gather of a `size_bytes` result buffer: same cost as the reduce-scatter (nccl-tests)."""


def alltoall_seconds(size_bytes, n, bw_Bps, latency_s):
    """All-to-all of a `size_bytes` buffer per rank over n ranks: each rank sends (n-1)/n of it,
    (n-1)/n S / B + (n-1) alpha (nccl-tests' all-to-all bus bandwidth definition)."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, (n - 1) / n * size_bytes / bw_Bps + (n - 1) * latency_s, 0.0)


def p2p_seconds(size_bytes, bw_Bps, latency_s):
    """One point-to-point send: alpha + S / B."""
    return latency_s + np.asarray(size_bytes, dtype=float) / bw_Bps


def group_collective_seconds(kind: str, size_bytes, n, local, hw: HardwareProfile):
    """Time of collective `kind` ('allreduce', 'reduce_scatter', 'allgather') over a group of n ranks
    of which `local` share each node (so n / local nodes); arrays broadcast.

    local == n: the group stays inside a node (NVLink/NVSwitch, flat ring or tree).
    local < n: hierarchical: the operation inside the node over `local` ranks on the full buffer,
    then across the n / local nodes on a 1/local shard (NCCL's and Megatron's 2D scheme). Every
    device of a node is busy in its own group at the same time (groups laid side by side), so each
    rank gets 1/devices_per_node of the node's network bandwidth.
    """
    n = np.asarray(n, dtype=float)
    local = np.minimum(np.asarray(local, dtype=float), n)
    size = np.asarray(size_bytes, dtype=float)
    nodes = n / local
    a_in = hw.intra_node_latency_us * 1e-6
    a_out = hw.inter_node_latency_us * 1e-6
    b_in = intra_bus_Bps(hw, kind)
    # Each device drives its share of the node's NICs (all devices communicate at once in
    # data/pipeline-parallel groups laid out side by side).
    b_out = inter_bus_Bps_per_node(hw, kind) / hw.devices_per_node
    if kind == "alltoall":
        # no hierarchical trick: of the (n-1)/n of the buffer a rank sends, (local-1)/n stays on the
        # fast links and (n-local)/n crosses the network; NCCL's all-to-all posts every peer's send and
        # receive in one group, so the NVLink and the network transfers run at the same time
        inside = np.where(n > 1, (local - 1) / n * size / b_in + (local - 1) * a_in, 0.0)
        across = np.where(nodes > 1, (n - local) / n * size / b_out + (nodes - 1) * a_out, 0.0)
        return np.maximum(inside, across)
    flat = {
        "allreduce": allreduce_seconds,
        "reduce_scatter": reduce_scatter_seconds,
        "allgather": allgather_seconds,
    }[kind]
    inside = flat(size, local, b_in, a_in)
    across = flat(size / local, nodes, b_out, a_out)
    return np.where(nodes > 1, inside + across, inside)


def tied_embedding_sync_seconds(vocab, hidden, tp, grad_bytes, pair_in_node, hw: HardwareProfile):
    """All-reduce of a tied embedding's two gradient copies between the first and the last pipeline
    stage, once per step after the backward (Megatron-LM's embedding group, Shoeybi et al. 2019):
    vocab x hidden / tp values of `grad_bytes` each over 2 ranks, over NVLink when both stages sit in
    one node (`pair_in_node`), else over the network. Arrays broadcast."""
    local = np.where(pair_in_node, 2.0, 1.0)
    return group_collective_seconds(
        "allreduce", vocab * hidden / np.asarray(tp, dtype=float) * grad_bytes, 2.0, local, hw
    )


# ------------------------------------------------------------------------ step terms (cost_models.step)

from dataclasses import dataclass  # noqa: E402

DDP_BUCKET_BYTES = 25 * 2**20
"""Gradient bucket of PyTorch DDP (bucket_cap_mb=25): the last bucket's reduction cannot overlap."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TpSeconds:
    """Tensor-parallel communication of one block and one micro-batch."""

    allreduce: np.ndarray
    """One all-reduce of the b s h activation over the tp group."""
    fwd: np.ndarray
    bwd: np.ndarray
    recompute: np.ndarray

    @property
    def total(self):
        return self.fwd + self.bwd + self.recompute


def tp_block_seconds(x) -> TpSeconds:
    """Megatron's f and g operators: 2 all-reduces of the b s h activation forward and 2 backward per
    block (Shoeybi et al. 2019, Sec. 3); with sequence parallelism a reduce-scatter + all-gather pair of
    the same volume (Korthikanti et al. 2022, Sec. 4.2.2); full recomputation repeats the forward's. An
    MoE block whose routed experts take the all-to-all path keeps only attention's pair (plus its shared
    experts'): cost_models.experts.mlp_tp_pair; its exchanges are cost_models.moe.ep_block_seconds."""
    ar = group_collective_seconds(
        "allreduce", x.tokens * x.spec.hidden * x.c, x.tp, x.local["T"], x.hw
    )
    pairs = 1.0 + mlp_tp_pair(x)
    return TpSeconds(
        allreduce=ar,
        fwd=pairs * ar,
        bwd=pairs * ar,
        recompute=x.full_share * pairs * ar * recompute_passes(x),
    )


def tp_exposed_seconds(x, tp: TpSeconds, block) -> np.ndarray:
    """Tensor-parallel communication a block adds to its time. Without overlap all of it. With the
    collectives split into chunks that run beside the GEMMs they feed and drain (Megatron-Core's
    tp_comm_overlap through Transformer Engine's userbuffers; torch's async TP; Wang et al. 2023,
    "Overlap communication with dependent computation via decomposition"), per pass only what exceeds
    that pass's GEMM time shows, and the hidden part still costs `overlap_interference` of its time:
        exposed = sum over fwd, bwd, recompute of  max(0, C - G) + i min(C, G)."""

    fwd, bwd, rec = tp_exposed_parts(x, tp, block)
    return fwd + bwd + rec


def tp_overlapped(enabled: bool, tp, sequence_parallel) -> np.ndarray:
    """Where the run overlaps its tensor-parallel collectives with the GEMMs: the option on, tp > 1
    and sequence parallelism on. Megatron-LM refuses --tp-comm-overlap without --sequence-parallel
    ('Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is
    enabled', megatron/training/arguments.py validate_args): Transformer Engine's userbuffers split
    the sequence-parallel all-gathers and reduce-scatters; torchtitan's async TP always runs with
    sequence parallelism."""
    return bool(enabled) & (np.asarray(tp) > 1) & np.asarray(sequence_parallel)


def tp_exposed_parts(x, tp: TpSeconds, block) -> tuple:
    """tp_exposed_seconds pass by pass: (forward, backward, recomputation) seconds a block's
    tensor-parallel communication adds (cost_models.timeline puts each pass on its own
    operation); overlapped only where `tp_overlapped`."""
    if not x.sw.tp_comm_overlap:
        return tp.fwd, tp.bwd, tp.recompute
    interference = eff(x.hw, "overlap_interference")
    on = tp_overlapped(x.sw.tp_comm_overlap, x.tp, x.sp)

    def shown(comm, gemm):
        hidden = np.minimum(comm, gemm)
        return np.where(on, comm - hidden + interference * hidden, comm)

    rec_gemm = x.full_share * block.gemm_fwd * recompute_passes(x)
    return (
        shown(tp.fwd, block.gemm_fwd),
        shown(tp.bwd, block.gemm_bwd),
        shown(tp.recompute, rec_gemm),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class CpSeconds:
    """Context-parallel key/value exchange of one block and one micro-batch."""

    exposed: np.ndarray
    """Time it adds to the block beyond the attention compute it overlaps."""
    total: np.ndarray
    """All of its communication time (hidden or not), for the interference of the hidden part."""


def cp_block_seconds(x, attn_fwd_s, attn_bwd_s) -> CpSeconds:
    """Keys and values of a sequence split over cp ranks (load-balanced causal split), per block:

    - p2p (ring attention; Liu et al. 2023, "Ring Attention"; Megatron-Core / Transformer Engine): in
      cp - 1 steps each rank passes its K, V block (b s/cp 2 kv/tp c bytes) to the next while computing
      attention on the one it has, so only max(0, send - attention/cp) per step shows; the backward
      passes K, V and their gradients (twice the bytes) beside the backward attention.
    - all_gather (Megatron's all_gather cp_comm_type, torch's allgather rotation): all-gather K, V of the
      whole sequence before attention (forward, and again in the backward with a reduce-scatter of
      their gradients), not overlapped.
    - a2a (DeepSpeed-Ulysses; Jacobs et al. 2023): all-to-alls of Q, K, V and the output between sequence
      and head sharding, forward and backward, not overlapped.
    Links: NVLink when the C group stays in the node (NVLink domain), else the device's network share."""
    n = x.cp
    kv_block = x.b * (x.seq / n) * 2.0 * x.spec.kv_width / x.tp * x.c
    in_node = x.local["C"] >= n
    bw = np.where(
        in_node,
        intra_bus_Bps(x.hw, "p2p"),
        inter_bus_Bps_per_node(x.hw, "p2p") / x.hw.devices_per_node,
    )
    lat = np.where(in_node, x.hw.intra_node_latency_us, x.hw.inter_node_latency_us) * 1e-6
    steps = np.maximum(n - 1.0, 0.0)
    send = p2p_seconds(kv_block, bw, lat)
    ring_total = steps * 3.0 * send
    ring_exposed = steps * (
        np.maximum(0.0, send - attn_fwd_s / n) + np.maximum(0.0, 2.0 * send - attn_bwd_s / n)
    )
    kv_full = kv_block * n
    gather = group_collective_seconds("allgather", kv_full, n, x.local["C"], x.hw)
    rs = group_collective_seconds("reduce_scatter", kv_full, n, x.local["C"], x.hw)
    gather_total = 2.0 * gather + rs
    qkvo = x.b * (x.seq / n) * (2.0 * x.spec.attn_width + 2.0 * x.spec.kv_width) / x.tp * x.c
    a2a_total = 2.0 * group_collective_seconds("alltoall", qkvo, n, x.local["C"], x.hw)
    kind = x.cp_comm
    total = np.select(
        [kind == CP_COMMS.index("p2p"), kind == CP_COMMS.index("all_gather")],
        [ring_total, gather_total],
        a2a_total,
    )
    exposed = np.select(
        [kind == CP_COMMS.index("p2p"), kind == CP_COMMS.index("all_gather")],
        [ring_exposed, gather_total],
        a2a_total,
    )
    on = n > 1
    return CpSeconds(exposed=np.where(on, exposed, 0.0), total=np.where(on, total, 0.0))


def pp_p2p_seconds(x, hop=None):
    """Blocking sends between pipeline stages on the critical path: 2 (m v + p - 1) hops
    (cost_models.pipeline.p2p_transfers_on_critical_path) of the b s h activation, 1/tp of it with
    sequence parallelism or Megatron's scatter/gather (plus the receiving node's all-gather), over
    NVLink when the pp group stays in a node, else the device's share of the node's NICs.
    The interleaved schedule with overlapped sends (Software.overlap_p2p, Megatron-Core's
    overlap_p2p_comm) waits only for the fill's and the drain's 2 (p - 1) hops and pays
    `overlap_interference` of the 2 m v sends it hides, as the simulated step does
    (cost_models.timeline)."""
    hop = pp_hop_seconds(x) if hop is None else hop
    overlapped = x.is_schedule("interleaved-1f1b") & (x.v > 1) & x.sw.overlap_p2p & (x.pp > 1)
    hidden = 2.0 * x.m * x.v * hop
    shown = 2.0 * (x.pp - 1.0) * hop + eff(x.hw, "overlap_interference") * hidden
    return np.where(overlapped, shown, p2p_transfers_on_critical_path(x.pp, x.m, x.v) * hop)


def pp_hop_seconds(x):
    """One activation (or gradient) send between adjacent pipeline stages (pp_p2p_seconds' hop):
    the b s h activation, 1/tp of it with sequence parallelism or the stack's scatter/gather plus
    the receiving node's all-gather; NVLink when the pp group stays in a node, else the device's
    share of the node's NICs."""
    msg = x.tokens * x.spec.hidden * x.c
    scatter = x.sw.framework.pp_scatter_gather
    in_node = x.local["P"] >= x.pp
    bw = np.where(
        in_node,
        intra_bus_Bps(x.hw, "p2p"),
        inter_bus_Bps_per_node(x.hw, "p2p") / x.hw.devices_per_node,
    )
    lat = np.where(in_node, x.hw.intra_node_latency_us, x.hw.inter_node_latency_us) * 1e-6
    hop = p2p_seconds(msg / np.where(x.sp | scatter, x.tp, 1.0), bw, lat)
    gather = group_collective_seconds("allgather", msg, x.tp, x.local["T"], x.hw)
    return hop + np.where(x.sp | (not scatter), 0.0, gather)


def _reduction_seconds(x, params, group, shard, local_group, local_shard, local_replicas):
    """(all-reduce or its sharded equivalent, reduce-scatter, all-gather) seconds of one parameter set
    reduced over `group` ranks and ZeRO-sharded over `shard` of them (hybrid sharding: reduce-scatter and
    all-gather inside the shard group, all-reduce of each shard over the group / shard replicas)."""
    s = x.sw.state_bytes(x.precision)
    grad_bytes = params * s.reduce
    replicas = group / shard
    allreduce = group_collective_seconds("allreduce", grad_bytes, group, local_group, x.hw)
    rs = group_collective_seconds("reduce_scatter", grad_bytes, shard, local_shard, x.hw)
    gather = group_collective_seconds("allgather", params * s.gather, shard, local_shard, x.hw)
    # hybrid sharding (HSDP, MiCS, Megatron's distributed-optimizer instances): reduce-scatter and
    # all-gather inside the shard group, then all-reduce each shard over the replicas
    across = group_collective_seconds(
        "allreduce", grad_bytes / shard, replicas, local_replicas, x.hw
    )
    hybrid = (replicas > 1) & (x.zero >= 1)
    sharded_reduce = rs + np.where(hybrid, across, 0.0)
    allreduce = np.where(hybrid, sharded_reduce + gather, allreduce)
    some = (
        np.asarray(params) > 0
    )  # no parameters in the set (a dense model's experts): no collective
    return tuple(np.where(some, t, 0.0) for t in (allreduce, sharded_reduce, gather))


def dp_reduction_parts(x, params_rank) -> tuple:
    """(all-reduce or its sharded equivalent, reduce-scatter, all-gather) seconds of one rank's
    parameters: the dense ones over dp x cp sharded over the shard group, the routed experts over
    their expert data-parallel group (_reduction_seconds of each, summed: both reductions run in
    the same backward)."""
    loc = x.local
    dense = _reduction_seconds(
        x, params_rank.dense, x.grad_group, x.shard_group, loc["DC"], loc["S"], loc["R"]
    )
    expert = _reduction_seconds(
        x, params_rank.expert, x.expert_dp, x.expert_shard_group, loc["ED"], loc["ES"], loc["ER"]
    )
    return tuple(d + e for d, e in zip(dense, expert))


def dp_comm_seconds(x, params_rank, last_backward_s, compute_s):
    """Exposed data-parallel / ZeRO communication per step (Rajbhandari et al. 2020, Sec. 7):
    - ZeRO 0-2: the gradients' all-reduce volume once per step (RS + AG for 1-2), bucket by bucket
      under the last micro-batch's backward (`last_backward_s`); the last bucket cannot hide. ZeRO-2
      keeps only a gradient shard, so with accumulation every other micro-batch reduce-scatters too
      (m - 1 extra, each under its own backward).
    - ZeRO-3: per micro-batch all-gather of the parameters forward and backward and reduce-scatter of
      the gradients, hidden under the m micro-batches' compute (`compute_s`) except the last bucket.
    `params_rank` is a cost_models.moe.RankParams: the dense parameters reduce over dp x cp and shard
    over the shard group, the routed experts over the expert data-parallel group tp cp dp / (ep
    expert_tp) (Megatron-Core's expert data-parallel group; its distributed optimizer shards expert
    states over it), and both reductions run in the same backward.
    Without overlap (framework or run) everything is exposed. Hidden traffic still costs
    `overlap_interference` of its time (NCCL takes SMs and memory bandwidth). Tied embeddings split
    over a pipeline add their first/last-stage gradient all-reduce after the backward."""
    s = x.sw.state_bytes(x.precision)
    grad_bytes = params_rank.total * s.reduce
    allreduce, rs, gather = dp_reduction_parts(x, params_rank)
    tail = np.minimum(1.0, DDP_BUCKET_BYTES / np.maximum(grad_bytes, 1.0))
    overlap = x.sw.overlap_grad_reduce

    def exposed(t, under):
        return np.maximum(t - (1 - tail) * under, tail * t) if overlap else t

    extra_rs = np.where((x.zero == 2) & (x.m > 1), x.m - 1.0, 0.0)
    # DeepSpeed's BF16_Optimizer all-reduces the whole gradient, then all-gathers the updated parameters from
    # their owners after the step (bf16_optimizer.py step: all_gather_dp_groups): one all-gather more than ZeRO-1
    after_step = np.where(x.sw.bf16_optimizer, gather, 0.0)
    low_total = allreduce + extra_rs * rs + after_step
    low_exposed = (
        exposed(allreduce, last_backward_s) + extra_rs * exposed(rs, last_backward_s) + after_step
    )
    z3_total = x.m * (2.0 * gather + rs)
    z3_exposed = (
        np.maximum(z3_total - compute_s, tail * rs)
        if overlap
        else x.m * rs + np.maximum(0.0, x.m * 2.0 * gather - compute_s)
    )
    total = np.where(x.zero >= 3, z3_total, low_total)
    shown = np.where(x.zero >= 3, z3_exposed, low_exposed)
    out = shown + eff(x.hw, "overlap_interference") * (total - shown)
    if x.spec.tied_embeddings:
        # DeepSpeed's PipelineEngine all-reduces the tied weight's fp32 gradient under BF16_Optimizer
        # (weight._hp_grad; pipe/engine.py _exec_reduce_tied_grads, v0.6.5), the 16-bit .grad otherwise
        tied_bytes = 4.0 if x.sw.bf16_optimizer else s.reduce
        tied = tied_embedding_sync_seconds(
            x.spec.vocab, x.spec.hidden, x.tp, tied_bytes, x.local["P"] >= x.pp, x.hw
        )
        out = out + np.where(x.pp > 1, tied, 0.0)
    return out
