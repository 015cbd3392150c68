"""The candidate space: degrees multiply to the world size and every rule of the docstring holds."""
import numpy as np
import pytest

from planner.candidates import (FIELDS, PLACEMENTS, SearchSpace, degree_triples, distinct_placements, divisors,
                                generate, tp_allowed)
from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]
    assert len(divisors(960)) == 28


def test_tp_rule_follows_heads_and_kv_heads():
    assert tp_allowed(8, 32, 8) and tp_allowed(4, 32, 8)
    # whole K/V groups per rank (Megatron asserts kv_heads % tp == 0): no replication when tp > kv_heads
    assert not tp_allowed(16, 32, 8) and not tp_allowed(2, 32, 1)
    assert not tp_allowed(3, 32, 32) and not tp_allowed(16, 48, 12)


def test_degree_triples_for_gpt3_on_960_gpus():
    triples = degree_triples(960, 1536, heads=96, kv_heads=96, blocks=96)
    assert all(dp * tp * pp == 960 for dp, tp, pp in triples)
    assert all(96 % tp == 0 and pp <= 96 and 1536 % dp == 0 for dp, tp, pp in triples)
    # 960 = 2^6 * 3 * 5 and 1536 = 2^9 * 3: the factor 5 must sit in pp (tp divides 96)
    assert all(pp % 5 == 0 for _, _, pp in triples)
    assert (12, 8, 10) in triples


def test_distinct_placements_drop_layouts_that_only_move_a_unit_axis():
    assert len(distinct_placements(2, 2, 2)) == 6
    assert len(distinct_placements(1, 2, 2)) == 2
    assert len(distinct_placements(4, 1, 1)) == 1
    names = [PLACEMENTS[i] for i in distinct_placements(1, 8, 4)]
    assert {n.replace("D", "") for n in names} == {"PT", "TP"}


def test_every_candidate_is_a_valid_parallel_config():
    cands = generate(64, 128, heads=16, kv_heads=4, blocks=24)
    assert len(cands) > 10_000
    a = cands.arrays
    assert set(a) == set(FIELDS)
    assert np.all(a["dp"] * a["tp"] * a["pp"] == 64)
    assert np.all(128 % (a["dp"] * a["micro_batch"]) == 0)
    assert np.all(a["pp"] * a["virtual_stages"] <= 24)
    assert not np.any(a["sequence_parallel"] & (a["tp"] == 1))
    assert not np.any((a["zero"] > 0) & (a["dp"] == 1))
    assert np.all(a["schedule"][a["pp"] == 1] == SCHEDULES.index("1f1b"))
    interleaved = a["schedule"] == SCHEDULES.index("interleaved-1f1b")
    assert np.all(a["virtual_stages"][interleaved] >= 2) and np.all(a["virtual_stages"][~interleaved] == 1)
    m = 128 // (a["dp"] * a["micro_batch"])
    looped = interleaved | (a["schedule"] == SCHEDULES.index("zero-bubble"))
    rounds = np.maximum(1, m // a["pp"])
    assert np.all(m[looped] % rounds[looped] == 0)
    rng = np.random.default_rng(0)
    names = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "offload": OFFLOAD, "placement": PLACEMENTS}
    for i in rng.choice(len(cands), 200, replace=False):
        cfg = cands.config(int(i), seq=1024, precision="bf16")
        # row i of the arrays, knob by knob (names decoded), plus what the search fixed
        for knob in FIELDS:
            value = a[knob][i].item()
            assert getattr(cfg, knob) == (names[knob][value] if knob in names else value), knob
        assert (cfg.global_batch, cfg.seq, cfg.precision) == (128, 1024, "bf16")
        assert cfg.num_microbatches * cfg.dp * cfg.micro_batch == 128
        cfg.check_world_size(64)
        cfg.check_model(heads=16, kv_heads=4, blocks=24)


def test_no_duplicates():
    cands = generate(32, 64, heads=8, blocks=8)
    stacked = np.stack([cands.arrays[f].astype(np.int64) for f in FIELDS], axis=1)
    assert len(np.unique(stacked, axis=0)) == len(cands)


def test_space_restrictions_shrink_the_space():
    full = generate(32, 64, heads=8, blocks=8)
    small = generate(32, 64, heads=8, blocks=8, space=SearchSpace(zero=(0,), offload=("none",), max_tp=4))
    assert 0 < len(small) < len(full)
    assert small.arrays["zero"].max() == 0 and small.arrays["tp"].max() <= 4


def test_rejections_are_counted_by_reason():
    cands = generate(960, 1536, heads=96, blocks=96)
    assert cands.rejected["tp does not divide the heads (degree triples)"] > 0
    assert cands.rejected["dp does not divide the global batch (degree triples)"] > 0
    assert len(cands) > 100_000


def test_impossible_batch_gives_an_empty_space():
    cands = generate(7, 3, heads=8, blocks=2)   # dp must be 7 (tp=1: 7 !| 8, pp <= 2): 3 % 7
    assert len(cands) == 0
