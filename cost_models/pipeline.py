"""Pipeline schedules: bubble and in-flight micro-batches (numbers or numpy arrays).

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM"), Sec. 2.2: with p stages and m micro-batches, GPipe and 1F1B idle for
(p - 1) micro-batch slots per step, a bubble fraction of (p - 1) / m of the ideal time (eq. 1);
the interleaved schedule with v model chunks per device cuts it to (p - 1) / (v m) (eq. 2).
Zero-bubble ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", Sec. 3.1) splits the
backward into input and weight gradients and fills the warm-up/cool-down with weight-gradient work,
leaving about 1/3 of 1F1B's bubble at 1F1B's memory.

Activation memory: GPipe keeps all m micro-batches; 1F1B's stage k (0-based) keeps min(p - k, m),
the first stage p (Narayanan et al. 2021, Sec. 2.2.1); interleaved 1F1B's first stage keeps
p (1 + (p - 1) / (p v)) stage-loads (Korthikanti et al. 2022, Sec. 4.2.3).
"""
from __future__ import annotations

import numpy as np

SCHEDULE_BUBBLE_SCALE = {"gpipe": 1.0, "1f1b": 1.0, "interleaved-1f1b": None, "zero-bubble": 1.0 / 3.0}
"""Bubble relative to 1F1B's (p - 1) slots; interleaved divides by v."""


def bubble_slots(schedule_idx, pp, virtual_stages, schedules: tuple[str, ...]):
    """Idle micro-batch slots per step, in units of one stage's (forward + backward) time:
    (p - 1) for GPipe/1F1B, (p - 1)/v interleaved, (p - 1)/3 zero-bubble."""
    pp = np.asarray(pp, dtype=float)
    v = np.asarray(virtual_stages, dtype=float)
    schedule_idx = np.asarray(schedule_idx)
    scale = np.ones(np.broadcast(schedule_idx, pp, v).shape)
    for i, name in enumerate(schedules):
        k = SCHEDULE_BUBBLE_SCALE[name]
        scale = np.where(schedule_idx == i, (1.0 / v) if k is None else k, scale)
    return (pp - 1.0) * scale


def bubble_fraction(schedule: str, pp, num_microbatches, virtual_stages=1):
    """Bubble time over ideal time: (p - 1)/m, (p - 1)/(v m) interleaved, a third of 1F1B's for ZB-H1."""
    k = SCHEDULE_BUBBLE_SCALE[schedule]
    scale = 1.0 / np.asarray(virtual_stages, dtype=float) if k is None else k
    return (np.asarray(pp, dtype=float) - 1.0) * scale / np.asarray(num_microbatches, dtype=float)


def inflight_microbatches_first_stage(schedule_idx, pp, num_microbatches, virtual_stages, schedules):
    """Micro-batches whose activations the first stage holds at its peak, in units of its whole
    stage (all its chunks): GPipe m; 1F1B and ZB-H1 min(p, m); interleaved
    min(p (1 + (p - 1)/(p v)), m) (Korthikanti et al. 2022, Sec. 4.2.3)."""
    pp = np.asarray(pp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    v = np.asarray(virtual_stages, dtype=float)
    schedule_idx = np.asarray(schedule_idx)
    inflight = np.minimum(pp, m)
    for i, name in enumerate(schedules):
        if name == "gpipe":
            inflight = np.where(schedule_idx == i, m, inflight)
        elif name == "interleaved-1f1b":
            inflight = np.where(schedule_idx == i, np.minimum(pp * (1 + (pp - 1) / (pp * v)), m), inflight)
    return inflight


def inflight_microbatches_last_stage(schedule_idx, num_microbatches, schedules):
    """The last stage runs each micro-batch's backward right after its forward (1F1B family): 1;
    GPipe keeps all m."""
    m = np.asarray(num_microbatches, dtype=float)
    out = np.minimum(1.0, m) * np.ones(np.broadcast(schedule_idx, m).shape)
    for i, name in enumerate(schedules):
        if name == "gpipe":
            out = np.where(np.asarray(schedule_idx) == i, m, out)
    return out


def p2p_transfers_on_critical_path(pp, num_microbatches, virtual_stages):
    """Activation sends (and gradient sends back) serialized with compute in a step: each of the
    m v chunk-passes plus the p - 1 warm-up hops, both directions: 2 (m v + p - 1); 0 when p = 1
    (Megatron's blocking send/recv between stages)."""
    pp = np.asarray(pp, dtype=float)
    return np.where(pp > 1, 2.0 * (np.asarray(num_microbatches) * np.asarray(virtual_stages) + pp - 1.0), 0.0)
