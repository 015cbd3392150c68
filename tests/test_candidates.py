"""The candidate space: degrees multiply to the world size and every rule of the docstring holds, for
dp x tp x pp and for cp (with its exchange), dp_shard and ep."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from frameworks import load_framework
from frameworks.rules import violations
from planner import parallel
from planner.candidates import (
    FIELDS,
    PLACEMENTS,
    SearchSpace,
    cp_comm_allowed,
    degree_tuples,
    degree_triples,
    distinct_placements,
    divisors,
    generate,
    placement_text,
    shard_groups,
    skeleton_rows,
    tp_allowed,
)
from planner.errors import ConfigError
from planner.parallel import (
    CP_COMMS,
    FRAMEWORKS,
    OFFLOAD,
    RECOMPUTE,
    SCHEDULES,
    ParallelConfig,
    ep_allowed,
)


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


def test_degree_tuples_split_the_sequence_as_check_sequence_allows():
    """cp takes every divisor whose 2 cp chunks split the sequence (seq 2048 = 2^11: cp up to 1024 by the rule,
    64 by 960's factors); without a sequence only cp = 1."""
    tuples = degree_tuples(960, 1536, heads=96, kv_heads=96, blocks=96, seq=2048)
    assert all(dp * tp * pp * cp == 960 for dp, tp, pp, cp in tuples)
    assert {cp for *_, cp in tuples} == {1, 2, 4, 8, 16, 32, 64}
    assert set(degree_triples(960, 1536, heads=96, kv_heads=96, blocks=96)) == {
        (dp, tp, pp) for dp, tp, pp, cp in tuples if cp == 1
    }
    odd = degree_tuples(
        64, 64, heads=8, kv_heads=8, blocks=8, seq=6
    )  # 6 % (2 cp): only cp = 1, 3 would
    assert {cp for *_, cp in odd} == {1}
    assert {
        cp
        for *_, cp in degree_tuples(
            64, 64, heads=8, kv_heads=8, blocks=8, seq=8, space=SearchSpace(max_cp=2)
        )
    } == {1, 2}


@pytest.mark.parametrize(
    "cp,tp,seq,comm",
    [
        (c, t, s, m)
        for c in (1, 2, 3, 4, 8)
        for t in (1, 2, 4)
        for s in (12, 16, 4096)
        for m in CP_COMMS
    ],
)
def test_cp_rule_is_check_sequences(cp, tp, seq, comm):
    """The generator's cp rule is ParallelConfig.check_sequence's, called, not restated."""
    cfg = ParallelConfig(tp=tp, cp=cp, cp_comm=comm, placement="DPCT" if cp > 1 else "DPT", seq=seq)
    try:
        cfg.check_sequence(seq, heads=16, kv_heads=8)
        ok = True
    except ConfigError:
        ok = False
    assert cp_comm_allowed(comm, cp=cp, tp=tp, seq=seq, heads=16, kv_heads=8) == ok


def test_distinct_placements_drop_layouts_that_only_move_a_unit_axis():
    assert len(distinct_placements(2, 2, 2)) == 6
    assert len(distinct_placements(1, 2, 2)) == 2
    assert len(distinct_placements(4, 1, 1)) == 1
    names = [PLACEMENTS[i] for i in distinct_placements(1, 8, 4)]
    assert {n.replace("D", "") for n in names} == {"PT", "TP"}


def test_placement_text_puts_c_just_left_of_t_and_e_left_of_c():
    assert placement_text(PLACEMENTS.index("DPT")) == "DPT"
    assert placement_text(PLACEMENTS.index("DPT"), cp=2) == "DPCT"
    assert placement_text(PLACEMENTS.index("TDP"), cp=4) == "CTDP"
    assert placement_text(PLACEMENTS.index("PDT"), cp=2, ep=4) == "PDECT"
    assert placement_text(PLACEMENTS.index("PDT"), ep=2) == parallel.default_placement(
        1, 2
    ).replace("DP", "PD")
    for i in range(len(PLACEMENTS)):
        for cp, ep in ((1, 1), (2, 1), (1, 2), (2, 2)):
            parallel.check_placement(placement_text(i, cp=cp, ep=ep), cp=cp, ep=ep)


def test_every_candidate_is_a_valid_parallel_config():
    cands = generate(64, 128, heads=16, kv_heads=4, blocks=24, seq=1024, fast_domain=8)
    assert len(cands) > 10_000
    a = cands.arrays
    assert set(a) == set(FIELDS)
    assert np.all(a["dp"] * a["tp"] * a["pp"] * a["cp"] == 64)
    assert set(np.unique(a["cp"])) == {1, 2, 4, 8, 16, 32, 64}
    assert np.all(128 % (a["dp"] * a["micro_batch"]) == 0)
    assert np.all(a["pp"] * a["virtual_stages"] <= 24)
    assert not np.any(a["sequence_parallel"] & (a["tp"] == 1))
    assert not np.any((a["zero"] > 0) & (a["dp"] * a["cp"] == 1))
    assert np.any((a["zero"] > 0) & (a["dp"] == 1) & (a["cp"] > 1))  # ZeRO shards over the cp ranks
    assert np.all(a["cp_comm"][a["cp"] == 1] == 0)
    a2a = a["cp_comm"] == CP_COMMS.index("a2a")
    assert a2a.any() and np.all(
        4 % (a["tp"][a2a] * a["cp"][a2a]) == 0
    )  # Ulysses splits the 4 K/V heads
    assert np.all(
        (a["dp_shard"] == 0) | ((a["zero"] >= 1) & (a["dp"] % np.maximum(a["dp_shard"], 1) == 0))
    )
    assert np.all(a["schedule"][a["pp"] == 1] == SCHEDULES.index("1f1b"))
    interleaved = a["schedule"] == SCHEDULES.index("interleaved-1f1b")
    assert np.all(a["virtual_stages"][interleaved] >= 2) and np.all(
        a["virtual_stages"][~interleaved] == 1
    )
    m = 128 // (a["dp"] * a["micro_batch"])
    looped = interleaved | (a["schedule"] == SCHEDULES.index("zero-bubble"))
    rounds = np.maximum(1, m // a["pp"])
    assert np.all(m[looped] % rounds[looped] == 0)
    rng = np.random.default_rng(0)
    names = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "offload": OFFLOAD, "cp_comm": CP_COMMS}
    for i in rng.choice(len(cands), 300, replace=False):
        cfg = cands.config(int(i), seq=1024, precision="bf16")
        # row i of the arrays, knob by knob (names decoded), plus what the search fixed
        for knob in FIELDS:
            value = a[knob][i].item()
            if knob == "placement":
                assert cfg.placement == placement_text(value, cp=cfg.cp, ep=cfg.ep)
                continue
            assert getattr(cfg, knob) == (names[knob][value] if knob in names else value), knob
        assert (cfg.global_batch, cfg.seq, cfg.precision) == (128, 1024, "bf16")
        assert cfg.num_microbatches * cfg.dp * cfg.micro_batch == 128
        cfg.check_world_size(64)
        cfg.check_model(heads=16, kv_heads=4, blocks=24)
        cfg.check_sequence(1024, heads=16, kv_heads=4)


@settings(max_examples=40, deadline=None)
@given(
    world_exp=st.integers(0, 7),
    batch_mult=st.sampled_from([1, 2, 3]),
    heads=st.sampled_from([8, 12, 32]),
    kv_div=st.sampled_from([1, 2, 4]),
    blocks=st.integers(1, 24),
    seq_exp=st.integers(2, 14),
    experts=st.sampled_from([None, 4, 8, 60]),
    framework=st.sampled_from(FRAMEWORKS),
    domain=st.sampled_from([4, 8, 72]),
    seed=st.integers(0, 2**16),
)
def test_every_enumerated_candidate_is_valid_and_runnable(
    world_exp, batch_mult, heads, kv_div, blocks, seq_exp, experts, framework, domain, seed
):
    """Random shapes, sequences, MoE expert counts and frameworks: every candidate the space holds is a
    ParallelConfig that validates (degrees, sequence split, ep rule, placement) and that its framework runs."""
    world, seq, kv_heads = 2**world_exp, 2**seq_exp, heads // kv_div
    fw = load_framework(framework)
    space = SearchSpace(max_micro_batch=4).for_framework(fw)
    rows = skeleton_rows(
        world,
        world * batch_mult,
        heads=heads,
        kv_heads=kv_heads,
        blocks=blocks,
        space=space,
        rejected=Counter(),
        seq=seq,
        experts=experts,
        fast_domain=domain,
    )
    cands = generate(
        world,
        world * batch_mult,
        heads=heads,
        kv_heads=kv_heads,
        blocks=blocks,
        seq=seq,
        experts=experts,
        fast_domain=domain,
        space=space,
    )
    assert len(cands) == 0 or set(np.unique(cands.arrays["cp"])) <= set(np.unique(rows["cp"]))
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(cands), min(len(cands), 60), replace=False):
        cfg = cands.config(int(i), seq=seq, precision="amp-bf16", framework=framework)
        cfg.check_world_size(world)
        cfg.check_model(heads=heads, kv_heads=kv_heads, blocks=blocks)
        cfg.check_sequence(seq, heads=heads, kv_heads=kv_heads)
        assert ep_allowed(cfg.ep, dp=cfg.dp, cp=cfg.cp, tp=cfg.tp, experts=experts or 1)
        assert cfg.ep == 1 or experts is not None
        assert not violations(fw, cfg), (cfg, violations(fw, cfg))


def test_no_duplicates():
    cands = generate(32, 64, heads=8, blocks=8, seq=256, fast_domain=8)
    stacked = np.ascontiguousarray(
        np.stack([cands.arrays[f].astype(np.int64) for f in FIELDS], axis=1)
    )
    # each row as one opaque value: np.unique over rows (axis=0) is ten times slower
    rows = stacked.view(np.dtype((np.void, stacked.itemsize * stacked.shape[1]))).ravel()
    assert len(np.unique(rows)) == len(cands)


def test_no_placement_moves_only_a_degree_one_axis():
    """Two candidates equal but for the placement always lay ranks out differently: with C riding on T's
    slot, the reduced layout (axes of degree > 1, T's slot of degree tp x cp) differs."""
    cands = generate(16, 32, heads=8, blocks=8, seq=256)
    a = cands.arrays
    key = np.stack([a[f] for f in FIELDS if f != "placement"], axis=1)
    degrees = {"D": a["dp"], "P": a["pp"], "T": a["tp"] * a["cp"]}
    reduced = [
        "".join(x for x in PLACEMENTS[p] if degrees[x][i] > 1) for i, p in enumerate(a["placement"])
    ]
    seen = {}
    for i in range(len(cands)):
        layout = seen.setdefault(tuple(key[i]), set())
        assert reduced[i] not in layout
        layout.add(reduced[i])
    assert any(len(v) > 1 for v in seen.values())


def test_space_restrictions_shrink_the_space():
    full = generate(32, 64, heads=8, blocks=8, seq=256)
    small = generate(
        32,
        64,
        heads=8,
        blocks=8,
        seq=256,
        space=SearchSpace(zero=(0,), offload=("none",), max_tp=4, max_cp=2, cp_comm=("p2p",)),
    )
    assert 0 < len(small) < len(full)
    assert small.arrays["zero"].max() == 0 and small.arrays["tp"].max() <= 4
    assert small.arrays["cp"].max() == 2 and set(np.unique(small.arrays["cp_comm"])) == {0}
    pinned = generate(32, 64, heads=8, blocks=8, seq=256, space=SearchSpace(cp=(4,)))
    assert set(np.unique(pinned.arrays["cp"])) == {4}


def test_frameworks_narrow_the_new_dimensions():
    assert SearchSpace().for_framework(load_framework("fsdp")).max_cp == 1  # no context parallelism
    assert SearchSpace().for_framework(load_framework("deepspeed")).cp_comm == (
        "a2a",
    )  # Ulysses only
    assert SearchSpace().for_framework(load_framework("torchtitan")).cp_comm == (
        "p2p",
        "all_gather",
    )
    assert SearchSpace().for_framework(load_framework("fsdp")).max_ep == 1


def test_hybrid_shard_groups_are_the_largest_inside_the_fast_domain_and_doublings_across():
    """dp itself (0), the largest divisor of dp whose shard group (x cp ranks, D just left of C and T)
    fills a whole number of groups per domain, and of that group doubled while it spans whole domains
    the smallest and the largest below dp."""
    assert shard_groups(64, tp=1, cp=1, fast_domain=8) == [0, 8, 16, 32]
    assert shard_groups(64, tp=2, cp=2, fast_domain=8) == [0, 2, 4, 32]  # 2 x 2 x 2 = 8 ranks
    assert shard_groups(64, tp=8, cp=1, fast_domain=8) == [0, 2, 32]  # tp fills the node
    assert shard_groups(64, tp=1, cp=1, fast_domain=72) == [0, 8]  # 72 = 8 x 9: 8 | 72, 16 does not
    assert shard_groups(96, tp=1, cp=1, fast_domain=72) == [
        0,
        24,
    ]  # GB200 NVL72: 24 | 72, 48 spans 2/3
    assert shard_groups(6, tp=4, cp=2, fast_domain=8) == [0, 1, 2]  # 3 x 8 ranks: 3 is no doubling
    assert shard_groups(96, tp=3, cp=1, fast_domain=72) == [0, 24, 48]  # 48 x 3 = 2 racks
    assert shard_groups(4, tp=1, cp=1, fast_domain=8) == [0, 2]  # a group smaller than dp only
    assert shard_groups(1, tp=1, cp=4, fast_domain=8) == [0]
    assert shard_groups(8, tp=1, cp=1, fast_domain=8, pinned=4) == [4]
    assert shard_groups(8, tp=1, cp=1, fast_domain=8, pinned=3) == []
    rows = skeleton_rows(
        144,
        288,
        heads=32,
        kv_heads=8,
        blocks=32,
        space=SearchSpace(),
        rejected=Counter(),
        seq=8192,
        fast_domain=72,
    )
    hybrid = rows["dp_shard"] > 0
    assert (
        hybrid.any()
        and np.all(rows["zero"][hybrid] >= 1)
        and np.all(rows["dp_shard"][hybrid] < rows["dp"][hybrid])
    )
    assert np.all(rows["dp"][hybrid] % rows["dp_shard"][hybrid] == 0)
    group = rows["dp_shard"][hybrid] * rows["cp"][hybrid] * rows["tp"][hybrid]
    assert np.all((72 % group == 0) | (group % 72 == 0))  # inside one NVL72 rack, or whole racks


def test_ep_follows_the_one_rule(monkeypatch):
    """Mixtral-like: 8 experts. ep x expert_tp divides tp x dp x cp (Megatron-Core's parallel folding) and ep
    divides the experts (planner.parallel.ep_allowed); swapping the rule there changes what the generator
    enumerates, so the rule lives in that one function."""
    kw = dict(
        heads=32, kv_heads=8, blocks=8, space=SearchSpace(), rejected=Counter(), seq=4096, experts=8
    )
    rows = skeleton_rows(64, 64, **kw)
    assert set(np.unique(rows["ep"])) == {1, 2, 4, 8}
    assert np.all(ep_allowed(rows["ep"], dp=rows["dp"], cp=rows["cp"], tp=rows["tp"], experts=8))
    assert np.any((rows["ep"] > rows["dp"]) & (rows["cp"] > 1))  # carved from dp x cp, not dp alone
    assert np.any(rows["ep"] > rows["dp"] * rows["cp"])  # folding: ep | tp x dp x cp
    dense = skeleton_rows(64, 64, **dict(kw, experts=None))
    assert set(np.unique(dense["ep"])) == {1}
    monkeypatch.setattr(
        parallel,
        "ep_allowed",
        lambda ep, *, dp, cp=1, tp=1, expert_tp=1, experts=None: (
            ((np.asarray(dp) * np.asarray(cp)) % np.asarray(ep) == 0)
            & ((experts is None) | (np.asarray(experts or 1) % np.asarray(ep) == 0))
        ),
    )  # ep | dp x cp
    narrower = skeleton_rows(64, 64, **dict(kw, rejected=Counter()))
    assert not np.any(narrower["ep"] > narrower["dp"] * narrower["cp"])
    assert len(narrower["dp"]) < len(rows["dp"])


def test_rejections_are_counted_by_reason():
    cands = generate(960, 1536, heads=96, blocks=96, seq=2048)
    assert cands.rejected["tp does not divide the heads (degrees)"] > 0
    assert cands.rejected["dp does not divide the global batch (degrees)"] > 0
    assert cands.rejected["seq not divisible by 2 cp (degrees)"] > 0
    assert len(cands) > 100_000


def test_impossible_batch_gives_an_empty_space():
    cands = generate(7, 3, heads=8, blocks=2)  # dp must be 7 (tp=1: 7 !| 8, pp <= 2): 3 % 7
    assert len(cands) == 0
