"""The expert layout of a mixture-of-experts block on one rank: the tokens it routes, the rows of each
local expert, the grouped GEMMs of its routed experts, the memory traffic of regrouping received tokens,
and which dispatcher path (and so which tensor-parallel pair) a candidate takes.

Pure shape and byte formulas of one `cost_models.step.Step` (no seconds): cost_models.compute times the
GEMMs and the traffic, cost_models.comm the tensor-parallel pair, and cost_models.moe the exchanges
(its module docstring gives the layout, Megatron-Core's "MoE Parallel Folding").
"""

from __future__ import annotations

import numpy as np

from cost_models.flops import GemmShape


def routed_tokens(x):
    """Tokens one rank routes per micro-batch: its sequence-parallel shard b s / (cp tp)."""
    return x.tokens / x.tp


def expert_rows(x, *, busiest: bool = True):
    """Rows one local expert multiplies per micro-batch: t_r k ep expert_tp / E on average (the tokens of
    the ep group's ranks, gathered over expert_tp, spread over E experts; cost_models.flops.expert_rows
    at ep = 1, expert_tp = tp). The busiest rank: x the padded capacity factor C (every expert computes
    C times its share; Fedus et al. 2021, Switch, Sec. 2.2), else x the rank imbalance when ep > 1 (at
    ep = 1 every rank holds every expert and processes every routed copy: no rank imbalance)."""
    moe = x.spec.moe
    mean = routed_tokens(x) * moe.top_k * x.ep * x.etp / moe.experts
    if not busiest:
        return mean
    factor = (
        moe.capacity_factor
        if moe.capacity_factor is not None
        else np.where(x.ep > 1, x.sw.imbalance, 1.0)
    )
    return mean * factor


def expert_gemm_shapes(x) -> list[GemmShape]:
    """The routed experts of the busiest rank as grouped GEMMs: E / ep experts of expert_rows rows, width
    f_e / expert_tp (W1, W3 when gated, by columns; W2 by rows). One kernel per projection (Transformer
    Engine's GroupedLinear, DeepGEMM's m-grouped GEMM): cost_models.compute.gemm_seconds' fixed cost is
    paid once per group and its roofline makes small-M groups memory bound, which reproduces DeepGEMM's
    grouped-GEMM throughput against M (validation/kernels/grouped_gemm.json, tests/test_cost_moe.py)."""
    moe, h = x.spec.moe, x.spec.hidden
    m, width, batch = expert_rows(x), moe.expert_ffn / x.etp, moe.experts / x.ep
    shapes = [GemmShape("experts_w1", m, width, h, batch)]
    if x.spec.gated_mlp:
        shapes.append(GemmShape("experts_w3", m, width, h, batch))
    return shapes + [GemmShape("experts_w2", m, h, width, batch)]


def permute_bytes_fwd(x):
    """Memory traffic the all-to-all dispatcher adds to an MoE block: after the exchange the received
    tokens arrive grouped by source rank and are regrouped by local expert before the expert GEMMs, and
    back before the combine (Megatron-Core's sort_chunks_by_idxs): read + write of each received copy
    twice, 4 t_r k h c x imbalance, when ep > 1 and a rank holds several experts. The permutation every
    MoE block does (each routed copy gathered, scattered back and weighted, the router's scores: ~5 h c
    per copy) is in cost_models.blocks' MoE table; DeepEP's kernels write the received tokens per expert
    and fold the weighting into the combine, which that table's count already covers (0 here)."""
    moe = x.spec.moe
    several = (moe.experts / x.ep) > 1
    on = (x.ep > 1) & several & (x.sw.moe_dispatcher == "alltoall")
    imbalance = np.where(x.ep > 1, x.sw.imbalance, 1.0)
    return np.where(on, 4.0 * routed_tokens(x) * moe.top_k * x.spec.hidden * x.c * imbalance, 0.0)


def legacy_dispatch(x):
    """Candidates costed with Megatron-Core's all-gather dispatcher (ep = 1 with expert_tp = tp: the
    block's MLP all-gathers and reduce-scatters b s h over tp as a dense MLP does, and the experts run on
    every routed copy locally); every other expert layout uses the all-to-all path of cost_models.moe."""
    return (x.ep == 1) & (x.etp == x.tp)


def mlp_tp_pair(x):
    """Whether a block's MLP keeps the tensor-parallel all-gather / reduce-scatter pair of Megatron's
    column/row split (comm.tp_block_seconds): dense blocks; MoE blocks on the all-gather dispatcher; MoE
    blocks with shared experts (Megatron-Core's SharedExpertMLP gathers the sequence-parallel input over
    tp). Routed experts on the all-to-all path take the sequence-parallel shard as it is."""
    if x.spec.moe is None:
        return np.ones_like(x.tp, dtype=bool)
    return legacy_dispatch(x) | (x.spec.moe.shared_experts > 0)
