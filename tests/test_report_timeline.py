"""Pipeline timelines: the bubble each schedule's op order implies, against the papers' closed forms."""

import pytest
from hypothesis import given, settings, strategies as st

from planner.report.timeline import StageTimes, build_timeline

F, B = 1.0, 2.0


def _uniform(p):
    return [StageTimes(forward_s=F, backward_s=B)] * p


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (8, 3), (1, 5)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(schedule, p, m):
    # GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021, Sec. 2.2.1): (m + p - 1)(F + B),
    # bubble fraction (p - 1) / (m + p - 1).
    tl = build_timeline(schedule, _uniform(p), m)
    assert tl.makespan_s == pytest.approx((m + p - 1) * (F + B))
    assert tl.idle_fraction() == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (2, 4, 2)])
def test_interleaving_divides_the_bubble_by_v(p, m, v):
    # Narayanan et al. 2021, Sec. 2.2.2: bubble time (p - 1)(F + B) / v.
    tl = build_timeline("interleaved-1f1b", _uniform(p), m, virtual_stages=v)
    assert tl.makespan_s == pytest.approx(m * (F + B) + (p - 1) * (F + B) / v)
    assert {op.chunk for op in tl.ops} == set(range(v))


def test_zero_bubble_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w():
    # Qi et al. 2023, ZB-H1: bubble (p - 1)(F + B - W) with B = W = backward / 2.
    p, m = 4, 8
    tl = build_timeline("zero-bubble", _uniform(p), m)
    assert tl.makespan_s == pytest.approx(m * (F + B) + (p - 1) * (F + B / 2 - B / 2))
    assert {op.kind for op in tl.ops} == {"F", "B", "W"}


def test_p2p_adds_latency_per_hop_on_the_critical_path():
    p, m, hop = 4, 8, 0.1
    tl = build_timeline("1f1b", _uniform(p), m, p2p_s=hop)
    assert tl.makespan_s > (m + p - 1) * (F + B)
    # each slot waits at most one send and one receive
    assert tl.makespan_s <= (m + p - 1) * (F + B + 2 * hop) + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(1, 6),
    m=st.integers(1, 12),
    schedule=st.sampled_from(["gpipe", "1f1b", "zero-bubble"]),
)
def test_every_op_runs_once_and_respects_dependencies(p, m, schedule):
    tl = build_timeline(
        schedule, [StageTimes(forward_s=1.0 + 0.1 * r, backward_s=2.0) for r in range(p)], m
    )
    # one stage has no bubble for W to fill: the step timeline keeps the backward whole there
    kinds = ("F", "B", "W") if schedule == "zero-bubble" and p > 1 else ("F", "B")
    assert len(tl.ops) == len(kinds) * p * m
    end = {(op.kind, op.microbatch, op.rank): op.end_s for op in tl.ops}
    start = {(op.kind, op.microbatch, op.rank): op.start_s for op in tl.ops}
    for i in range(m):
        for r in range(1, p):
            assert start[("F", i, r)] >= end[("F", i, r - 1)] - 1e-12
            assert start[("B", i, r - 1)] >= end[("B", i, r)] - 1e-12
        assert start[("B", i, p - 1)] >= end[("F", i, p - 1)] - 1e-12
    for r in range(p):  # one op at a time per rank
        ops = sorted((op for op in tl.ops if op.rank == r), key=lambda o: o.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(ops, ops[1:]))


def test_one_f_one_b_keeps_at_most_p_minus_r_microbatches_in_flight():
    p, m = 4, 10
    tl = build_timeline("1f1b", _uniform(p), m)
    for r in range(p):
        in_flight = peak = 0
        for op in sorted((o for o in tl.ops if o.rank == r), key=lambda o: o.start_s):
            in_flight += 1 if op.kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(p - r, m)


def test_unknown_schedule_is_rejected():
    with pytest.raises(ValueError, match="unknown schedule"):
        build_timeline("pipedream", _uniform(2), 2)


@pytest.mark.parametrize(
    "schedule,v",
    [
        ("gpipe", 1),
        ("1f1b", 1),
        ("interleaved-1f1b", 2),
        ("interleaved-1f1b", 4),
        ("zero-bubble", 1),
    ],
)
@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (2, 8), (4, 1), (4, 2), (8, 4), (8, 2)])
def test_drawn_bubble_equals_the_estimates_pipeline_model(schedule, v, p, m):
    # The Gantt is drawn from the schedule's op order; the estimate prices the bubble with
    # cost_models.pipeline.bubble_slots. For uniform stages with B = W = F (Qi et al.'s setting) and
    # m a multiple of p (or m < p), the two agree exactly.
    import numpy as np

    from cost_models.pipeline import bubble_slots
    from planner.parallel import SCHEDULES

    stage = F + B
    tl = build_timeline(schedule, _uniform(p), m, virtual_stages=v)
    slots = float(bubble_slots(np.array(SCHEDULES.index(schedule)), p, v, SCHEDULES, m))
    assert tl.makespan_s - m * stage == pytest.approx(slots * stage)


@pytest.mark.parametrize(
    "schedule,v",
    [
        ("gpipe", 1),
        ("1f1b", 1),
        ("interleaved-1f1b", 2),
        ("interleaved-1f1b", 4),
        ("zero-bubble", 1),
    ],
)
@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (4, 2), (8, 4)])
def test_inflight_microbatches_equal_the_drawn_schedule(schedule, v, p, m):
    # The memory model's in-flight micro-batches per rank (cost_models.pipeline.inflight_microbatches)
    # are the most forwards whose backward has not finished, in the schedule's op order.
    import numpy as np

    from cost_models.pipeline import inflight_microbatches
    from planner.parallel import SCHEDULES

    tl = build_timeline(schedule, _uniform(p), m, virtual_stages=v)
    for rank in range(p):
        events = sorted(
            [(op.start_s, 1) for op in tl.ops if op.rank == rank and op.kind == "F"]
            + [(op.end_s, -1) for op in tl.ops if op.rank == rank and op.kind == "B"]
        )
        alive = peak = 0
        for _, step in events:
            alive += step
            peak = max(peak, alive)
        model = float(
            inflight_microbatches(np.array(SCHEDULES.index(schedule)), p, m, v, rank, SCHEDULES)
        )
        assert peak / v == pytest.approx(model), rank
