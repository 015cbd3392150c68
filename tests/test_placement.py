"""Placement strings -> rank strides -> which groups stay inside a node (docstring worked example)."""

from __future__ import annotations

import numpy as np

from planner.placement import PLACEMENTS, distinct_rows, group_locality, placement_index, strides


def test_six_permutations():
    assert sorted(PLACEMENTS) == sorted(["DPT", "DTP", "PDT", "PTD", "TDP", "TPD"])


def test_right_most_letter_has_stride_one():
    st = strides(placement_index("DPT"), 2, 2, 4)
    assert (int(st["T"]), int(st["P"]), int(st["D"])) == (1, 4, 8)
    st = strides(placement_index("TPD"), 2, 2, 4)
    assert (int(st["D"]), int(st["P"]), int(st["T"])) == (1, 2, 4)


def test_worked_example_dp2_pp2_tp4_on_8_device_nodes():
    cluster = group_locality(placement_index("DPT"), 2, 2, 4, 8)
    assert int(cluster["T"]) == 4  # tp group {0,1,2,3}: one node
    assert int(cluster["P"]) == 2  # pp group {0,4}: same node
    assert int(cluster["D"]) == 1  # dp group {0,8}: one rank per node
    spread = group_locality(placement_index("TPD"), 2, 2, 4, 8)
    assert int(spread["T"]) == 2  # tp group {0,4,8,12}: 2 ranks on each of 2 nodes
    assert int(spread["D"]) == 2


def test_vectorized_over_candidates():
    idx = np.array([placement_index("DPT"), placement_index("TPD")])
    loc = group_locality(idx, np.array([2, 2]), np.array([2, 2]), np.array([4, 4]), 8)
    assert loc["T"].tolist() == [4, 2]


def test_groups_straddling_a_node_boundary_cross_the_network():
    # tp=3 on 8-device nodes: the group {6, 7, 8} spans two nodes
    loc = group_locality(placement_index("DPT"), 8, 1, 3, 8)
    assert int(loc["T"]) == 1
    # tp=4, dp=4 with DPT: dp stride 4, two members per node, aligned
    loc = group_locality(placement_index("DPT"), 4, 1, 4, 8)
    assert int(loc["T"]) == 4 and int(loc["D"]) == 2


def test_a_large_batch_gives_each_row_its_own_layouts_answer():
    """group_locality computes each distinct layout once for a large batch (repeated layouts, 64+ rows); every
    row must get what that row alone gets (one candidate never goes through the per-layout cache)."""
    rng = np.random.default_rng(7)
    n = 400
    dp, tp = rng.choice([1, 2, 4, 8, 16], n), rng.choice([1, 2, 4, 8], n)
    pp, cp = rng.choice([1, 2, 4], n), rng.choice([1, 2, 4], n)
    place = rng.integers(0, len(PLACEMENTS), n)
    shard = np.where(rng.random(n) < 0.5, dp, np.maximum(dp // 2, 1))
    etp = np.where(tp % 2 == 0, rng.choice([1, 2], n), 1)
    ep = np.array(
        [
            rng.choice([e for e in (1, 2, 4, 8, 16) if (t * c * d) % (e * x) == 0])
            for t, c, d, x in zip(tp, cp, dp, etp)
        ]
    )
    for domain in (8, 72):
        batch = group_locality(
            place, dp, pp, tp, domain, cp=cp, dp_shard=shard, ep=ep, expert_tp=etp
        )
        for i in rng.choice(n, 60, replace=False):
            one = group_locality(
                int(place[i]),
                int(dp[i]),
                int(pp[i]),
                int(tp[i]),
                domain,
                cp=int(cp[i]),
                dp_shard=int(shard[i]),
                ep=int(ep[i]),
                expert_tp=int(etp[i]),
            )
            assert {k: int(v[i]) for k, v in batch.items()} == {
                k: int(v) for k, v in one.items()
            }, i


def test_distinct_rows_finds_each_distinct_row_once():
    """distinct_rows: one index per distinct row and each row's way back to it, whether columns are ranked by
    lookup table or by sorting (a column with a huge value), and whether the packed keys are looked up in a
    table (few combinations) or sorted (more combinations than rows)."""
    rng = np.random.default_rng(3)
    dense = [
        rng.integers(0, 5, 3000),
        rng.choice([1, 2, 4, 8, 2048], 3000),
        rng.integers(0, 3, 3000),
    ]
    sparse = [dense[0], np.where(dense[1] == 2048, 2**40, dense[1]), dense[2]]
    many = [rng.integers(0, 20, 3000) for _ in range(4)]
    for cols in (dense, sparse, many):
        first, inverse = distinct_rows(cols)
        table = np.stack(cols, axis=1)
        assert len(first) == len(np.unique(table, axis=0))
        assert (table[first][inverse] == table).all()
