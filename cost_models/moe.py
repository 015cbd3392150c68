"""Expert parallelism: what spreading the routed experts of a mixture-of-experts block over ranks costs.

The terms read one `cost_models.step.Step` (its ep, expert_tp and the expert groups 'E', 'ET', 'ED',
'ES', 'ER' of planner.placement.group_locality) and are composed by planner.score (the tokens, rows,
GEMM shapes and bytes of the layout below are computed in cost_models.experts). Megatron-Core's
layout (Liu et al. 2025, "MoE Parallel Folding", arXiv 2504.14960; megatron/core/transformer/moe/):
attention runs on tp x cp x dp ranks per pipeline stage; the expert layers regroup the same ranks as
expert_tp x ep x expert_dp. Per rank and micro-batch (t = b s / cp tokens, SP shard t / tp):

    tokens routed from a rank      t_r = t / tp                 (sequence-parallel shard; Megatron-Core
                                                                 requires SP for MoE with tp > 1)
    rows of one local expert       M = t_r k ep expert_tp / E   (mean; x imbalance on the busiest rank,
                                                                 x capacity factor when padded)
    local experts                  E / ep, each of width f_e / expert_tp
    dispatch bytes per rank        t_r k h d x imbalance        (d: the dispatch dtype, FP8 + 1/128 scales
                                                                 when the run dispatches in FP8)

Dispatch and combine run forward, their transposes backward (DeepEP's and Megatron-Core's
dispatchers: the backward of a dispatch is a combine and vice versa), and again in the forward that
full recomputation repeats. Two dispatchers (frameworks.MOE_DISPATCHERS):

- alltoall: one NCCL all-to-all over the ep group (Megatron-Core's MoEAlltoAllTokenDispatcher,
  torchtitan's all_to_all_single, DeepSpeed-MoE): every routed copy travels, over NVLink to ranks of
  the same NVLink domain and over the network to the others (comm.group_collective_seconds).
- deepep: hierarchical (DeepEP normal kernels; DeepSeek-V3 report Sec. 3.2.2): a token crosses the
  network once per destination node, to the rank with the same local index, which forwards it over
  NVLink to the ranks holding its experts; RDMA and NVLink forwarding run pipelined (max of the two).
  With node-limited routing (MoESpec groups_per_token M over expert_groups aligned with nodes,
  DeepSeek-V3 Sec. 2.1.2) a token reaches at most M nodes.

Overlap is a framework (or run) property, `moe_a2a_overlap`: Megatron-Core's
--overlap-moe-expert-parallel-comm runs the exchange of one micro-batch beside the expert FFN compute
of another in the 1F1B steady state (forward exchanges beside backward expert GEMMs and the reverse),
as DeepSeek's DualPipe pairs forward and backward chunks; otherwise every exchange sits on the
critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models import params as P
from cost_models.comm import group_collective_seconds, inter_bus_Bps_per_node, intra_bus_Bps
from cost_models.compute import dispatch_seconds, recompute_passes
from cost_models.experts import expert_rows, legacy_dispatch, routed_tokens

DEFAULT_IMBALANCE = 1.0
"""Busiest rank's routed tokens over the mean when a run does not say (Software.moe_imbalance).
1.0: the published benchmarks this model is checked on force balanced routing
(Megatron-Core --moe-router-force-load-balancing, NeMo AutoModel's 'fake balanced gate'), and trained
routers balanced by an auxiliary loss or DeepSeek's bias rule come close to it at the rank level (each rank
holds E / ep experts, which averages the per-expert spread). A run with real routing sets its own value
(benchmarks/accuracy_moe.py derives one from the Megatron MoE Model Zoo's dropless vs forced-balance pairs)."""

FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128.0
"""Bytes per dispatched element in FP8: one E4M3 byte plus an fp32 scale per 128 elements (DeepSeek-V3
report Sec. 3.3.2, 1 x 128 activation tiles; DeepEP's FP8 dispatch). Combine stays in 16 bits."""


def dispatch_element_bytes(x) -> float:
    """Bytes per dispatched element: FP8 with its scales when the run dispatches in FP8 under an FP8
    recipe (DeepSeek-V3 Sec. 3.3.2: activations quantized before the MoE up-projections, then
    dispatched), else the 16-bit (or fp32) activation dtype."""
    return FP8_DISPATCH_BYTES if (x.precision == "fp8" and x.sw.moe_fp8_dispatch) else x.c


def remote_domains_per_token(x):
    """NVLink domains other than its own a token's k routed copies reach, for hierarchical dispatch:
    over G = ep / L domains of the ep group, uniform routing reaches (G - 1)(1 - (1 - 1/G)^k) of them
    (each copy lands on a given domain with probability 1/G); node-limited routing (at most M of the
    expert groups, each inside one domain: expert_groups divisible by G) reaches M (G - 1)/G when k >= M
    (the M chosen domains, own domain excluded). Arrays broadcast."""
    moe = x.spec.moe
    domains = np.maximum(x.ep / np.maximum(x.local["E"], 1.0), 1.0)
    uniform = (domains - 1.0) * (1.0 - (1.0 - 1.0 / domains) ** moe.top_k)
    m = moe.groups_per_token
    if m and moe.top_k >= m:
        aligned = (moe.expert_groups % np.round(domains)) == 0
        return np.where(aligned, np.minimum(uniform, m * (domains - 1.0) / domains), uniform)
    return uniform


def exchange_seconds(x, element_bytes):
    """One dispatch (or combine) over the ep group, on the busiest rank, t_r k h (x imbalance) copies of
    `element_bytes` per element:

    alltoall   comm.group_collective_seconds('alltoall'): (L - 1)/ep of the copies over NVLink and
               (ep - L)/ep over the device's share of the node's network, concurrently;
    deepep     network: t_r h R bytes (R = remote_domains_per_token) at the device's NIC share plus one
               network latency per remote domain; NVLink: t_r k h (L - 1)/L bytes forwarded inside the
               domain; the two pipelined: max (DeepEP normal kernels, DeepSeek-V3 Sec. 3.2.2).
    L = ranks of the ep group per NVLink domain (x.local['E']). 0 when ep = 1."""
    moe, h = x.spec.moe, x.spec.hidden
    imbalance = np.where(x.ep > 1, x.sw.imbalance, 1.0)
    copies = routed_tokens(x) * moe.top_k * imbalance
    volume = copies * h * element_bytes
    local = np.minimum(x.local["E"], x.ep)
    flat = group_collective_seconds("alltoall", volume, x.ep, local, x.hw)
    b_in = intra_bus_Bps(x.hw, "alltoall")
    b_out = inter_bus_Bps_per_node(x.hw, "alltoall") / x.hw.devices_per_node
    remote = remote_domains_per_token(x)
    domains = np.maximum(x.ep / np.maximum(local, 1.0), 1.0)
    network = (
        routed_tokens(x) * imbalance * h * element_bytes * remote / b_out
        + (domains - 1.0) * x.hw.inter_node_latency_us * 1e-6
    )
    nvlink = (
        volume * (local - 1.0) / np.maximum(local, 1.0) / b_in
        + (local - 1.0) * x.hw.intra_node_latency_us * 1e-6
    )
    hierarchical = np.maximum(np.where(domains > 1, network, 0.0), nvlink)
    out = flat if x.sw.moe_dispatcher == "alltoall" else hierarchical
    return np.where(x.ep > 1, out, 0.0)


def expert_tp_seconds(x):
    """Expert tensor parallelism (expert_tp > 1): the received tokens all-gathered over the expert_tp
    group before the expert GEMMs and reduce-scattered after (Megatron-Core's dispatchers with
    expert_tp > 1), a buffer of expert_tp t_r k h c x imbalance; forward AG + RS, backward RS + AG."""
    imbalance = np.where(x.ep > 1, x.sw.imbalance, 1.0)
    buffer = x.etp * routed_tokens(x) * x.spec.moe.top_k * x.spec.hidden * x.c * imbalance
    one = group_collective_seconds(
        "allgather", buffer, x.etp, x.local["ET"], x.hw
    ) + group_collective_seconds("reduce_scatter", buffer, x.etp, x.local["ET"], x.hw)
    return np.where(x.etp > 1, one, 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class EpSeconds:
    """Expert-parallel communication of one MoE block and one micro-batch on the busiest rank."""

    dispatch: np.ndarray
    """One dispatch (exchange_seconds in the dispatch dtype)."""
    combine: np.ndarray
    """One combine (16-bit)."""
    fwd: np.ndarray
    bwd: np.ndarray
    recompute: np.ndarray
    exposed: np.ndarray
    """What adds to the block's time: all of it without overlap; with overlap the part longer than the
    compute it runs beside."""

    @property
    def total(self):
        return self.fwd + self.bwd + self.recompute


def ep_block_seconds(x, block) -> EpSeconds:
    """Dispatch + combine (+ expert_tp all-gather / reduce-scatter) forward, the transposes backward, the
    forward's again under full recomputation (cost_models.compute.recompute_passes). Without overlap all
    of it is exposed. With `moe_a2a_overlap` (Megatron-Core's --overlap-moe-expert-parallel-comm, the
    1F1B all-to-all overlap modelled on DeepSeek's DualPipe, report Sec. 3.2.1 and Fig. 4) the forward of
    one micro-batch runs beside the backward of another, each exchange beside a compute piece of the other
    pass: forward dispatch | backward expert GEMMs, forward combine | backward attention part, backward
    combine | forward attention part, backward dispatch (and a recompute's exchanges) | forward expert
    GEMMs, where the attention part is the block's compute outside the routed experts (cost_models.compute
    .BlockSeconds: expert_fwd / expert_bwd and the rest):
        exposed = sum over the four pairs of max(0, exchange - compute beside it).
    Per candidate, only where Megatron-Core runs the overlap on the plan (Step.a2a_overlap: ep > 1 and
    frameworks.rules.a2a_overlap_runs, its TransformerConfig.__post_init__ asserts); elsewhere all of
    it is exposed. The overlap never makes a block slower: each pair's max(0, half - c) <= half (c >= 0)
    and its recompute pair's max(0, half + rec - c) <= half + rec, so exposed with it <= fwd + bwd + rec
    (what planner.search.overlaps relies on to turn it on wherever it runs). Memory: Megatron-Core's
    combined 1F1B (megatron/core/pipeline_parallel/combined_1f1b.py, combined_1f1b_schedule_for_no_
    pipelining; schedules.py get_pp_rank_microbatches: one more warm-up forward with the overlap)
    runs the next micro-batch's forward where plain 1F1B runs it alone before the backward, so the
    micro-batches in flight at the peak stay as many; layer by layer (models/common/
    model_chunk_schedule_plan.py: forward layer i beside backward layer L - 1 - i, release_state
    after each) one more block's activations can be held at that moment, which is not modelled.
    Per MoE block; the dense leading blocks of a model are costed as the repeating block, as
    compute.block_seconds does. Zeros for a dense model."""
    if x.spec.moe is None:
        zero = np.zeros_like(x.tp)  # (tp: a column every term keys on; planner.score.block_terms)
        return EpSeconds(
            dispatch=zero, combine=zero, fwd=zero, bwd=zero, recompute=zero, exposed=zero
        )
    dispatch = exchange_seconds(x, dispatch_element_bytes(x))
    combine = exchange_seconds(x, x.c)
    etp = expert_tp_seconds(x)
    fwd = dispatch + combine + etp
    bwd = fwd
    # a recomputed MoE layer (full recomputation, or Megatron-Core's recompute_modules "moe") exchanges again
    moe_layer = bool(getattr(x.sac, "moe_layer", False))
    rec = np.where(x.selective & moe_layer, 1.0, x.full_share) * fwd * recompute_passes(x)
    half = fwd / 2.0  # dispatch-side and combine-side halves of each pass
    rest_f, rest_b = block.fwd - block.expert_fwd, block.bwd - block.expert_bwd
    beside = (
        np.maximum(0.0, half - block.expert_bwd)
        + np.maximum(0.0, half - rest_b)
        + np.maximum(0.0, half - rest_f)
        + np.maximum(0.0, half + rec - block.expert_fwd)
    )
    exposed = np.where(x.a2a_overlap, beside, fwd + bwd + rec)
    return EpSeconds(
        dispatch=dispatch, combine=combine, fwd=fwd, bwd=bwd, recompute=rec, exposed=exposed
    )


def layers_sync_host(x) -> bool:
    """Whether each MoE layer's forward waits on the host (host_sync_seconds): dropless routing (no
    capacity factor) under a framework with `moe_host_sync` or the deepep dispatcher."""
    if x.spec.moe is None or x.spec.moe.capacity_factor is not None:
        return False
    return bool(x.sw.framework.moe_host_sync or x.sw.moe_dispatcher == "deepep")


def host_sync_seconds(x, device_fwd_s):
    """Host time a dropless MoE layer exposes per step. The forward of such a layer needs the tokens per
    expert on the host (Transformer Engine's GroupedLinear takes its m_splits as a Python list, Megatron-
    Core's dispatchers copy tokens_per_expert to the CPU; DeepEP's normal kernels make the CPU wait for the
    received counts, DeepEP README), so the host cannot run ahead of the device past it: each MoE block's
    forward takes at least the host time to issue it,

        exposed = m x blocks x forward passes (1 + full recompute) x max(0, H - device forward of the block),
        H = dispatch_us_per_op x (table.kernels_fwd + moe_host_ops_per_layer),

    moe_host_ops_per_layer the framework's host operators of an MoE layer's forward beyond the block
    table's kernel count (router, permutation bookkeeping, per-expert GEMMs and FP8 casts of
    GroupedLinear, dispatcher metadata), dispatch_us_per_op the profile's host time per operator. Only
    layers that sync: dropless routing
    (no capacity factor) under a framework with `moe_host_sync` or the deepep dispatcher. The backward
    reuses the forward's splits and runs ahead as a dense block does (host.host_wait_seconds)."""
    if not layers_sync_host(x):
        return np.zeros_like(x.dp)
    fw = x.sw.framework
    ops = x.table.kernels_fwd + fw.moe_host_ops_per_layer
    passes = 1.0 + x.full_share * recompute_passes(x)
    return (
        x.m * x.blocks_most * passes * np.maximum(0.0, dispatch_seconds(ops, x.hw) - device_fwd_s)
    )


# ------------------------------------------------------------------------------------ parameters


def routed_expert_params(spec) -> int:
    """Parameters of the routed experts of one MoE block: E MLPs of width f_e with their biases
    (cost_models.params.ffn_params); what ep x expert_tp shards."""
    return spec.moe.experts * P.ffn_params(spec, spec.moe.expert_ffn) if spec.moe is not None else 0


def routed_expert_weights(spec) -> int:
    """GEMM weights of the routed experts of one MoE block (no biases): what FP8 and autocast copies hold."""
    return (
        spec.moe.experts * P.ffn_weight_params(spec, spec.moe.expert_ffn)
        if spec.moe is not None
        else 0
    )


def moe_blocks_on_rank(spec, n_blocks, is_first, is_last):
    """Blocks with routed experts on a pipeline rank: its blocks less the leading dense ones on the first
    rank (cost_models.params.rank_params), plus the MTP modules' blocks on the last."""
    if spec.moe is None:
        return np.zeros_like(np.asarray(n_blocks, dtype=float))
    dense = np.where(is_first, np.minimum(spec.moe.first_dense_layers, n_blocks), 0.0)
    mtp = np.where(is_last, float(spec.mtp_modules), 0.0) if spec.last_kind.moe is not None else 0.0
    return np.asarray(n_blocks, dtype=float) - dense + mtp


@dataclass(frozen=True, kw_only=True, slots=True)
class RankParams:
    """Parameters one GPU holds, split by the group that shares them."""

    dense: np.ndarray
    """Everything but the routed experts, / tp (replicated over dp x cp)."""
    expert: np.ndarray
    """The routed experts of the rank's MoE blocks, / (ep x expert_tp) (replicated over expert_dp)."""
    sixteen_bit: np.ndarray | float = 0.0
    """Of `dense`, what is not a GEMM weight: the embedding, final norm and head
    (cost_models.params.edge_params) and the blocks' norms and biases: what an FP8 recipe keeps
    in 16 bits; the rest, with every routed expert, are its FP8 GEMM weights."""

    @property
    def dense_gemm(self):
        """The dense set's GEMM weights (`dense` less `sixteen_bit`)."""
        return self.dense - self.sixteen_bit

    @property
    def total(self):
        return self.dense + self.expert

    def higher(self, other: "RankParams") -> "RankParams":
        pick = other.total > self.total
        return RankParams(
            dense=np.where(pick, other.dense, self.dense),
            expert=np.where(pick, other.expert, self.expert),
            sixteen_bit=np.where(pick, other.sixteen_bit, self.sixteen_bit),
        )


def rank_params(x, n_blocks, is_first, is_last) -> RankParams:
    """cost_models.params.rank_params with the routed experts moved from / tp to / (ep x expert_tp)
    (Megatron-Core shards experts over the expert-parallel and expert-tensor-parallel groups)."""
    spec = x.spec
    everything = P.rank_params(spec, x.tp, n_blocks, is_first, is_last)
    routed = moe_blocks_on_rank(spec, n_blocks, is_first, is_last) * routed_expert_params(spec)
    return RankParams(
        dense=everything - routed / x.tp,
        expert=routed / (x.ep * x.etp),
        sixteen_bit=P.edge_params(spec, x.tp, is_first, is_last)
        + np.asarray(n_blocks, dtype=float) * P.block_small_params(spec) / x.tp,
    )


def block_weights_on_rank(x):
    """GEMM weights of one block stored on a GPU: attention, shared experts and router / tp, the rank's
    routed experts / (ep x expert_tp) (dense blocks: all / tp)."""
    spec = x.spec
    routed = routed_expert_weights(spec)
    return (P.block_stored_matmul_weights(spec) - routed) / x.tp + routed / (x.ep * x.etp)


def block_params_on_rank(x):
    """Parameters of one block on a GPU (block_weights_on_rank with biases and norms): what a ZeRO-3 /
    FSDP all-gather brings in per block, split (dense / tp, routed / (ep expert_tp))."""
    spec = x.spec
    routed = routed_expert_params(spec)
    return (P.block_params(spec) - routed) / x.tp, routed / (x.ep * x.etp)


EP_LINKS = ("none", "NVLink", "NVLink + network")
"""Where an expert-parallel group's all-to-all runs (`ep_links`)."""


def ep_links(ep, local_e):
    """Index into EP_LINKS of where the all-to-all runs: none (ep = 1), NVLink (all ep ranks in one NVLink
    domain: local_e, the group's ranks per domain from planner.placement.group_locality 'E', reaches ep), or
    NVLink + network (the group spans domains). Ints or arrays."""
    ep, local_e = np.asarray(ep), np.asarray(local_e)
    out = np.where(ep <= 1, 0, np.where(np.minimum(local_e, ep) >= ep, 1, 2))
    return int(out) if out.ndim == 0 else out


def placement_summary(x, block, i: int = 0) -> dict:
    """What `planner explain` says about candidate `i`'s expert layout: the groups, the routed-expert
    parameters a GPU of the busiest pipeline rank holds (rank_params' expert part), the links the
    exchanges use (ranks of the ep group per NVLink domain and the domains it spans), the dispatcher, the
    bytes and seconds of one dispatch on the busiest rank, and the step's exchange time (the busiest
    pipeline rank's m x blocks x ep_block_seconds) exposed vs hidden under the expert and attention compute
    (`block`: cost_models.compute.block_seconds of the same Step). An empty dict for a dense model."""
    if x.spec.moe is None:
        return {}
    pick = lambda a: float(np.broadcast_to(np.asarray(a, dtype=float), x.dp.shape)[i])  # noqa: E731
    ep, etp, moe = pick(x.ep), pick(x.etp), x.spec.moe
    local = min(pick(x.local["E"]), ep)
    per_copy = (
        routed_tokens(x) * moe.top_k * np.where(x.ep > 1, x.sw.imbalance, 1.0) * x.spec.hidden
    )
    seconds = ep_block_seconds(x, block)
    step = x.m * x.blocks_most
    total, exposed = pick(step * seconds.total), pick(step * seconds.exposed)
    return {
        "ep": int(ep),
        "expert_tp": int(etp),
        "expert_dp": int(round(pick(x.expert_dp))),
        "local_experts": moe.experts / ep,
        "rows_per_local_expert": pick(expert_rows(x)),
        "expert_params_per_gpu": pick(rank_params(x, x.blocks_most, False, False).expert),
        "imbalance": x.sw.imbalance if ep > 1 else 1.0,
        "dispatcher": "allgather (ep = 1, expert_tp = tp)"
        if bool(np.asarray(legacy_dispatch(x)).reshape(-1)[i])
        else x.sw.moe_dispatcher,
        "ep_ranks_per_nvlink_domain": int(local),
        "ep_nvlink_domains": int(round(ep / max(local, 1.0))),
        "links": EP_LINKS[ep_links(ep, local)],
        "remote_domains_per_token": pick(remote_domains_per_token(x))
        if x.sw.moe_dispatcher == "deepep"
        else None,
        "dispatch_bytes_per_rank": pick(per_copy * dispatch_element_bytes(x)),
        "dispatch_s": pick(seconds.dispatch),
        "combine_s": pick(seconds.combine),
        "overlap": bool(pick(x.a2a_overlap)),
        "exchange_total_s": total,
        "exchange_exposed_s": exposed,
        "exchange_hidden_s": total - exposed,
    }
