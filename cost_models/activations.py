"""Bytes saved for backward per micro-batch of b sequences of s tokens: the scalar face of the block
tables of cost_models.blocks, which are the one owner of activation memory (the cost model's
memory.activation_bytes reads the same tables for arrays of candidates).

Used by `planner profile` (per layer, by recompute mode) and the stage partitioner
(planner.search.stage_problem), so that profile, partitioner and estimate report the same bytes for
the same configuration (tests/test_activation_owner.py). Which table applies is the framework's
`kernels` (fused: Megatron / Transformer Engine, Korthikanti et al. 2022 Table 2; eager: Hugging Face
modules; torch: plain PyTorch modules, torchtitan and this project's executor).
"""

from __future__ import annotations

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


def _kept(table, sac, b, s, tp, sp, recompute):
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, not {recompute!r}")
    kept = kept_per_token(table, lambda terms: _per_token(terms, tp, sp, s), sac)
    return kept[RECOMPUTE_MODES.index(recompute)] * b * s


def block_bytes(
    spec: TransformerSpec,
    b,
    s,
    *,
    precision: str = "amp-bf16",
    kernels: str = "fused",
    flash: bool = True,
    dropout: bool = False,
    tp=1,
    sp=False,
    recompute: str = "none",
    selective: str = "attention",
):
    """One block of a stack's `kernels` with no run options: everything (none), without the attention scores'
    core (selective; with `selective='op'` torchtitan's per-operator set, cost_models.blocks.op_sac), or only
    the block input (full); replicated terms / (tp with SP), sharded / tp. Arrays broadcast. For a run's
    software (its options change the table) use `block_bytes_of`."""
    table = B.block_table(spec, precision, kernels, flash=flash, dropout=dropout)
    dense = spec.moe is None and spec.mla is None
    sac = B.op_sac(spec, precision, kernels) if selective == "op" and dense else None
    return _kept(table, sac, b, s, tp, sp, recompute)


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
    policy the cost model itself reads (cost_models.step.block_table_of: the run's fused norm, FP8 activation
    input, FSDP's 16-bit modules from ZeRO 2 on; cost_models.step.selective_policy: per-operator or by-module
    selective recomputation), so `planner profile`, the stage partitioner and `planner estimate` agree for
    every run option (tests/test_activation_owner.py)."""
    from cost_models.step import block_table_of, selective_policy

    return _kept(
        block_table_of(sw, spec, precision, zero),
        selective_policy(sw, spec, precision),
        b,
        s,
        tp,
        sp,
        recompute,
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
