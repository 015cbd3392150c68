"""Bytes saved for backward per micro-batch of b sequences of s tokens: the scalar face of the block
tables of cost_models.blocks, which are the one owner of activation memory (the cost model's
memory.activation_bytes reads the same tables for arrays of candidates).

Used by `planner profile` (per layer, by recompute mode) and the stage partitioner
(planner.search.stage_problem), so that profile, partitioner and estimate report the same bytes for
the same configuration (tests/test_activation_owner.py). Which table applies is the framework's
`kernels` (fused: Megatron / Transformer Engine, Korthikanti et al. 2022 Table 2; eager: Hugging Face
modules; torch: plain PyTorch modules, torchtitan and this project's executor).

A run's table and selective policy (block_table_of, selective_policy, activation_precision; `sw` a
cost_models.step.Software) are chosen here, below cost_models.step, whose Step reads them too.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cost_models import blocks as B
from planner.spec import TransformerSpec

RECOMPUTE_MODES = ("none", "selective", "full")


def _per_token(terms: B.Terms, tp, sp, s):
    return terms.at(np.asarray(tp, dtype=float), sp, s)


def kept_per_token(table: B.BlockTable, per_token, sac=None):
    """(none, selective, full): bytes per token one block keeps for its backward under each recompute mode, the
    one rule every reader applies (Korthikanti et al. 2022, Sec. 4-5, as generalized in cost_models.blocks):
    everything the table saves; without the attention core's saved scores, or what a selective policy keeps
    (`sac`: torchtitan's per-operator set, cost_models.blocks.op_sac, or Megatron-Core's recompute_modules,
    cost_models.blocks.module_sac); only the block input (full). `per_token` turns table Terms into bytes per
    token on one rank (Terms.at for a tp degree, SP flag and sequence; Step.per_token for candidates)."""
    none = per_token(table.saved)
    selective = none - per_token(table.scores_saved) if sac is None else per_token(sac.saved)
    return none, selective, per_token(table.saved_full_recompute)


def block_bytes(table: B.BlockTable, b, s, *, tp=1, sp=False, recompute: str = "none", sac=None):
    """Saved bytes of one block of `table` (cost_models.blocks.block_table): everything (none),
    without the attention scores' core (selective; with `sac`, an operator set such as torchtitan's,
    cost_models.blocks.op_sac), or only the block input (full); replicated terms / (tp with SP),
    sharded / tp. Arrays broadcast. For a run's software (its options change the table) use
    `block_bytes_of`."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, not {recompute!r}")
    kept = kept_per_token(table, lambda terms: _per_token(terms, tp, sp, s), sac)
    return kept[RECOMPUTE_MODES.index(recompute)] * b * s


def activation_precision(sw, precision: str, zero: int) -> str:
    """The precision whose block table describes the activations: 'bf16' for eager modules under
    torch.autocast whose parameters FSDP's mixed precision gathers in 16 bits (ZeRO >= 2 with a 16-bit
    gather), else `precision` (block_table_of; the profile and the stage partitioner call this too)."""
    if (
        sw.framework.kernels == "eager"
        and precision.startswith("amp")
        and zero >= 2
        and sw.state_bytes(precision).gather < 4
    ):
        return "bf16"
    return precision


def fp32_probs(sw) -> bool:
    """The MoE dispatcher hands the experts fp32 routing probabilities: DeepEP, and HybridEP, which
    the planner costs as DeepEP (cost_models.blocks.EXPERT_BIAS_FP32_PROBS_BYTES)."""
    return sw.moe_dispatcher == "deepep"


def block_table_of(sw, spec: TransformerSpec, precision: str, zero=None) -> B.BlockTable:
    """The framework's block table; under torch.compile its memory-bound traffic and launches are
    the fused table's (Software.compile); a stack running legacy Megatron's dense layer issues
    that layer's host operators (FrameworkProfile.megatron_legacy_layer). Eager modules under
    torch.autocast whose parameters FSDP's mixed precision gathers in 16 bits (ZeRO >= 2 with a
    16-bit gather: Composer's DEFAULT, Accelerate's and fms-fsdp's bf16 FSDP) run on 16-bit
    weights, so their residual stream and norms are 16-bit: the 16-bit table applies to those
    candidates (per candidate where `zero` is an array)."""
    flash = sw.kernel(precision, spec) != "math"
    table = B.block_table(
        spec,
        precision,
        sw.framework.kernels,
        flash=flash,
        dropout=sw.dropout,
        activation_fp8_input=sw.activation_fp8_input,
        fused_norm=sw.fused_norm,
        fp8_scaling=sw.fp8_scaling,
        fp32_probs=fp32_probs(sw),
    )
    legacy = sw.framework.megatron_legacy_layer and sw.framework.kernels == "fused"
    if legacy and spec.moe is None and spec.mla is None:
        launches = B.legacy_megatron_launches(spec, flash=flash, dropout=sw.dropout)
        table = replace(table, kernels_fwd=launches)
    if zero is not None and activation_precision(sw, precision, 3) != precision:
        sharded = np.asarray(zero) >= 2
        if sharded.any():
            table = B.blend(
                sharded,
                B.block_table(
                    spec, "bf16", "eager", flash=flash, dropout=sw.dropout, fused_norm=sw.fused_norm
                ),
                table,
            )
    if not sw.compile or sw.framework.kernels == "fused":
        return table
    fused = B.block_table(
        spec,
        precision,
        "fused",
        flash=flash,
        dropout=sw.dropout,
        fp8_scaling=sw.fp8_scaling,
        fp32_probs=fp32_probs(sw),
    )
    # compiled, the ops Megatron-Core leaves unfused fuse too
    unfused, launches = B.megatron_unfused_ops(
        spec, B.compute_bytes(precision), fp32_probs=fp32_probs(sw)
    )
    return replace(
        table,
        traffic_fwd=fused.traffic_fwd + unfused.scaled(-1.0),
        scores_traffic_fwd=fused.scores_traffic_fwd,
        kernels_fwd=fused.kernels_fwd - launches,
    )


def selective_policy(sw, spec: TransformerSpec, precision: str) -> B.OpSac | B.ModuleSac | None:
    """torchtitan's per-operator selective recomputation (cost_models.blocks.op_sac) for its dense blocks;
    Megatron-Core's by module when the run names its recompute_modules (cost_models.blocks.module_sac); None
    where selective means the attention core (Megatron's default) or the block is MoE / MLA under torchtitan."""
    if sw.recompute_modules is not None and tuple(sw.recompute_modules) != ("core_attn",):
        return B.module_sac(
            spec,
            precision,
            sw.recompute_modules,
            activation_fp8_input=sw.activation_fp8_input,
            fp8_scaling=sw.fp8_scaling,
            fp32_probs=fp32_probs(sw),
        )
    if sw.framework.selective_recompute != "op" or spec.moe is not None or spec.mla is not None:
        return None
    return B.op_sac(spec, precision, sw.framework.kernels)


def block_bytes_of(
    sw,
    spec: TransformerSpec,
    b,
    s,
    *,
    precision: str = "amp-bf16",
    zero=0,
    tp=1,
    sp=False,
    recompute: str = "none",
):
    """One block as a run with software `sw` (cost_models.step.Software) saves it: the table and the selective
    policy the cost model itself reads (block_table_of: the run's fused norm, FP8 activation
    input, FSDP's 16-bit modules from ZeRO 2 on; selective_policy: per-operator or by-module
    selective recomputation), so `planner profile`, the stage partitioner and `planner estimate` agree for
    every run option (tests/test_activation_owner.py)."""
    return block_bytes(
        block_table_of(sw, spec, precision, zero),
        b,
        s,
        tp=tp,
        sp=sp,
        recompute=recompute,
        sac=selective_policy(sw, spec, precision),
    )


def embedding_bytes(
    spec: TransformerSpec,
    b,
    s,
    *,
    precision: str = "amp-bf16",
    dropout: bool = False,
    tp=1,
    sp=False,
):
    """First stage (cost_models.blocks.embedding_saved)."""
    return _per_token(B.embedding_saved(spec, precision, dropout=dropout), tp, sp, s) * b * s


def head_bytes(
    spec: TransformerSpec,
    b,
    s,
    *,
    precision: str = "amp-bf16",
    kernels: str = "fused",
    tp=1,
    sp=False,
):
    """Last stage before the loss: final norm and LM head inputs (cost_models.blocks.head_table)."""
    return _per_token(B.head_table(spec, precision, kernels).saved, tp, sp, s) * b * s


def loss_bytes(
    spec: TransformerSpec, b, s, *, tp=1, loss: str = "upcast", precision: str = "amp-bf16"
):
    """What cross-entropy saves for its backward (cost_models.blocks.loss_saved)."""
    return _per_token(B.loss_saved(spec, loss, precision), tp, False, s) * b * s


def logits_peak_bytes(
    spec: TransformerSpec,
    b,
    s,
    *,
    precision: str = "amp-bf16",
    kernels: str = "fused",
    tp=1,
    loss: str | None = None,
):
    """The largest transient of logits and loss on the last stage (HeadTable.logits_peak): not saved by a
    layer, alive at the loss; the memory model adds it to the last stage's peak."""
    return (
        _per_token(B.head_table(spec, precision, kernels, loss).logits_peak, tp, False, s) * b * s
    )
