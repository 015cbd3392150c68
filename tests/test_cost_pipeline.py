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
@given(p=st.integers(1, 64), m=st.integers(1, 512), extra=st.integers(1, 512), v=st.integers(1, 8),
       schedule=st.sampled_from(SCHEDULES))
def test_more_microbatches_never_raise_the_bubble_fraction(p, m, extra, v, schedule):
    v = v if schedule == "interleaved-1f1b" else 1
    assert PL.bubble_fraction(schedule, p, m + extra, v) <= PL.bubble_fraction(schedule, p, m, v)


def test_inflight_microbatches():
    i1f1b, igpipe, iinter = (SCHEDULES.index(s) for s in ("1f1b", "gpipe", "interleaved-1f1b"))
    assert float(PL.inflight_microbatches_first_stage(i1f1b, 8, 64, 1, SCHEDULES)) == 8
    assert float(PL.inflight_microbatches_first_stage(i1f1b, 8, 4, 1, SCHEDULES)) == 4
    assert float(PL.inflight_microbatches_first_stage(igpipe, 8, 64, 1, SCHEDULES)) == 64
    # Korthikanti et al. 2022 Sec. 4.2.3: p (1 + (p-1)/(p v))
    assert float(PL.inflight_microbatches_first_stage(iinter, 8, 64, 2, SCHEDULES)) == pytest.approx(8 * (1 + 7 / 16))
