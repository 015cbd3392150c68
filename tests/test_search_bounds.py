"""The premises the search's branch and bound rests on (planner.search, module docstring), checked on the real
scorer over sampled candidates of several scenarios (context parallelism, hybrid sharding, FP8, a GB200 NVL72
domain, a mixture-of-experts model, three frameworks), and the bounded search's answer checked against
scoring every candidate."""

import itertools
from collections import Counter

import numpy as np
import pytest

from frameworks import load_framework
from hardware_profiles import load_profile
from planner.candidates import (
    FIELDS,
    SearchSpace,
    _pattern_groups,
    _product,
    skeleton_rows,
    with_micro_batches,
    with_placements,
)
from planner.software import software_for
from planner.parallel import RECOMPUTE
from planner.score import CandidateArrays, score
from planner.search import (
    SHAPE_BOUND_TERMS,
    Admission,
    Workload,
    SHAPE_FIELDS,
    TIME_BOUND_TERMS,
    placement_classes,
    rank,
    score_space,
)
from planner.search.bounds import EP_BOUND_TERM, ep_classes
from planner.sources import resolve_model

SCENARIOS = [  # model, seq, hardware, gpus, global batch, framework, precision
    ("gpt3-175b", 2048, "p4d.24xlarge", 960, 1536, "megatron", "amp-bf16"),
    ("llama3-8b", 32768, "p5.48xlarge", 64, 64, "megatron", "fp8"),
    ("llama3-70b", 16384, "p6e-gb200.36xlarge", 144, 144, "torchtitan", "amp-bf16"),
    ("llama3-8b", 8192, "dgx-h100", 32, 64, "deepspeed", "amp-bf16"),
    ("mixtral-8x7b", 8192, "p5.48xlarge", 64, 128, "megatron", "amp-bf16"),
]


def _members(name, seq, hw_name, gpus, batch, framework, precision, shapes=150):
    """About `shapes` sampled skeleton shapes (a skeleton without ZeRO, dp_shard, offload), each with all of its
    model-state variants, micro-batches, placements, sequence-parallel choices and recompute levels:
    (arrays, scores, space)."""
    model, hw, sw = resolve_model(name, seq=seq), load_profile(hw_name), software_for(framework)
    space = SearchSpace().for_framework(sw.framework)
    skel = skeleton_rows(
        gpus,
        batch,
        heads=model.heads,
        kv_heads=model.n_kv_heads,
        blocks=model.total_blocks,
        space=space,
        rejected=Counter(),
        seq=seq,
        experts=model.moe.experts if model.moe else None,
        fast_domain=hw.nvlink_domain_devices,
    )
    shape = _groups(skel, ("dp", "tp", "pp", "cp", "cp_comm", "ep", "schedule", "virtual_stages"))
    pick = np.isin(shape, np.random.default_rng(0).permutation(shape.max() + 1)[:shapes])
    rows = with_micro_batches({k: v[pick] for k, v in skel.items()}, batch, space=space)
    rows["row"] = np.arange(len(rows["dp"]))
    placed = with_placements(rows, space=space)
    sp_values = np.array(sorted(set(space.sequence_parallel)), dtype=np.int64)
    arrays = _product(
        _product(placed, "sequence_parallel", sp_values),
        "recompute",
        np.array([RECOMPUTE.index(r) for r in space.recompute]),
    )
    keep = (arrays["tp"] > 1) | (arrays["sequence_parallel"] == 0)
    arrays = {k: v[keep] for k, v in arrays.items()}
    arrays["sequence_parallel"] = arrays["sequence_parallel"].astype(bool)
    s = score(
        model,
        hw,
        CandidateArrays.from_mapping({k: arrays[k] for k in FIELDS}),
        global_batch=batch,
        seq=seq,
        precision=precision,
        software=sw,
    )
    return arrays, s, space


def _terms(s, names):
    return sum(np.asarray(getattr(s, t), float) for t in names)


def _groups(arrays, names):
    """Ids of the distinct value tuples of these columns."""
    return np.unique(
        np.stack([np.asarray(arrays[n]).astype(np.int64) for n in names], axis=1),
        axis=0,
        return_inverse=True,
    )[1].ravel()


@pytest.fixture(scope="module", params=SCENARIOS, ids=[f"{s[0]}-{s[5]}-{s[2]}" for s in SCENARIOS])
def scored(request):
    return _members(*request.param)


def test_no_step_is_shorter_than_its_bound_terms(scored):
    arrays, s, _ = scored
    assert len(arrays["dp"]) > 500
    assert np.all(np.asarray(s.step_time_s) >= _terms(s, TIME_BOUND_TERMS) * (1 - 1e-12))


def test_the_bound_grows_along_recompute_within_a_group(scored):
    """Within a group (a row with a placement and a sequence-parallel choice) the bound is least at the
    weakest recompute and never falls from one level to the next."""
    arrays, s, _ = scored
    bound = _terms(s, TIME_BOUND_TERMS)
    group = _groups(arrays, ("row", "placement", "sequence_parallel"))
    order = np.lexsort((arrays["recompute"], group))
    same = group[order][1:] == group[order][:-1]
    assert same.any()
    assert np.all(bound[order][1:][same] >= bound[order][:-1][same] * (1 - 1e-12))


def test_shape_terms_ignore_the_model_state_knobs_and_the_placement_class(scored):
    """Equal across ZeRO stage, dp_shard and offload (the shape) and across placements that lay T and C on the
    same ranks, at every recompute level and sequence-parallel choice."""
    arrays, s, space = scored
    cls = np.zeros(len(arrays["dp"]), dtype=np.int64)
    for _, place, mask in _pattern_groups(arrays, space):
        for k, members in enumerate(
            placement_classes(place, exact=bool(np.any(arrays["ep"][mask] > 1)))
        ):
            cls[mask & np.isin(arrays["placement"], members)] = k
    arrays = dict(arrays, place_class=cls)
    shape = _groups(arrays, SHAPE_FIELDS + ("place_class", "sequence_parallel", "recompute"))
    terms = _terms(s, SHAPE_BOUND_TERMS)
    low, high = np.full(shape.max() + 1, np.inf), np.full(shape.max() + 1, -np.inf)
    np.minimum.at(low, shape, terms)
    np.maximum.at(high, shape, terms)
    counts = np.bincount(shape)
    assert (counts > 1).sum() > 50  # shapes with several members
    assert np.allclose(low, high, rtol=1e-12, atol=0.0)


def test_pipeline_p2p_ignores_the_model_state_knobs(scored):
    """What lets one row's first give the p2p term of every row of its shape (same placement and sequence
    parallelism): the pipeline's point-to-point time does not depend on ZeRO, dp_shard or offload."""
    arrays, s, _ = scored
    g = _groups(arrays, SHAPE_FIELDS + ("placement", "sequence_parallel", "recompute"))
    for name in ("pp_p2p", "pp_p2p_bound"):  # the search reads the bound term (TIME_BOUND_TERMS)
        p2p = np.asarray(getattr(s, name), float)
        low, high = np.full(g.max() + 1, np.inf), np.full(g.max() + 1, -np.inf)
        np.minimum.at(low, g, p2p)
        np.maximum.at(high, g, p2p)
        assert np.allclose(low, high, rtol=1e-12, atol=0.0)


def test_sequence_parallelism_never_raises_memory_nor_falls_below_its_floor(scored):
    """Sequence parallelism on never needs more memory (what the twin shortcut reads), and with it
    off compute + tp_comm never fall below the floor its twin with it on reports
    (Scores.sp_off_floor: what lets the search skip scoring a shape's twin whose floor is not below
    the threshold, _BranchAndBound._admissible). Compute alone can be less with it off: the slowest
    stage's end (head, embedding) is apportioned over the terms by their shares. Its shape terms can
    be more or less than with it off (it shards the norms; Megatron's asynchronous backward shows
    the output gradient's all-gather where, without it, the input gradient's all-reduce hides under
    the weight gradient: cost_models.comm._async_backward): on A100s, GPT-3 175B's are less with it
    off for many rows, so the search bounds a shape holding both choices by the lesser."""
    arrays, s, _ = scored
    tp = arrays["tp"] > 1
    key = ("row", "placement", "recompute")
    on = {
        tuple(int(arrays[k][i]) for k in key): i
        for i in np.flatnonzero(tp & arrays["sequence_parallel"])
    }
    off = [
        (on[tuple(int(arrays[k][i]) for k in key)], i)
        for i in np.flatnonzero(tp & ~arrays["sequence_parallel"])
        if tuple(int(arrays[k][i]) for k in key) in on
    ]
    if not off:
        pytest.skip("no tp > 1 candidate with both choices in this sample")
    a, b = np.array(off).T
    needed = np.asarray(s.needed_bytes, float)
    assert np.all(needed[b] >= needed[a] * (1 - 1e-12))
    busy = np.asarray(s.compute, float) + np.asarray(s.tp_comm, float)
    floor = np.asarray(s.sp_off_floor, float)
    assert np.all(busy[b] >= floor[a] * (1 - 1e-12)) and (floor[a] > 0).all()
    terms = _terms(s, SHAPE_BOUND_TERMS)
    if s.step.sw.framework.name == "megatron" and s.step.hw.name == "p4d.24xlarge":
        assert (terms[b] < terms[a] * (1 - 1e-9)).mean() > 0.2


def test_a_shape_about_to_be_proven_out_takes_the_lesser_of_its_choices():
    """_admissible: a shape whose bound with sequence parallelism on is not below the threshold but
    that holds both choices is bounded by its twin with it off, scored only where the twin's floor
    (Scores.sp_off_floor) is below the threshold; the others keep their bound."""
    from planner.search.branch_and_bound import _BranchAndBound

    bb = _BranchAndBound.__new__(_BranchAndBound)
    # shapes: 0 kept as it is; 1 and 2 hold both choices, 1's twin is less, 2's more; 3 holds one
    # choice; 4 holds both, but its twin's floor is at the threshold already
    bb.shape_lb = np.array([5.0, 25.0, 25.0, 25.0, 30.0])
    bb.shape_floor_off = np.array([1.0, 10.0, 10.0, 10.0, 20.0])
    bb.twin_pending = np.array([False, True, True, False, True])
    twin = {1: 15.0, 2: 26.0}
    scored = []

    def twin_bounds(shapes):
        scored.extend(shapes.tolist())
        return np.array([twin[int(k)] for k in shapes])

    bb.cls = np.zeros(5, dtype=bool)
    bb._below = lambda bound, members: bound < 20.0  # the admission threshold
    bb._twin_bounds = twin_bounds
    assert bb._admissible(np.arange(5)).tolist() == [0, 1]
    assert sorted(scored) == [1, 2]
    assert bb.shape_lb.tolist() == [5.0, 15.0, 25.0, 25.0, 30.0]
    assert not bb.twin_pending.any()  # a twin is scored once


def test_the_expert_parallel_term_bounds_every_candidate_of_a_shape(scored):
    """EP_BOUND_TERM (the search adds it against each expert-parallel class's best step): no step is
    shorter than the bound with it; it is equal across the model-state knobs and the placement class;
    it never falls along recompute, nor does the bound with it; it is never less with sequence
    parallelism off. So a shape's representative (sp on, weakest level) has the least."""
    arrays, s, space = scored
    ep = np.broadcast_to(np.asarray(getattr(s, EP_BOUND_TERM), float), arrays["dp"].shape)
    bound = _terms(s, TIME_BOUND_TERMS) + ep
    assert np.all(np.asarray(s.step_time_s) >= bound * (1 - 1e-12))
    assert np.all(ep <= np.asarray(s.ep_comm, float) * (1 + 1e-12))
    assert (ep > 0).any() == bool((arrays["ep"] > 1).any())
    arrays = dict(arrays, place_class=_place_classes(arrays, space))
    shape = _groups(arrays, SHAPE_FIELDS + ("place_class", "sequence_parallel", "recompute"))
    low, high = np.full(shape.max() + 1, np.inf), np.full(shape.max() + 1, -np.inf)
    np.minimum.at(low, shape, ep)
    np.maximum.at(high, shape, ep)
    assert np.allclose(low, high, rtol=1e-12, atol=0.0)
    group = _groups(arrays, ("row", "placement", "sequence_parallel"))
    order = np.lexsort((arrays["recompute"], group))
    same = group[order][1:] == group[order][:-1]
    for values in (ep, bound):
        assert np.all(values[order][1:][same] >= values[order][:-1][same] * (1 - 1e-12))
    a, b = _sp_twins(arrays)
    assert np.all(ep[b] >= ep[a] * (1 - 1e-12))


def _place_classes(arrays, space):
    cls = np.zeros(len(arrays["dp"]), dtype=np.int64)
    for _, place, mask in _pattern_groups(arrays, space):
        for k, members in enumerate(
            placement_classes(place, exact=bool(np.any(arrays["ep"][mask] > 1)))
        ):
            cls[mask & np.isin(arrays["placement"], members)] = k
    return cls


def _sp_twins(arrays):
    """(on, off): indices of the candidates with sequence parallelism on and their twins with it off."""
    key = ("row", "placement", "recompute")
    tp = arrays["tp"] > 1
    on = {
        tuple(int(arrays[k][i]) for k in key): i
        for i in np.flatnonzero(tp & arrays["sequence_parallel"])
    }
    pairs = [
        (on[t], i)
        for i in np.flatnonzero(tp & ~arrays["sequence_parallel"])
        if (t := tuple(int(arrays[k][i]) for k in key)) in on
    ]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2).T


def test_placement_moves_no_memory_and_the_optimizer_step_is_the_skeletons(scored):
    """What the twin and the per-skeleton optimizer shortcuts read: memory is equal across placements, and the
    optimizer step is equal across micro-batches, placements, sequence parallelism and recompute."""
    from planner.candidates import SKELETON_FIELDS

    arrays, s, _ = scored
    needed = np.asarray(s.needed_bytes, float)
    for key, values in (
        (("row", "sequence_parallel", "recompute"), needed),
        (SKELETON_FIELDS, np.asarray(s.optimizer, float)),
    ):
        g = _groups(arrays, key)
        low, high = np.full(g.max() + 1, np.inf), np.full(g.max() + 1, -np.inf)
        np.minimum.at(low, g, values)
        np.maximum.at(high, g, values)
        assert np.allclose(low, high, rtol=1e-12, atol=0.0), key


EXACT = [  # small enough to score every candidate
    ("llama3-8b", 16384, "p5.48xlarge", 32, 32, "megatron", "amp-bf16"),
    ("gpt2-medium", 1024, "p4d.24xlarge", 16, 64, "torchtitan", "amp-bf16"),
    ("llama3-8b", 8192, "p6e-gb200.36xlarge", 16, 32, "deepspeed", "amp-bf16"),
]


@pytest.mark.parametrize("name,seq,hw_name,gpus,batch,framework,precision", EXACT)
@pytest.mark.parametrize("objective", ["throughput", "memory"])
def test_bounded_search_equals_scoring_everything(
    name, seq, hw_name, gpus, batch, framework, precision, objective
):
    """The leaders, and the best plan of each cp class, are the same whether every candidate is scored or the
    bounds prove most of them out."""
    model, hw, sw = resolve_model(name, seq=seq), load_profile(hw_name), software_for(framework)
    space = SearchSpace().for_framework(load_framework(framework))
    work = Workload(
        world_size=gpus, global_batch=batch, seq=seq, precision=precision, optimizer="adamw"
    )
    kw = dict(space=space, software=sw)
    fast = score_space(model, hw, work, admission=Admission(objective=objective, keep=9), **kw)
    every = score_space(
        model,
        hw,
        work,
        admission=Admission(objective=objective, prune=False, time_bound=False),
        **kw,
    )
    assert (
        fast.stats.pruned_by_time_bound > 0 and fast.stats.space == every.stats.candidates_evaluated
    )
    assert fast.stats.candidates_evaluated < every.stats.candidates_evaluated / 3
    a, b = rank(fast, objective)[:9], rank(every, objective)[:9]
    assert fast.step_time_s[a].tolist() == every.step_time_s[b].tolist()
    assert fast.peak_bytes_per_gpu[a].tolist() == every.peak_bytes_per_gpu[b].tolist()
    for c in (False, True):

        def best(scored):
            ok = scored.fits & ((scored.arrays["cp"] > 1) == c)
            return scored.step_time_s[ok].min() if ok.any() else None

        assert best(fast) == best(every)


def test_exactness_fails_when_a_premise_is_broken(monkeypatch):
    """A bound that overstates (the shape terms doubled) proves out the true leaders: the comparison above
    would catch it."""
    import planner.search.bounds as bounds  # _Scores.shape_bound reads it there

    name, seq, hw_name, gpus, batch, framework, precision = EXACT[0]
    model, hw, sw = resolve_model(name, seq=seq), load_profile(hw_name), software_for(framework)
    work = Workload(
        world_size=gpus, global_batch=batch, seq=seq, precision=precision, optimizer="adamw"
    )
    kw = dict(space=SearchSpace().for_framework(sw.framework), software=sw)
    every = score_space(model, hw, work, admission=Admission(prune=False, time_bound=False), **kw)
    monkeypatch.setattr(bounds, "SHAPE_BOUND_TERMS", ("compute",) + bounds.SHAPE_BOUND_TERMS)
    wrong = score_space(model, hw, work, admission=Admission(keep=9), **kw)
    assert (
        wrong.step_time_s[rank(wrong, "throughput")[:9]].tolist()
        != every.step_time_s[rank(every, "throughput")[:9]].tolist()
    )


def _fastest_of_each_ep_class(scored, hw):
    order = rank(scored, "throughput")
    keys = ep_classes({k: np.asarray(v)[order] for k, v in scored.arrays.items()}, hw)
    firsts = np.unique(keys, return_index=True)[1]
    return {
        int(keys[j]): (
            float(scored.step_time_s[order[j]]),
            tuple(int(scored.arrays[k][order[j]]) for k in FIELDS),
        )
        for j in firsts
    }


def test_the_expert_parallel_bound_keeps_each_classes_fastest(monkeypatch):
    """With EP_BOUND_TERM the search scores fewer candidates, yet each expert-parallel class's fastest
    scored plan (what planner.search.documents._ep_versus lists), the leaders and the thresholds are
    those of the search without it."""
    import planner.search.bounds as bounds  # _Scorer reads _READ_TERMS there

    model, hw = resolve_model("mixtral-8x7b", seq=8192), load_profile("p5.48xlarge")
    work = Workload(world_size=64, global_batch=128, seq=8192, precision="amp-bf16")
    kw = dict(space=SearchSpace(), software=software_for("megatron"))
    fast = score_space(model, hw, work, **kw)
    monkeypatch.setattr(bounds, "_READ_TERMS", TIME_BOUND_TERMS)
    plain = score_space(model, hw, work, **kw)
    assert fast.stats.candidates_evaluated < plain.stats.candidates_evaluated * 0.9
    domain = hw.nvlink_domain_devices
    assert len(_fastest_of_each_ep_class(fast, domain)) >= 5
    assert _fastest_of_each_ep_class(fast, domain) == _fastest_of_each_ep_class(plain, domain)
    assert fast.unscored_at_least_s == plain.unscored_at_least_s
    a, b = rank(fast, "throughput")[:10], rank(plain, "throughput")[:10]
    assert fast.step_time_s[a].tolist() == plain.step_time_s[b].tolist()


def test_premise_checks_catch_a_term_that_depends_on_the_state():
    """The shape-terms check fails for a term that does depend on the model-state knobs (dp_comm)."""
    arrays, s, space = _members(*SCENARIOS[1])
    shape = _groups(arrays, SHAPE_FIELDS + ("placement", "sequence_parallel", "recompute"))
    terms = _terms(s, SHAPE_BOUND_TERMS + ("dp_comm",))
    low, high = np.full(shape.max() + 1, np.inf), np.full(shape.max() + 1, -np.inf)
    np.minimum.at(low, shape, terms)
    np.maximum.at(high, shape, terms)
    assert not np.allclose(low, high, rtol=1e-12, atol=0.0)


def test_scenarios_exercise_the_new_dimensions():
    arrays, _, _ = _members(*SCENARIOS[4], shapes=2000)
    assert (arrays["cp"] > 1).any() and (arrays["dp_shard"] > 0).any() and (arrays["ep"] > 1).any()
    assert len(set(itertools.chain(arrays["cp_comm"].tolist()))) == 3
