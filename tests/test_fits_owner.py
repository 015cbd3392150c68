"""The four "fits" are one (cost_models.memory.fits): over the README scenario's scored candidates, the
search, estimate, the plan file, explain and the report agree on every candidate sampled, the ones
near the capacity (where a second definition would disagree) included."""

from __future__ import annotations

import numpy as np
import pytest

from hardware_profiles import load_profile
from planner.catalog import get
from planner.estimate import estimate
from planner.explain import explain_document
from planner.plan import plan_from_document
from planner.run_options import RunOptions
from planner.search import config_of, recommend


@pytest.fixture(scope="module")
def readme_search():
    rec = recommend("gpt3-175b", "p4d.24xlarge", gpus=960, global_batch=1536, top=3)
    assert rec.stats.free_overlaps == ("tp_comm_overlap",)  # _as_searched's premise
    return rec


def _sample(scored, n=60):
    """Candidates spread over the space plus those whose need is within 5% of the capacity."""
    rng = np.random.default_rng(0)
    ratio = scored.needed_bytes / scored.capacity_bytes
    edge = np.flatnonzero(np.abs(ratio - 1.0) < 0.05)
    return np.unique(
        np.concatenate(
            [
                rng.choice(len(ratio), n, replace=False),
                rng.choice(edge, min(n, len(edge)), replace=False),
            ]
        )
    )


def _as_searched(model, hw, cfg):
    """The estimate of a row as the search scored it: tp_comm_overlap is the search's choice here
    (left unset, off by megatron's default; planner.search.overlaps): on where the plan runs it
    (tp > 1 with sequence parallelism), off where only then it fits."""
    est = estimate(model, hw, cfg, gpus=960)
    if not (cfg.tp > 1 and cfg.sequence_parallel):
        return est
    on = estimate(model, hw, cfg, gpus=960, options=RunOptions(tp_comm_overlap=True))
    return est if est.fits and not on.fits else on


def test_search_estimate_plan_file_and_explain_agree(readme_search):
    scored = readme_search.scored
    model, hw = get("gpt3-175b"), load_profile("p4d.24xlarge")
    picks = _sample(scored)
    assert scored.fits[picks].any() and (~scored.fits[picks]).any()
    near = np.abs(scored.needed_bytes[picks] / scored.capacity_bytes - 1.0) < 0.05
    assert (
        scored.peak_bytes_per_gpu[picks][near] <= scored.capacity_bytes
    ).any()  # raw peak would say "fits" here
    for i in picks:
        cfg = config_of(
            scored.arrays,
            int(i),
            global_batch=1536,
            seq=2048,
            precision="amp-bf16",
            optimizer="adamw",
        )
        est = _as_searched(model, hw, cfg)
        assert est.fits == bool(scored.fits[i])
        assert est.peak_bytes_per_gpu == pytest.approx(scored.peak_bytes_per_gpu[i], rel=1e-9)
        doc = est.to_document()
        assert plan_from_document(doc).prediction.memory.fits == est.fits
        line = explain_document(doc).memory_lines[-1]
        assert ("does NOT fit" not in line) == est.fits, line


def test_report_uses_the_same_verdict(readme_search):
    from planner.report import backend
    from planner.report.build import Scenario

    result = backend.search(
        get("gpt3-175b"),
        load_profile("p4d.24xlarge"),
        Scenario(model="gpt3-175b", hardware="p4d.24xlarge", gpus=960, global_batch=1536),
        top=1,
    )
    # the report's cloud counts as fitting exactly what the cost model says fits (its rows are scored candidates)
    scored = readme_search.scored
    assert result.fits.sum() >= scored.fits.sum() > 0
    assert (
        result.best["prediction"]["memory"]["fits"]
        and readme_search.best["prediction"]["memory"]["fits"]
    )
    from cost_models.memory import fits
    from planner.software import software_for

    hw = load_profile("p4d.24xlarge")
    assert np.array_equal(result.fits, fits(result.peak_bytes, hw, software_for("megatron")))
    assert (
        result.fits != (result.peak_bytes <= hw.memory_bytes)
    ).any()  # a raw-peak "fits" would differ


@pytest.mark.parametrize("pp,v,tp,ep", [(7, 7, 2, 8), (4, 1, 1, 8), (8, 2, 2, 4), (3, 1, 4, 8)])
def test_the_search_scores_a_mixture_of_experts_peak_as_estimate_does(pp, v, tp, ep):
    """The search scores candidates without per-rank block lists; estimate evaluates every rank. For a
    mixture-of-experts model the first rank holds the dense blocks, so the peak can be on the second rank:
    both must find the same peak (DeepSeek-V3 on GB200 once ranked plans that estimate said did not fit)."""
    from dataclasses import replace

    from hardware_profiles import load_profile
    from planner.estimate import candidate_of
    from planner.software import software_for
    from planner.parallel import ParallelConfig
    from planner.score import score
    from planner.sources import resolve_model

    spec, hw = resolve_model("deepseek-v3"), load_profile("p6e-gb200.36xlarge")
    dp = 2016 // (pp * tp)
    cfg = ParallelConfig(
        dp=dp,
        tp=tp,
        pp=pp,
        ep=ep,
        micro_batch=1,
        virtual_stages=v,
        schedule="interleaved-1f1b" if v > 1 else "1f1b",
        zero=1,
        sequence_parallel=tp > 1,
        placement="PDET",
        global_batch=dp * 8,
        seq=4096,
        precision="amp-bf16",
        framework="megatron",
    )
    every_rank = candidate_of(cfg, spec.total_blocks)
    searched = replace(
        every_rank, blocks_first=None, blocks_last=None, blocks_max=None, rank_blocks=None
    )
    kw = dict(
        global_batch=cfg.global_batch,
        seq=cfg.seq,
        precision=cfg.precision,
        optimizer="adamw",
        software=software_for("megatron"),
    )
    exact = score(spec, hw, every_rank, **kw).peak_bytes_per_gpu
    assert score(spec, hw, searched, **kw).peak_bytes_per_gpu == pytest.approx(exact, rel=1e-9)
