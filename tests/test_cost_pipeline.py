"""Pipeline bubble (Narayanan et al. 2021 eq. 1-2; Qi et al. 2023) and in-flight micro-batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from cost_models import pipeline as PL
from planner.parallel import SCHEDULES


def test_bubble_fractions_from_the_papers():
    assert PL.bubble_fraction("1f1b", 8, 64) == pytest.approx(7 / 64)
    assert PL.bubble_fraction("gpipe", 8, 64) == pytest.approx(7 / 64)
    assert PL.bubble_fraction("interleaved-1f1b", 8, 64, 3) == pytest.approx(7 / (3 * 64))
    assert PL.bubble_fraction("zero-bubble", 8, 64) == pytest.approx(7 / 64 / 3)
    assert PL.bubble_fraction("1f1b", 1, 4) == 0.0


def test_fewer_microbatches_than_stages_lose_the_schedule_gains():
    # p = 8, m = 4: 1F1B still idles p - 1 = 7 slots; interleaving (v = 2) waits (p - m) = 4 chunk
    # slots of 1/2 at its one chunk transition: 3.5 + 2 = 5.5; ZB-H1 (7 + 4)/3.
    ids = {name: SCHEDULES.index(name) for name in SCHEDULES}
    assert float(PL.bubble_slots(ids["1f1b"], 8, 1, SCHEDULES, 4)) == pytest.approx(7.0)
    assert float(PL.bubble_slots(ids["interleaved-1f1b"], 8, 2, SCHEDULES, 4)) == pytest.approx(5.5)
    assert float(PL.bubble_slots(ids["zero-bubble"], 8, 1, SCHEDULES, 4)) == pytest.approx(11 / 3)
    # one micro-batch: no schedule can overlap anything, every one idles p - 1 slots of the whole stage
    assert float(PL.bubble_slots(ids["interleaved-1f1b"], 8, 4, SCHEDULES, 1)) == pytest.approx(7.0)


@settings(max_examples=50, deadline=None)
@given(
    p=st.integers(1, 64),
    m=st.integers(1, 512),
    extra=st.integers(1, 512),
    v=st.integers(1, 8),
    schedule=st.sampled_from(SCHEDULES),
)
def test_more_microbatches_never_raise_the_bubble_fraction(p, m, extra, v, schedule):
    v = v if schedule == "interleaved-1f1b" else 1
    assert PL.bubble_fraction(schedule, p, m + extra, v) <= PL.bubble_fraction(schedule, p, m, v)


def test_inflight_microbatches():
    i1f1b, igpipe, iinter = (SCHEDULES.index(s) for s in ("1f1b", "gpipe", "interleaved-1f1b"))
    assert float(PL.inflight_microbatches_first_stage(i1f1b, 8, 64, 1, SCHEDULES)) == 8
    assert float(PL.inflight_microbatches_first_stage(i1f1b, 8, 4, 1, SCHEDULES)) == 4
    assert float(PL.inflight_microbatches_first_stage(igpipe, 8, 64, 1, SCHEDULES)) == 64
    # Korthikanti et al. 2022 Sec. 4.2.3: p (1 + (p-1)/(p v))
    assert float(
        PL.inflight_microbatches_first_stage(iinter, 8, 64, 2, SCHEDULES)
    ) == pytest.approx(8 * (1 + 7 / 16))


def _deepspeed_train_schedule(p: int, m: int, stage: int) -> list[tuple]:
    """The instructions of DeepSpeed's TrainSchedule for `stage` (v0.6.5 runtime/pipe/schedule.py, written in this
    test's words): 2 (m + p - 1) steps; even steps run forwards on even stages and backwards on odd ones, odd steps
    the other way; a forward step receives its activation and sends the previous step's gradient back, a backward
    step sends the previous step's activation on and receives its gradient."""
    out, prev = [], -1
    valid = lambda i: 0 <= i < m  # noqa: E731
    for k in range(2 * (m + p - 1)):
        even_k, even_s = k % 2 == 0, stage % 2 == 0
        if even_k and even_s:
            mb, fwd = k // 2 - stage // 2, True
        elif not even_k and not even_s:
            mb, fwd = (k - 1) // 2 - stage // 2, True
        elif even_k:
            mb, fwd = k // 2 - p + (stage + 1) // 2, False
        else:
            mb, fwd = (k - 1) // 2 - p + 1 + stage // 2, False
        if fwd:
            if valid(mb) and stage > 0:
                out.append(("recv", stage - 1, ("act", mb)))
            if valid(prev) and stage > 0:
                out.append(("send", stage - 1, ("grad", prev)))
        else:
            if valid(prev) and stage < p - 1:
                out.append(("send", stage + 1, ("act", prev)))
            if valid(mb) and stage < p - 1:
                out.append(("recv", stage + 1, ("grad", mb)))
        if valid(mb):
            out.append(("F" if fwd else "B",))
        prev = mb
    return out


def _makespan(p: int, m: int, f: float, b: float) -> float:
    """Each stage runs its instructions in order; a send and its receive complete together, when both stages
    have reached them (NCCL's point-to-point rendezvous)."""
    ops = [_deepspeed_train_schedule(p, m, s) for s in range(p)]
    t, i = [0.0] * p, [0] * p
    while any(i[s] < len(ops[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while i[s] < len(ops[s]):
                op = ops[s][i[s]]
                if op[0] in ("F", "B"):
                    t[s] += f if op[0] == "F" else b
                    i[s] += 1
                    moved = True
                    continue
                kind, peer, tag = op
                if (
                    kind == "send"
                    and i[peer] < len(ops[peer])
                    and ops[peer][i[peer]] == ("recv", s, tag)
                ):
                    t[s] = t[peer] = max(t[s], t[peer])
                    i[s] += 1
                    i[peer] += 1
                    moved = True
                    continue
                break
        assert moved, "deadlock"
    return max(t)


@pytest.mark.parametrize("p,m", [(4, 1), (12, 1), (12, 24), (12, 128), (35, 240), (6, 256)])
def test_deepspeeds_train_schedule_takes_the_1f1b_time_the_model_costs(p, m):
    """DeepSpeed's lockstep TrainSchedule, simulated instruction by instruction, takes (m + p - 1)(F + B), the
    1F1B time of bubble_slots (p - 1 idle slots) with backward = 3 forwards (full recomputation): the PipelineEngine
    adds no bubble of its own."""
    f, b = 1.0, 3.0
    assert _makespan(p, m, f, b) == pytest.approx((m + p - 1) * (f + b))
    slots = float(PL.bubble_slots(SCHEDULES.index("1f1b"), p, 1, SCHEDULES, m))
    assert slots == pytest.approx(p - 1)
