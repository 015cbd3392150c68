"""Placement strings -> rank strides -> which groups stay inside a node (docstring worked example)."""
from __future__ import annotations

import numpy as np

from planner.placement import PLACEMENTS, group_locality, placement_index, strides


def test_six_permutations():
    assert sorted(PLACEMENTS) == sorted(["DPT", "DTP", "PDT", "PTD", "TDP", "TPD"])


def test_right_most_letter_has_stride_one():
    st = strides(placement_index("DPT"), 2, 2, 4)
    assert (int(st["T"]), int(st["P"]), int(st["D"])) == (1, 4, 8)
    st = strides(placement_index("TPD"), 2, 2, 4)
    assert (int(st["D"]), int(st["P"]), int(st["T"])) == (1, 2, 4)


def test_worked_example_dp2_pp2_tp4_on_8_device_nodes():
    cluster = group_locality(placement_index("DPT"), 2, 2, 4, 8)
    assert int(cluster["T"]) == 4          # tp group {0,1,2,3}: one node
    assert int(cluster["P"]) == 2          # pp group {0,4}: same node
    assert int(cluster["D"]) == 1          # dp group {0,8}: one rank per node
    spread = group_locality(placement_index("TPD"), 2, 2, 4, 8)
    assert int(spread["T"]) == 2           # tp group {0,4,8,12}: 2 ranks on each of 2 nodes
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
