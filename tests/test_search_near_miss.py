"""Plans whose even pipeline split misses the memory are re-split under a memory cap
(planner.search.near_miss): the search picks one that then fits, and adds nothing when no split can.

The case: Llama 3 8B (32 blocks) at 32k tokens on 8 H100s, 1F1B without recomputation, ZeRO-0,
tp <= 2. Stage 0 holds pp micro-batches of activations under 1F1B (Narayanan et al. 2021 Sec. 2.2),
so at the even split rank 0 is over the memory while the later ranks have room; no plan of the space
fits at its even split. Expected values come from estimate() of the plans themselves and from the
model's block count, not from the search."""

from dataclasses import replace

import numpy as np
import pytest

from planner.candidates import SearchSpace
from planner.commands.plan_table import table_lines
from planner.commands.recommend import summary_lines
from planner.errors import NoFitError
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.partition import even_split
from planner.search import SearchRequest, prepare, recommend, score_space, unranked_error
from planner.search.near_miss import resplit
from planner.search.refine import Refiner, stage_problem
from planner.search.results import NearMisses
from planner.sources import resolve_model

SPACE = SearchSpace(
    schedules=("1f1b",),
    zero=(0,),
    recompute=("none",),
    offload=("none",),
    placements=("DPT",),
    max_cp=1,
    dp_shard=0,
    ep=(1,),
    sequence_parallel=(True,),
    max_tp=2,
)
BLOCKS = 32
"""Llama 3 8B's transformer blocks (Meta's config.json: num_hidden_layers 32)."""


def _search(seq):
    return recommend("llama3-8b", "dgx-h100", gpus=8, global_batch=8, seq=seq, space=SPACE, top=3)


def test_an_uneven_split_fits_where_no_even_split_does_and_is_picked():
    rec = _search(32768)
    assert rec.stats.feasible == 0  # no plan of the space fits at its even split
    assert rec.stats.near_misses_resplit >= rec.stats.near_misses_fit >= 1
    plan = rec.best["plan"]
    stages = tuple(plan["stages"])
    assert sum(stages) == BLOCKS and len(stages) == plan["pp"] * plan["virtual_stages"]
    assert stages != even_split(BLOCKS, len(stages))
    model = resolve_model("llama3-8b", seq=32768)
    cfg = ParallelConfig(
        **{k: v for k, v in plan.items() if k not in ("stages", "num_microbatches")}
    )
    even = estimate(model, "dgx-h100", cfg, gpus=8)
    uneven = estimate(model, "dgx-h100", replace(cfg, stages=stages), gpus=8)
    assert not even.fits and uneven.fits
    # the blocks left rank 0, the rank 1F1B makes binding
    assert stages[0] < even_split(BLOCKS, len(stages))[0]
    assert rec.best["prediction"]["memory"]["fits"]
    assert rec.to_document()["search"]["near_misses_fit"] == rec.stats.near_misses_fit
    # the CLI shows the split (the wide table's stages column) and what the re-splitting did
    assert any("uneven" in line for line in table_lines([rec.best], wide=True, width=None))
    line = f"re-split {rec.stats.near_misses_resplit} plan(s) over memory at even stages: "
    lines = summary_lines(rec, price_per_hour=None, spot=False)
    assert line + f"{rec.stats.near_misses_fit} fit with uneven stages" in lines


def test_no_split_fits_adds_nothing_and_the_no_fit_error_says_so():
    with pytest.raises(NoFitError) as err:
        _search(131072)
    message = str(err.value)
    assert message.startswith("no plan fits") and "\n" not in message


def test_the_no_fit_error_names_the_uneven_split_that_still_missed():
    """A re-split that estimate() still finds over the memory is cited on the no-fit line."""
    request = SearchRequest(gpus=8, global_batch=8, seq=49152, space=SPACE)
    setup = prepare("llama3-8b", "dgx-h100", request)
    scored = score_space(setup.model, setup.hardware, setup.workload, space=setup.space)
    cfg = ParallelConfig(dp=1, tp=2, pp=4, micro_batch=1, global_batch=8, seq=49152, zero=0)
    missed = estimate(setup.model, setup.hardware, replace(cfg, stages=(5, 7, 9, 11)), gpus=8)
    assert not missed.fits
    near = NearMisses(resplit=1, closest=missed.to_document())
    message = str(unranked_error(scored, setup, near))
    assert "\n" not in message and message.startswith("no plan fits")
    assert "an uneven stage split of 1 near-miss plan still missed" in message
    assert "stages=[5, 7, 9, 11]" in message
    assert f"{missed.needed_bytes / 2**30:.1f} GiB" in message
    assert "uneven" not in str(unranked_error(scored, setup))


def test_the_no_fit_error_says_when_no_split_fits_under_the_cap():
    """Re-split plans for which no contiguous split fits under the cap (resplit's ConfigError
    branch: nothing to cite) get their own clause, with the count of plans tried."""
    request = SearchRequest(gpus=8, global_batch=8, seq=49152, space=SPACE)
    setup = prepare("llama3-8b", "dgx-h100", request)
    scored = score_space(setup.model, setup.hardware, setup.workload, space=setup.space)
    message = str(unranked_error(scored, setup, NearMisses(resplit=2, closest=None)))
    assert "\n" not in message and message.startswith("no plan fits")
    assert "no uneven stage split of 2 near-miss plans fits under the cap; " in message
    assert "still missed" not in message


def test_a_cap_no_split_can_meet_is_no_document_and_nothing_to_cite():
    """resplit under a cap below what any contiguous split needs: no document, no closest miss."""
    request = SearchRequest(gpus=8, global_batch=8, seq=49152, space=SPACE)
    setup = prepare("llama3-8b", "dgx-h100", request)
    cfg = ParallelConfig(dp=1, tp=2, pp=4, micro_batch=1, global_batch=8, seq=49152, zero=0)
    problem = stage_problem(setup.model, cfg, setup.software)
    refiner = Refiner(setup, capacity=float(setup.hardware.memory_bytes))
    peaks = np.zeros(cfg.pp)
    # a cap of one byte per rank: even one block per stage is over it
    assert resplit(refiner, cfg, problem, (peaks, 1.0)) == (None, None)
