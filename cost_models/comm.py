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

from cost_models.blocks import BLOCK_SCALED_SCALINGS, quantized_bytes
from cost_models.compute import eff, recompute_passes
from cost_models.experts import legacy_dispatch, mlp_tp_pair
from cost_models.flops import ATTENTION_CORE_GEMMS, block_gemm_shapes
from cost_models.pipeline import p2p_transfers_on_critical_path, warmup_forwards
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


def allreduce_latency_steps(n):
    """Latency steps of the flat all-reduce: the ring's 2 (n - 1) (Patarasuk & Yuan 2009) or the
    double binary tree's 2 log2 n (NCCL >= 2.4; Sanders, Speck & Traeff 2009), whichever is fewer:
    their bandwidth terms are equal, so the faster algorithm, the one NCCL's tuner picks, is the
    one with fewer steps. `planner hardware calibrate` fits the latency per step with this count,
    so a calibrated profile gives back its measured small all-reduces."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, np.minimum(2 * (n - 1), 2 * np.log2(np.maximum(n, 1))), 0.0)


def allreduce_seconds(size_bytes, n, bw_Bps, latency_s):
    """Flat all-reduce, the faster of ring and tree: 2 (n-1)/n S / B + allreduce_latency_steps
    alpha; 0 when n == 1."""
    n = np.asarray(n, dtype=float)
    return np.where(
        n > 1,
        2 * (n - 1) / n * size_bytes / bw_Bps + allreduce_latency_steps(n) * latency_s,
        0.0,
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


def ring_latency_seconds(n, local, hw: HardwareProfile):
    """Latency of one ring all-gather or reduce-scatter over n ranks of which `local` share each
    node: n - 1 ring steps, nodes - 1 of them over the network (NCCL's tuning model,
    src/graph/tuning.cc ncclTopoTuneModel: (nsteps - nInterSteps) intraLat + nInterSteps interLat
    with nsteps = nRanks - 1, nInterSteps = nNodes - 1). NCCL runs these two as one flat ring over
    all the ranks, so unlike group_collective_seconds' hierarchical form every rank of every node is
    a step. Arrays broadcast."""
    n = np.asarray(n, dtype=float)
    nodes = n / np.minimum(np.asarray(local, dtype=float), n)
    inside = (n - nodes) * hw.intra_node_latency_us * 1e-6
    return np.where(n > 1, inside + (nodes - 1.0) * hw.inter_node_latency_us * 1e-6, 0.0)


SHARD_ROOT_COLLECTIVES = 2.0
"""Collectives of the root unit (embedding, final norm, head) per micro-batch: one all-gather and
one reduce-scatter. FSDP1 keeps the root's gathered parameters from its forward to its backward
(torch/distributed/fsdp/_runtime_utils.py, _post_forward_reshard skips the root under FULL_SHARD),
and FSDP2 stacks leave the last module unresharded after the forward (torchtitan's apply_fsdp,
reshard_after_forward False for the last block)."""


def shard_unit_latency_seconds(x):
    """Per step: the ring latency of the per-block collectives of FSDP-style sharding
    (FrameworkProfile.shard_per_block), ZeRO 2-3 only. Each wrapped block has its own collectives
    every micro-batch: ZeRO-3 (FULL_SHARD, fully_shard) an all-gather before its forward, another
    before its backward and a reduce-scatter after it; ZeRO-2 (SHARD_GRAD_OP) keeps the gathered
    parameters to the backward, so one all-gather and one reduce-scatter (FSDP docs, "FSDP Notes";
    Zhao et al. 2023, PyTorch FSDP, Sec. 3.2), plus the root's SHARD_ROOT_COLLECTIVES. Each pays
    ring_latency_seconds over the shard group; with hybrid sharding each block's reduced shard is
    also all-reduced over the replicas (HYBRID_SHARD; the latency of group_collective_seconds'
    all-reduce of nothing). The bandwidth part of these collectives runs under the compute
    (dp_comm_seconds); this latency is counted exposed: every collective is a point where all the
    group's ranks meet, a ring step at a time, and on llm-foundry's weak-scaling rows (same model and
    micro-batch, 16 to 128 A100s) the step grows by about what this term gives."""
    if not x.sw.framework.shard_per_block:
        return np.zeros_like(np.asarray(x.dp, dtype=float))
    per_block = np.where(x.zero >= 3, 3.0, 2.0)
    collectives = per_block * x.blocks_most + SHARD_ROOT_COLLECTIVES
    shard = ring_latency_seconds(x.shard_group, x.local["S"], x.hw)
    replicas = x.grad_group / x.shard_group
    across = group_collective_seconds("allreduce", 0.0, replicas, x.local["R"], x.hw)
    per_step = x.m * (collectives * shard + (x.blocks_most + 1.0) * across)
    return np.where(x.zero >= 2, per_step, 0.0)


AMAX_BYTES_PER_GEMM = 3 * 4.0
"""Amaxes one linear GEMM adds to a delayed-scaling reduction: its three FP8 tensors of the forward
(input, weight, output; the backward's two are fewer), fp32 each (Transformer Engine
module/base.py: fp8_meta["scaling_fwd"] holds num_gemms x 3 amaxes)."""


def fp8_amax_reduction_seconds(x):
    """Per step: Transformer Engine's delayed-scaling amax reductions (fp8_scaling "delayed"). At
    the exit of the outermost fp8_autocast, and at the end of the backward of the region it wrapped,
    TE concatenates the region's amaxes and all-reduces them (max) with async_op=False, so the
    compute stream waits for it, before its fused scale update (transformer_engine/pytorch/fp8.py,
    FP8GlobalStateManager.reduce_and_update_fp8_tensors, v1.6-v2.x). Megatron-Core wraps each model
    chunk's blocks in one fp8_autocast whose group is the amax reduction group, the tensor x data (x
    context) parallel ranks of a pipeline stage (transformer_block.py; parallel_state.py
    get_amax_reduction_group, core 0.7-0.19), so each micro-batch's forward and backward of each
    chunk pays one latency-bound all-reduce over dp tp cp ranks: 2 m v per step (v = 1 without the
    interleaved schedule). Its buffer holds the amaxes of every module of the rank that registered
    under that recipe and group (the buffer is keyed by them), 3 per linear GEMM of its blocks. A
    stack that wraps the whole model in one region pays 2 m over the world, the same count with one
    stage. Current and block scaling reduce no history (TE 2.8: a no-op for them). Not counted: the
    reductions full recomputation adds where TE re-enters fp8_autocast in the recomputed forward
    (its checkpoint, TE >= 2.2)."""
    delayed = (x.precision == "fp8") and (x.sw.fp8_scaling == "delayed")
    if not delayed:
        return np.zeros_like(np.asarray(x.dp, dtype=float))
    chunks = np.where(x.is_schedule("interleaved-1f1b"), x.v, 1.0)
    gemms = sum(g.name not in ATTENTION_CORE_GEMMS for g in block_gemm_shapes(x.spec, 1, 1))
    amax_bytes = AMAX_BYTES_PER_GEMM * gemms * x.blocks_most
    group = x.dp * x.tp * x.cp
    reduce = group_collective_seconds("allreduce", amax_bytes, group, x.local["TDC"], x.hw)
    return 2.0 * x.m * chunks * np.where(group > 1, reduce, 0.0)


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
    pair_fwd: np.ndarray | None = None
    """The forward's all-gather + reduce-scatter pair (or all-reduce) of one side of the block, the
    attention's or the MLP's: the part of `fwd` the linear layers' collectives make."""
    pair_bwd: np.ndarray | None = None
    gather_fwd: np.ndarray | None = None
    """The all-gather's part of `pair_fwd` (tp_pairs_and_gathers; None: half of it); the
    reduce-scatter is the rest."""
    gather_bwd: np.ndarray | None = None
    mlp_linear: np.ndarray | bool = True
    """The MLP's linear layers make a pair too (the rest of `fwd` is an MoE dispatcher's gather)."""

    @property
    def total(self):
        return self.fwd + self.bwd + self.recompute

    def gathers(self) -> tuple:
        """(forward, backward) all-gather part of a side's pair: gather_fwd / gather_bwd, half of
        pair_fwd / pair_bwd where not given (both halves move the same volume)."""
        fwd = 0.5 * np.asarray(self.pair_fwd) if self.gather_fwd is None else self.gather_fwd
        bwd = 0.5 * np.asarray(self.pair_bwd) if self.gather_bwd is None else self.gather_bwd
        return fwd, bwd


def tp_block_seconds(x) -> TpSeconds:
    """Megatron's f and g operators: 2 all-reduces of the b s h activation forward and 2 backward
    per block (Shoeybi et al. 2019, Sec. 3); with sequence parallelism a reduce-scatter + all-gather
    pair of the same volume (Korthikanti et al. 2022, Sec. 4.2.2), its all-gather quantized under
    FP8 where the stack's linear layers gather so (tp_pair_seconds); full recomputation repeats the
    forward's. An MoE block whose routed experts take the all-to-all path keeps only attention's
    pair (plus its shared experts'): cost_models.experts.mlp_tp_pair; the all-gather dispatcher's
    pair is its own 16-bit gather (Megatron-Core's MoEAllGatherTokenDispatcher calls
    gather_from_sequence_parallel_region); its exchanges are cost_models.moe.ep_block_seconds."""
    ar = group_collective_seconds(
        "allreduce", x.tokens * x.spec.hidden * x.c, x.tp, x.local["T"], x.hw
    )
    pair_f, pair_b, gather_f, gather_b = tp_pairs_and_gathers(x, ar)
    mlp = np.asarray(mlp_tp_pair(x), dtype=bool)
    by_dispatcher = mlp & legacy_dispatch(x) if x.spec.moe is not None else False
    linear_mlp = mlp & ~by_dispatcher  # the MLP's pair through the stack's linear layers
    return TpSeconds(
        allreduce=ar,
        fwd=(1.0 + linear_mlp) * pair_f + by_dispatcher * ar,
        bwd=(1.0 + linear_mlp) * pair_b + by_dispatcher * ar,
        recompute=x.full_share
        * ((1.0 + linear_mlp) * pair_f + by_dispatcher * ar)
        * recompute_passes(x),
        pair_fwd=pair_f,
        pair_bwd=pair_b,
        gather_fwd=gather_f,
        gather_bwd=gather_b,
        mlp_linear=linear_mlp,
    )


def tp_pair_seconds(x, allreduce_s) -> tuple:
    """(forward, backward) seconds of one tensor-parallel collective of a block's b s h activation
    (tp_pairs_and_gathers)."""
    return tp_pairs_and_gathers(x, allreduce_s)[:2]


def tp_pairs_and_gathers(x, allreduce_s) -> tuple:
    """(forward, backward) seconds of one tensor-parallel collective of a block's b s h activation,
    then the (forward, backward) all-gather part of each (half of it where the pair's two halves
    move the same volume): `allreduce_s`, the 16-bit all-reduce, or under sequence parallelism
    its all-gather + reduce-scatter pair of the same volume. A stack whose linear layers
    quantize before they gather under the run's recipe (FrameworkProfile.fp8_tp_gather:
    Transformer Engine casts the norm output before the column-parallel all-gather of the
    forward and the output gradient before the row-parallel one of the backward; torchao's
    tensorwise float8 styles likewise) gathers the recipe's bytes (blocks.quantized_bytes); the
    backward gathers both orientations of a block-scaled gradient (blocks.BLOCK_SCALED_SCALINGS:
    TE sets the grad-output quantizer's row- and column-wise usage, and _all_gather_mxfp8 /
    _all_gather_nvfp4 gather both; a tensorwise FP8 copy is gathered row-wise and transposed
    after). The reduce-scatter stays 16-bit: the pair saves what its all-gather no longer moves."""
    half = 0.5 * np.asarray(allreduce_s)
    if x.precision != "fp8" or x.sw.fp8_scaling not in x.sw.framework.fp8_tp_gather:
        return allreduce_s, allreduce_s, half, half
    elements = x.tokens * x.spec.hidden

    def gather(nbytes):
        return group_collective_seconds("allgather", elements * nbytes, x.tp, x.local["T"], x.hw)

    full, once = gather(x.c), gather(quantized_bytes(x.sw.fp8_scaling))
    both_orientations = x.sw.fp8_scaling in BLOCK_SCALED_SCALINGS
    backward = gather(2.0 * quantized_bytes(x.sw.fp8_scaling)) if both_orientations else once
    pairs = tuple(np.where(x.sp, allreduce_s - (full - g), allreduce_s) for g in (once, backward))
    return (*pairs, *(np.where(x.sp, g, half) for g in (once, backward)))


def tp_exposed_seconds(x, tp: TpSeconds, block) -> np.ndarray:
    """Tensor-parallel communication a block adds to its time. Without overlap all of it. With the
    collectives split into chunks that run beside the GEMMs they feed and drain (Megatron-Core's
    tp_comm_overlap through Transformer Engine's userbuffers; torch's async TP; Wang et al. 2023,
    "Overlap communication with dependent computation via decomposition"), each collective hides
    only under the GEMM it is decomposed with (compute.TP_PAIRED_GEMMS: the all-gather under the
    QKV or fc1 GEMM, the reduce-scatter under the projection or fc2 one, in the backward under
    their dgrad or wgrad of the same size), and the hidden part still costs `overlap_interference`
    of its time:
        exposed = sum over passes and collectives of  max(0, c - G_paired) + i min(c, G_paired),
    c a side's all-gather or reduce-scatter (tp_pairs_and_gathers: the all-gather smaller where the
    stack gathers in FP8). A gather the MoE dispatcher makes hides under the GEMMs left over."""

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
    operation); overlapped only where `tp_overlapped`, elsewhere the backward as the stack issues
    it without the overlap (_async_backward, where its column-parallel layers launch their
    collectives asynchronously). Such a stack's column-parallel layers keep only their input's
    sequence-parallel shard and re-gather it in the backward; with the overlap, userbuffers run
    that all-gather in a bulk overlap beside the data-gradient GEMM (Transformer Engine's
    LayerNormLinear backward; NeMo's userbuffer configurations name it qkv_dgrad / fc1_dgrad,
    method bulk), paired with QKV's or fc1's GEMM like the other collectives."""
    interference = eff(x.hw, "overlap_interference")
    paired = getattr(block, "tp_paired_fwd", None)
    plain_bwd = tp.bwd
    if x.sw.framework.tp_backward_async and paired is not None and tp.pair_bwd is not None:
        plain_bwd = _async_backward(x, tp, paired, interference)
    if not x.sw.tp_comm_overlap:
        return tp.fwd, plain_bwd, tp.recompute
    on = tp_overlapped(x.sw.tp_comm_overlap, x.tp, x.sp)

    def shown(comm, gemm):
        return np.where(on, _beside(comm, gemm, interference), comm)

    if paired is None or tp.pair_fwd is None:  # no GEMM by pair: each pass against all its GEMMs
        rec_gemm = x.full_share * block.gemm_fwd * recompute_passes(x)
        return (
            shown(tp.fwd, block.gemm_fwd),
            shown(tp.bwd, block.gemm_bwd),
            shown(tp.recompute, rec_gemm),
        )
    gather_f, gather_b = tp.gathers()
    # forward: the gathers feed QKV and fc1, the scatters drain the projection and fc2; backward:
    # the gathers of the output gradient feed the projection's and fc2's dgrad, the scatters drain
    # QKV's and fc1's
    fwd_parts = (gather_f, np.asarray(tp.pair_fwd) - gather_f)
    bwd_parts = (np.asarray(tp.pair_bwd) - gather_b, gather_b)
    fwd = _paired_shown(tp.fwd, fwd_parts, tp.mlp_linear, paired, block.gemm_fwd, shown)
    bwd = _paired_shown(tp.bwd, bwd_parts, tp.mlp_linear, paired, block.gemm_bwd, shown)
    if x.sw.framework.tp_backward_async:  # the input's re-gather, in userbuffers' bulk overlap
        mlp = np.asarray(tp.mlp_linear, dtype=float)
        bwd = bwd + shown(gather_f, paired[0]) + mlp * shown(gather_f, paired[2])
    return fwd, np.where(on, bwd, plain_bwd), x.full_share * fwd * recompute_passes(x)


def _beside(comm, gemm, interference):
    """What a collective of `comm` seconds run beside a GEMM of `gemm` seconds adds: the part the
    GEMM cannot hide, and `interference` of the part it hides, max(0, c - G) + i min(c, G)."""
    hidden = np.minimum(comm, gemm)
    return comm - hidden + interference * hidden


def _async_backward(x, tp: TpSeconds, paired, interference) -> np.ndarray:
    """The backward's exposed tensor-parallel time of a stack whose column-parallel layers launch
    their collectives beside their own GEMMs (FrameworkProfile.tp_backward_async; Megatron-Core's
    LinearWithGradAccumulationAndAsyncCommunication.backward), per side of the block (attention's
    QKV, the MLP's fc1), G the side's column-parallel GEMM (its data- and weight-gradient GEMMs take
    the forward one's time each), i the interference of hidden communication:
      sequence parallelism: the all-gather of the row-parallel layer's output gradient shows
        (gather_bwd); the layer saved only its input's shard, so it re-gathers the input (the
        forward's gather_fwd) beside the data gradient and reduce-scatters the input gradient beside
        the weight gradient: g + (r - h_r + i h_r) + (s - h_s + i h_s), h = min(collective, G);
      otherwise: the input gradient's all-reduce (the pair) beside the weight gradient.
    What an MoE dispatcher gathers shows whole."""

    def shown(comm, gemm):
        return _beside(comm, gemm, interference)

    pair = np.asarray(tp.pair_bwd)
    regather, gather = tp.gathers()
    sp = np.asarray(x.sp, dtype=bool)
    qkv, fc1 = (
        np.where(sp, gather + shown(regather, g) + shown(pair - gather, g), shown(pair, g))
        for g in (paired[0], paired[2])
    )
    mlp = np.asarray(tp.mlp_linear, dtype=float)
    return qkv + mlp * fc1 + np.asarray(tp.bwd) - (1.0 + mlp) * pair


def _paired_shown(total, parts, mlp_linear, paired, gemm_s, shown):
    """One pass of tp_exposed_parts: each linear layer's collective against its paired GEMM,
    `parts` the (input-side, output-side) collective of a side (attention's two always, the MLP's
    two where it has them), the rest of `total` (an MoE dispatcher's gather) against the pass's
    GEMM time those left."""
    sides = (1.0, 1.0, mlp_linear, mlp_linear)
    comms = (parts[0], parts[1], parts[0], parts[1])
    linear = sum(side * shown(c, g) for side, c, g in zip(sides, comms, paired))
    used = sum(side * g for side, g in zip(sides, paired))
    pair = np.asarray(parts[0]) + np.asarray(parts[1])
    rest = np.asarray(total) - (1.0 + np.asarray(mlp_linear, dtype=float)) * pair
    return linear + shown(rest, np.maximum(0.0, gemm_s - used))


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


def _reduction_seconds(x, params, gemm, group, shard, local_group, local_shard, local_replicas):
    """(all-reduce or its sharded equivalent, reduce-scatter, all-gather) seconds of one parameter set
    reduced over `group` ranks and ZeRO-sharded over `shard` of them (hybrid sharding: reduce-scatter and
    all-gather inside the shard group, all-reduce of each shard over the group / shard replicas); its
    `gemm` weights gathered in FP8 where the run says so (_gathered_bytes)."""
    s = x.sw.state_bytes(x.precision)
    grad_bytes = params * s.reduce
    replicas = group / shard
    allreduce = group_collective_seconds("allreduce", grad_bytes, group, local_group, x.hw)
    rs = group_collective_seconds("reduce_scatter", grad_bytes, shard, local_shard, x.hw)
    gathered = _gathered_bytes(x, params, gemm, s.gather)
    gather = group_collective_seconds("allgather", gathered, shard, local_shard, x.hw)
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


def _gathered_bytes(x, params, gemm, gather_bytes):
    """Bytes one rank's parameter all-gather moves for `params` of which `gemm` are GEMM weights:
    the parameter dtype's `gather_bytes` each, the GEMM weights in the recipe's low precision
    (blocks.quantized_bytes) where the run gathers them so (Software.fp8_param_gather)."""
    fp8 = x.sw.gathers_fp8(x.precision, x.zero)
    low = quantized_bytes(x.sw.fp8_scaling)
    return params * gather_bytes - np.where(fp8, gemm * (gather_bytes - low), 0.0)


def dp_reduction_parts(x, params_rank) -> tuple:
    """(all-reduce or its sharded equivalent, reduce-scatter, all-gather) seconds of one rank's
    parameters: the dense ones over dp x cp sharded over the shard group, the routed experts over
    their expert data-parallel group (_reduction_seconds of each, summed: both reductions run in
    the same backward)."""
    loc, p = x.local, params_rank
    dense = _reduction_seconds(
        x, p.dense, p.dense_gemm, x.grad_group, x.shard_group, loc["DC"], loc["S"], loc["R"]
    )
    expert = _reduction_seconds(
        x, p.expert, p.expert, x.expert_dp, x.expert_shard_group, loc["ED"], loc["ES"], loc["ER"]
    )
    return tuple(d + e for d, e in zip(dense, expert))


def dp_chunks(x) -> np.ndarray:
    """Model chunks per pipeline rank whose gradients reduce apart: v in the interleaved schedule
    (Narayanan et al. 2021, Sec. 2.2.2), 1 otherwise (cost_models.timeline.simulate). The one
    count of them: the buckets here and cost_models.timeline.rank_work's read it."""
    return np.where(x.is_schedule("interleaved-1f1b") & (x.v > 1), x.v, 1.0)


def gradient_buckets(x, params) -> np.ndarray:
    """Gradient buckets per model chunk of a rank with `params` parameters: buckets of
    max(floor, per_rank x dp) parameters where the stack says so (FrameworkProfile.
    grad_bucket_params: NVIDIA's Megatron recipes fix 128 Mi parameters; Megatron-Core's own
    default is max(40M, 1M x dp)), else PyTorch DDP's 25 MiB of the gradients in their reduce
    dtype (Software.state_bytes). The one count: dp_comm_seconds and
    cost_models.timeline.rank_work read it."""
    chunks = dp_chunks(x)
    sized = x.sw.framework.grad_bucket_params
    if sized is None:
        grad_bytes = params * x.sw.state_bytes(x.precision).reduce
        return np.maximum(1.0, np.ceil(grad_bytes / chunks / DDP_BUCKET_BYTES))
    floor, per_rank = sized
    return np.maximum(1.0, np.ceil(params / chunks / np.maximum(floor, per_rank * x.dp)))


def _step_reductions_exposed(x, once, buckets, backward_s, forward_s, compute_end_s, start_s):
    """Exposed part of rank 0's gradient reductions with Megatron-Core's overlap_grad_reduce
    (DistributedDataParallel: a bucket's collective starts when all its gradients of the last
    micro-batch are ready; docs "distributed optimizer"), as the timeline drains them
    (cost_models.timeline._dp_jobs, _drain): jobs of s = once / v seconds, each leaving in n
    buckets evenly over a backward of one chunk b = backward_s / v, one per chunk after its last
    backward (ZeRO 0-1), one after every backward (ZeRO-2 with accumulation). The FIFO stream ends
    after the job k from the end at e_k + max(s - b (1 - 1/n), s / n) + k s (_drain: the k jobs
    after it queue behind), e_k = T - D_k its backward's end, T the compute end. D_k is piecewise
    linear in k, so the largest end is at a break:
    - ZeRO 0-1, interleaved: chunk c's last backward ends c p b before T, and not before the
      rank's first backward ends (its warm-up forwards, pipeline.warmup_forwards of rank 0, then
      micro-batch 0's forward through the p stages and backward back, p F + p B / v): the last
      round's p backwards of each chunk c - 1, .., 0 follow it, or with m < p the backward's way
      down the p stages (Narayanan et al. 2021, Sec. 2.2.2). Read at c = 0 and v - 1. The v - 1
      chunks' p b are held to the rank's m v - 1 other backwards, so the hidden time grows no
      faster than the m backwards that make it, and the step and the search's bound never fall as
      recomputation lengthens the backward (with m < p it hides less than the timeline).
    - ZeRO-2: m v jobs, the first after the rank's first backward, the last at T, spread over the
      step between (its bubbles and sends included, as T holds them): read at the last and the
      first.
    And never before start_s + the stream's whole work (after the parameter gather that the
    stream runs first with overlap_param_gather)."""
    v = dp_chunks(x)
    share, chunk_b = once / v, backward_s / v
    last = np.maximum(share - chunk_b * (1.0 - 1.0 / buckets), share / buckets)
    warm = warmup_forwards(x.pp, 0, x.m, v, gpipe=x.is_schedule("gpipe")) * forward_s / v
    first_end = np.maximum(warm, x.pp * forward_s) + x.pp * backward_s / v
    cool_down = np.minimum(
        np.minimum((v - 1.0) * x.pp, x.m * v - 1.0) * chunk_b,
        np.maximum(0.0, compute_end_s - first_end),
    )
    chunks = np.maximum(0.0, (v - 1.0) * share - cool_down)
    every = (x.zero == 2) & (x.m > 1)
    jobs = np.where(every, x.m * v, v)
    micro = np.maximum(0.0, first_end + (jobs - 1.0) * share - compute_end_s)
    spread = np.where(every, micro, chunks)
    return np.maximum(last + spread, start_s + jobs * share - compute_end_s)


def _param_gather_gate_seconds(x, gather, buckets, forward_s):
    """What the first forwards wait for their parameters with overlap_param_gather (Megatron-Core
    --overlap-param-gather: the distributed optimizer's all-gather runs at the start of the next
    step, bucket by bucket in the order the forward uses them): chunk c's first bucket is there at
    c G/v + G/(v n) (cost_models.timeline._gather_gates) and rank 0 starts that chunk's forwards
    after the first round's q0 = min(p, m) forwards of each chunk before it, q0 f each (f =
    forward_s / v), so the rank waits G/(v n), then c (G/v - q0 f) more where the gather runs
    ahead of the forwards."""
    v = dp_chunks(x)
    first_round = np.minimum(x.pp, x.m)
    behind = (v - 1.0) * np.maximum(0.0, (gather - first_round * forward_s) / v)
    return gather / (v * buckets) + behind


def _step_collectives_seconds(x, parts, buckets, backward_s, forward_s, compute_end_s):
    """(total, exposed, gather wait) seconds of ZeRO 0-2's collectives of a step, as the timeline's
    RankWork holds them (cost_models.timeline.rank_work): all-reduce for ZeRO-0 and
    BF16_Optimizer, reduce-scatter (every micro-batch's under ZeRO-2) and all-gather for ZeRO 1-2,
    the all-gather after BF16_Optimizer's step too."""
    allreduce, rs, gather = parts
    bf16 = x.sw.bf16_optimizer
    once = np.where((x.zero == 0) | bf16, allreduce, rs)
    step_gather = np.where((x.zero >= 1) | bf16, gather, 0.0)
    overlap = x.sw.overlap_grad_reduce
    early = overlap and x.sw.overlap_param_gather and not bf16
    reductions = np.where((x.zero == 2) & (x.m > 1), x.m, 1.0) * once
    shown = reductions
    if overlap:
        start_s = step_gather if early else 0.0
        shown = _step_reductions_exposed(
            x, once, buckets, backward_s, forward_s, compute_end_s, start_s
        )
    if not early:
        return reductions + step_gather, shown + step_gather, 0.0
    gate = _param_gather_gate_seconds(x, step_gather, buckets, forward_s)
    return reductions + step_gather, shown, gate


def dp_comm_seconds(
    x, params_rank, last_backward_s, compute_s, *, forward_s=0.0, compute_end_s=None
):
    """Exposed data-parallel / ZeRO communication per step (Rajbhandari et al. 2020, Sec. 7), by
    the mechanism the simulated step runs (cost_models.timeline: rank_work, _rank_span) on the
    rank with the most parameters (`params_rank`, a cost_models.moe.RankParams) and the most
    blocks (`last_backward_s`, `forward_s`: one micro-batch's backward and forward there):
    - ZeRO-0 (and DeepSpeed's BF16_Optimizer) all-reduce the gradients once per step, ZeRO 1-2
      reduce-scatter them (Megatron-Core's distributed optimizer; with several instances, HSDP,
      the shard's all-reduce over the replicas follows in the same bucket on the same stream,
      param_and_grad_buffer.py start_grad_sync) and all-gather the updated parameters; ZeRO-2
      keeps only a gradient shard, so with accumulation every micro-batch reduce-scatters. With
      overlap_grad_reduce they leave bucket by bucket under the backwards
      (_step_reductions_exposed); without it, all after the backward.
    - the parameter all-gather: with overlap_param_gather under the next step's forward, its first
      bucket waited for (_param_gather_gate_seconds); without it after the optimizer step, as
      BF16_Optimizer's from the owners (bf16_optimizer.py step: all_gather_dp_groups).
    - ZeRO-3: per micro-batch all-gather of the parameters forward and backward and reduce-scatter
      of the gradients, hidden under the m micro-batches' compute (`compute_s`) except the last
      bucket.
    The dense parameters reduce over dp x cp and shard over the shard group, the routed experts
    over the expert data-parallel group tp cp dp / (ep expert_tp) (Megatron-Core's expert
    data-parallel group), both in the same backward. Hidden traffic still costs
    `overlap_interference` of its time (NCCL takes SMs and memory bandwidth). `compute_end_s`, the
    rank's compute end (compute_s without it), bounds a reduction longer than the whole step.
    Tied embeddings split over a pipeline add their first/last-stage gradient all-reduce after the
    backward; delayed FP8 scaling its amax all-reduces over the stage's ranks
    (fp8_amax_reduction_seconds)."""
    s = x.sw.state_bytes(x.precision)
    grad_bytes = params_rank.total * s.reduce
    allreduce, rs, gather = dp_reduction_parts(x, params_rank)
    low_total, low_shown, gate = _step_collectives_seconds(
        x,
        (allreduce, rs, gather),
        gradient_buckets(x, params_rank.total),
        last_backward_s,
        forward_s,
        compute_s if compute_end_s is None else compute_end_s,
    )
    tail = np.minimum(1.0, DDP_BUCKET_BYTES / np.maximum(grad_bytes, 1.0))
    z3_total = x.m * (2.0 * gather + rs)
    z3_shown = (
        np.maximum(z3_total - compute_s, tail * rs)
        if x.sw.overlap_grad_reduce
        else x.m * rs + np.maximum(0.0, x.m * 2.0 * gather - compute_s)
    )
    total = np.where(x.zero >= 3, z3_total, low_total)
    shown = np.where(x.zero >= 3, z3_shown, low_shown)
    out = shown + eff(x.hw, "overlap_interference") * (total - shown)
    out = out + np.where(x.zero >= 3, 0.0, gate)  # the gather hides, the forward waits
    out = out + shard_unit_latency_seconds(x) + fp8_amax_reduction_seconds(x)
    if x.spec.tied_embeddings:
        # DeepSpeed's PipelineEngine all-reduces the tied weight's fp32 gradient under BF16_Optimizer
        # (weight._hp_grad; pipe/engine.py _exec_reduce_tied_grads, v0.6.5), the 16-bit .grad otherwise
        tied_bytes = 4.0 if x.sw.bf16_optimizer else s.reduce
        tied = tied_embedding_sync_seconds(
            x.spec.vocab, x.spec.hidden, x.tp, tied_bytes, x.local["P"] >= x.pp, x.hw
        )
        out = out + np.where(x.pp > 1, tied, 0.0)
    return out
