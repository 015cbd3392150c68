"""Overlaps the user leaves unset that the stack runs but leaves off by default (issue 32, item 2):
recommend chooses them per plan -- on where the plan can run them unless it then misses the memory
-- records the choice in the plan's software block (so the export carries it) and says which it
turned on; an explicit choice is kept; estimate keeps the framework's default."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from frameworks.rules import a2a_overlap_conflict, a2a_overlap_runs
from hardware_profiles import load_profile
from planner.candidates import SearchSpace
from planner.cli import app
from planner.estimate import estimate
from planner.explain import _software_options
from planner.exports import export_plan
from planner.parallel import ParallelConfig
from planner.plan import plan_from_document, run_options
from planner.run_options import RunOptions
from planner.score import score
from planner.search import recommend
from planner.search.overlaps import FreeOverlapScorer
from planner.search.refine import Refiner
from planner.search.request import SearchRequest, prepare
from planner.search.results import ScoredSpace, SearchStats
from planner.software import free_overlaps, plan_options, software_for
from planner.sources import resolve_model

runner = CliRunner()
MODEL, HW, GPUS = "llama3-70b", "dgx-h100", 32
SPACE = SearchSpace(cp=(1,), dp_shard=0, max_pp=2)
HIDDEN, SEQ = 8192, 8192  # Llama 3 70B (its config.json: hidden_size 8192, max context 8192)


def _recommend(**fields):
    return recommend(MODEL, HW, **({"gpus": GPUS, "space": SPACE, "top": 3, "refine": 0} | fields))


@pytest.fixture(scope="module")
def free():
    return _recommend()


def test_a_free_overlap_is_turned_on_recorded_and_exported(free):
    best = free.best
    plan = best["plan"]
    assert plan["tp"] > 1 and plan["sequence_parallel"]
    assert best["software"]["tp_comm_overlap"] is True
    assert best["search"]["overlaps"] == {
        "free": ["tp_comm_overlap"],
        "turned_on": ["tp_comm_overlap"],
    }
    assert free.to_document()["search"]["overlaps"]["turned_on"] == ["tp_comm_overlap"]
    args = export_plan(plan_from_document(best), "megatron").text
    assert "--tp-comm-overlap" in args
    for doc in free.alternatives:  # per plan: on where tp > 1 with sequence parallelism
        p = doc["plan"]
        assert doc["software"]["tp_comm_overlap"] is (p["tp"] > 1 and p["sequence_parallel"])


def test_the_plan_is_what_estimate_predicts_with_its_software(free):
    best = free.best
    cfg = plan_from_document(best).config
    options = run_options(best)
    assert options.tp_comm_overlap is True
    again = estimate(MODEL, HW, cfg, gpus=GPUS, options=options)
    assert again.step_time_s == pytest.approx(best["prediction"]["step_time_s"], rel=1e-12)
    default = estimate(MODEL, HW, cfg, gpus=GPUS)  # estimate keeps megatron's default (off)
    assert default.to_document()["software"]["tp_comm_overlap"] is False
    assert default.step_time_s > again.step_time_s


def test_explains_fresh_search_chooses_again(free):
    assert _software_options(free.best).tp_comm_overlap is None
    asked = {k: v for k, v in free.best.items() if k != "search"}  # a plan the user named
    assert _software_options(asked).tp_comm_overlap is True


def test_an_explicit_choice_is_respected():
    off = _recommend(options=RunOptions(tp_comm_overlap=False))
    assert off.best["software"]["tp_comm_overlap"] is False
    assert _software_options(off.best).tp_comm_overlap is False
    assert "overlaps" not in off.best["search"]
    assert "--tp-comm-overlap" not in export_plan(plan_from_document(off.best), "megatron").text


def test_the_choice_is_per_plan_no_overlap_without_sequence_parallelism():
    # Megatron-LM asserts --sequence-parallel with --tp-comm-overlap (arguments.py validate_args)
    rec = _recommend(space=replace(SPACE, sequence_parallel=(False,)))
    assert not rec.best["plan"]["sequence_parallel"]
    for doc in (rec.best, *rec.alternatives):
        assert doc["software"]["tp_comm_overlap"] is False
    assert rec.best["search"]["overlaps"] == {"free": ["tp_comm_overlap"], "turned_on": []}


def test_the_cli_says_which_it_turned_on_and_keeps_an_explicit_no():
    base = [
        "recommend", MODEL, "--hardware", HW, "--gpus", str(GPUS), "--cp", "1", "--dp-shard", "0",
        "--top", "1",
    ]  # fmt: skip
    res = runner.invoke(app, base)
    assert res.exit_code == 0, res.output
    line = "overlaps unset, off by megatron's default: turned on tp_comm_overlap"
    assert line in res.output
    res = runner.invoke(app, [*base, "--no-tp-comm-overlap"])
    assert res.exit_code == 0, res.output
    assert "overlaps unset" not in res.output
    res = runner.invoke(app, [*base, "--no-tp-comm-overlap", "--json"])
    assert "overlaps" not in json.loads(res.stdout)["search"]


def test_only_unset_overlaps_the_stack_runs_are_free():
    assert free_overlaps(software_for("megatron"), RunOptions(), precision="amp-bf16") == (
        "tp_comm_overlap",
    )
    for options in (RunOptions(tp_comm_overlap=True), RunOptions(tp_comm_overlap=False)):
        assert free_overlaps(software_for("megatron", options), options, precision="amp-bf16") == ()
    assert (
        free_overlaps(software_for("deepspeed"), RunOptions(), precision="amp-bf16") == ()
    )  # no overlap option
    # torchtitan's async TP needs torch.compile ('Async TP requires torch.compile')
    assert free_overlaps(software_for("torchtitan"), RunOptions(), precision="amp-bf16") == ()
    compiled = RunOptions(compile=True)
    assert free_overlaps(software_for("torchtitan", compiled), compiled, precision="amp-bf16") == (
        "tp_comm_overlap",
    )


CFG = ParallelConfig(
    dp=2, tp=8, pp=2, micro_batch=1, global_batch=64, seq=SEQ, sequence_parallel=True, zero=1
)


def test_the_userbuffers_are_transformer_engines_shape():
    # Megatron-LM initialize_ub(shape=[seq x micro_batch / cp, hidden]); TE's initialize_ub: 10
    # buffers of that shape, 4 in bf16 and 6 in FP8 under an FP8 recipe (bf16 otherwise)
    off = estimate(MODEL, HW, CFG, gpus=GPUS)
    on = estimate(MODEL, HW, CFG, gpus=GPUS, options=RunOptions(tp_comm_overlap=True))
    assert on.peak_bytes_per_gpu - off.peak_bytes_per_gpu == SEQ * 1 * HIDDEN * (4 * 2 + 6 * 2)
    fp8 = replace(CFG, precision="fp8")
    off8 = estimate(MODEL, HW, fp8, gpus=GPUS)
    on8 = estimate(MODEL, HW, fp8, gpus=GPUS, options=RunOptions(tp_comm_overlap=True))
    assert on8.peak_bytes_per_gpu - off8.peak_bytes_per_gpu == SEQ * HIDDEN * (4 * 2 + 6 * 1)
    no_sp = replace(CFG, sequence_parallel=False)
    plain = estimate(MODEL, HW, no_sp, gpus=GPUS)
    asked = estimate(MODEL, HW, no_sp, gpus=GPUS, options=RunOptions(tp_comm_overlap=True))
    assert (asked.step_time_s, asked.peak_bytes_per_gpu) == (
        plain.step_time_s,
        plain.peak_bytes_per_gpu,
    )


def _capacity_between(cfg):
    """A device just too small for cfg with the overlap's buffers, large enough without them."""
    off = estimate(MODEL, HW, cfg, gpus=GPUS).to_document()["prediction"]["memory"]
    on = estimate(MODEL, HW, cfg, gpus=GPUS, options=RunOptions(tp_comm_overlap=True))
    on = on.to_document()["prediction"]["memory"]
    assert off["needed_bytes"] < on["needed_bytes"]
    return replace(load_profile(HW), memory_bytes=(off["needed_bytes"] + on["needed_bytes"]) // 2)


def test_a_plan_the_buffers_push_out_of_memory_keeps_it_off():
    hw = _capacity_between(CFG)
    setup = prepare(MODEL, hw, SearchRequest(gpus=GPUS, space=SPACE))
    doc = Refiner(setup, float(hw.memory_bytes))._estimate(CFG)
    assert doc["prediction"]["memory"]["fits"]
    assert doc["software"]["tp_comm_overlap"] is False
    roomy = prepare(MODEL, HW, SearchRequest(gpus=GPUS, space=SPACE))
    assert Refiner(roomy, 1e15)._estimate(CFG)["software"]["tp_comm_overlap"] is True


def test_the_search_scores_each_candidate_with_its_choice():
    hw = _capacity_between(CFG)
    off_sw = software_for("megatron")
    on_sw = software_for("megatron", RunOptions(tp_comm_overlap=True))
    cands = {
        "dp": np.array([2, 2]), "tp": np.array([8, 8]), "pp": np.array([2, 2]),
        "micro_batch": np.array([1, 1]), "virtual_stages": np.array([1, 1]),
        "zero": np.array([1, 1]), "recompute": np.array([0, 2]), "offload": np.array([0, 0]),
        "sequence_parallel": np.array([True, True]), "schedule": np.array([1, 1]),
        "placement": np.array([0, 0]),
    }  # fmt: skip
    kw = dict(global_batch=64, seq=SEQ, precision="amp-bf16")
    model = resolve_model(MODEL, seq=SEQ)
    scorer = FreeOverlapScorer(None, on_sw, off_sw)
    merged = scorer(model, hw, cands, **kw)
    on = score(model, hw, cands, software=on_sw, **kw)
    off = score(model, hw, cands, software=off_sw, **kw)
    # row 0 (no recompute) misses the memory with the buffers, fits without; row 1 (full
    # recompute) fits with them
    assert not on.fits[0] and off.fits[0] and on.fits[1]
    assert merged.needed_bytes[0] == pytest.approx(off.needed_bytes[0], rel=1e-12)
    assert np.isinf(merged.step_time_s[0])  # left to `settle`: never a feasible step for the bounds
    assert merged.step_time_s[1] == on.step_time_s[1] < off.step_time_s[1]
    assert merged.compute[0] == on.compute[0]  # the bound terms stay the optimistic ones
    space = ScoredSpace(
        arrays=cands,
        step_time_s=merged.step_time_s,
        peak_bytes_per_gpu=merged.peak_bytes_per_gpu,
        needed_bytes=merged.needed_bytes,
        capacity_bytes=float(hw.memory_bytes),
        leanest_arrays={},
        leanest_needed_bytes=np.zeros(0),
        stats=SearchStats(candidates_evaluated=2, feasible=2, seconds=0.0),
    )
    done = scorer.settle(space, model, hw, kw)
    assert done.step_time_s[0] == off.step_time_s[0] and done.step_time_s[1] == on.step_time_s[1]
    assert done.peak_bytes_per_gpu[0] == off.peak_bytes_per_gpu[0]


# moe_a2a_overlap (Megatron-Core's --overlap-moe-expert-parallel-comm): free on megatron, on per
# plan where TransformerConfig.__post_init__ lets it run (expert_model_parallel_size > 1; virtual
# pipeline stages when pipeline_model_parallel_size > 1; no full recompute; bf16 or fp16)
MOE, MOE_SPACE = "mixtral-8x7b", SearchSpace(cp=(1,), dp_shard=0, max_pp=4)


def _moe_recommend(**fields):
    kw = {"gpus": GPUS, "space": MOE_SPACE, "top": 5, "refine": 0}
    return recommend(MOE, HW, **(kw | fields))


@pytest.fixture(scope="module")
def moe_free():
    return _moe_recommend()


def test_the_a2a_rule_over_arrays_agrees_with_the_rule():
    combos = itertools.product(
        (1, 2, 8),
        (1, 2, 4),
        (1, 2),
        ("none", "selective", "full"),
        ("fp32", "amp-bf16", "bf16", "fp8"),
        ((), ("moe",), ("core_attn", "moe_act")),
        (0, 1, 2),
    )
    for ep, pp, v, rec, prec, modules, mtp in combos:
        kw = {"precision": prec, "recompute_modules": modules, "mtp_modules": mtp}
        whole = (
            ep > 1 and a2a_overlap_conflict(pp=pp, virtual_stages=v, recompute=rec, **kw) is None
        )
        runs = a2a_overlap_runs(
            ep=np.array([ep]), pp=np.array([pp]), virtual_stages=np.array([v]),
            full_recompute=np.array([rec == "full"]), **kw,
        )  # fmt: skip
        assert bool(runs[0]) == whole, (ep, pp, v, rec, prec, modules, mtp)


def _cfg(**kw):
    base = {"tp": 1, "sequence_parallel": False, "ep": 8, "pp": 1, "virtual_stages": 1}
    return SimpleNamespace(**(base | {"recompute": "none", "precision": "amp-bf16"} | kw))


def test_the_a2a_choice_follows_megatrons_asserts():
    model, free = resolve_model(MOE), ("moe_a2a_overlap",)
    on = lambda **kw: plan_options(RunOptions(), free, _cfg(**kw), model).moe_a2a_overlap  # noqa: E731
    assert on() is True
    assert on(pp=2, virtual_stages=2) is True
    assert on(pp=2) is None  # 'virtual_pipeline_model_parallel_size must be specified'
    assert on(recompute="full") is None  # 'disable full recomputation'
    assert on(ep=1) is None  # 'only supported with expert model parallelism'
    assert on(precision="fp32") is None  # 'only supported with bf16 or fp16 model'
    assert plan_options(RunOptions(), free, _cfg(), resolve_model(MODEL)) == RunOptions()


def test_recommend_turns_the_a2a_overlap_on_per_plan_and_exports_it(moe_free):
    best = moe_free.best
    assert "moe_a2a_overlap" in best["search"]["overlaps"]["turned_on"]
    for doc in [best, *moe_free.alternatives]:
        p = doc["plan"]
        runs = p["ep"] > 1 and (p["pp"] == 1 or p["virtual_stages"] > 1)
        assert doc["software"]["moe_a2a_overlap"] is (runs and p["recompute"] != "full")
    args = export_plan(plan_from_document(best), "megatron").text
    assert "--overlap-moe-expert-parallel-comm" in args


def test_the_moe_plan_is_what_estimate_predicts_with_its_software(moe_free):
    for doc in [moe_free.best, *moe_free.alternatives]:
        cfg = plan_from_document(doc).config
        est = estimate(MOE, HW, cfg, gpus=GPUS, options=run_options(doc))
        assert est.to_document()["software"]["moe_a2a_overlap"] is True
        assert est.step_time_s == pytest.approx(doc["prediction"]["step_time_s"], rel=1e-12)
        default = estimate(MOE, HW, cfg, gpus=GPUS)  # megatron's default: off, and slower
        assert default.step_time_s > est.step_time_s


def test_an_explicit_no_a2a_overlap_is_respected():
    off = _moe_recommend(options=RunOptions(moe_a2a_overlap=False))
    assert "moe_a2a_overlap" not in (off.best["search"].get("overlaps") or {}).get("free", [])
    for doc in [off.best, *off.alternatives]:
        assert doc["software"]["moe_a2a_overlap"] is False


def test_the_search_costs_the_a2a_overlap_only_where_it_runs():
    """The search scores every candidate with moe_a2a_overlap on (planner.search.overlaps); the
    cost term hides the exchange only on the rows Megatron-Core runs it on (Step.a2a_overlap):
    elsewhere the score equals the one without the option, and where it runs it is lower."""
    from planner.estimate import candidate_of

    model, hw = resolve_model(MOE, seq=4096), load_profile(HW)
    on, off = (software_for("megatron", RunOptions(moe_a2a_overlap=flag)) for flag in (True, False))
    plans = [
        (dict(ep=8, pp=1), True),
        (dict(ep=8, pp=2, schedule="interleaved-1f1b", virtual_stages=2), True),
        (dict(ep=8, pp=2), False),  # virtual stages needed at pp > 1
        (dict(ep=8, pp=1, recompute="full"), False),
        (dict(ep=1, pp=1), False),
    ]
    for kw, runs in plans:
        place = "DPET" if kw["ep"] > 1 else "DPT"
        cfg = ParallelConfig(
            dp=GPUS // kw["pp"], global_batch=256, seq=4096, zero=1, placement=place, **kw
        )
        step = {
            sw.moe_a2a_overlap: float(
                score(model, hw, candidate_of(cfg, model.total_blocks), global_batch=256,
                      seq=4096, software=sw).step_time_s[0]
            )
            for sw in (on, off)
        }  # fmt: skip
        assert (step[True] < step[False]) if runs else (step[True] == step[False]), kw
