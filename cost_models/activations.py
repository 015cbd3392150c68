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


def block_bytes(spec: TransformerSpec, b, s, *, precision: str = "amp-bf16", kernels: str = "fused",
                flash: bool = True, dropout: bool = False, tp=1, sp=False, recompute: str = "none",
                selective: str = "attention"):
    """One block: everything (none), without the attention scores' core (selective; with `selective='op'`
    torchtitan's per-operator set, cost_models.blocks.op_sac), or only the block input (full);
    replicated terms / (tp with SP), sharded / tp. Arrays broadcast."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, not {recompute!r}")
    table = B.block_table(spec, precision, kernels, flash=flash, dropout=dropout)
    if recompute == "full":
        terms = table.saved_full_recompute
    elif recompute == "selective" and selective == "op" and spec.moe is None and spec.mla is None:
        terms = B.op_sac(spec, precision, kernels).saved
    elif recompute == "selective":
        return (_per_token(table.saved, tp, sp, s) - _per_token(table.scores_saved, tp, sp, s)) * b * s
    else:
        terms = table.saved
    return _per_token(terms, tp, sp, s) * b * s


def embedding_bytes(spec: TransformerSpec, b, s, *, precision: str = "amp-bf16", dropout: bool = False, tp=1, sp=False):
    """First stage (cost_models.blocks.embedding_saved)."""
    return _per_token(B.embedding_saved(spec, precision, dropout=dropout), tp, sp, s) * b * s


def head_bytes(spec: TransformerSpec, b, s, *, precision: str = "amp-bf16", kernels: str = "fused", tp=1, sp=False):
    """Last stage before the loss: final norm and LM head inputs (cost_models.blocks.head_table)."""
    return _per_token(B.head_table(spec, precision, kernels).saved, tp, sp, s) * b * s


def loss_bytes(spec: TransformerSpec, b, s, *, tp=1, loss: str = "upcast", precision: str = "amp-bf16"):
    """What cross-entropy saves for its backward (cost_models.blocks.loss_saved)."""
    return _per_token(B.loss_saved(spec, loss, precision), tp, False, s) * b * s


def logits_peak_bytes(spec: TransformerSpec, b, s, *, precision: str = "amp-bf16", kernels: str = "fused", tp=1,
                      loss: str | None = None):
    """The largest transient of logits and loss on the last stage (HeadTable.logits_peak): not saved by a
    layer, alive at the loss; the memory model adds it to the last stage's peak."""
    return _per_token(B.head_table(spec, precision, kernels, loss).logits_peak, tp, False, s) * b * s
