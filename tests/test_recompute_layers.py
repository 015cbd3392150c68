"""Full recomputation of only some blocks per pipeline chunk (ParallelConfig.recompute_layers: Megatron-Core's
--recompute-method block --recompute-num-layers): validation, cost, framework capability, exports, the search's
refinement, the executor and the published run that uses it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from frameworks import load_framework
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.parallel import ParallelConfig

LAYERS = 32  # llama3-8b


def _cfg(**kw):
    base = dict(dp=8, micro_batch=1, global_batch=64, zero=1, seq=8192, recompute="full")
    return ParallelConfig(**{**base, **kw})


def _est(**kw):
    return estimate("llama3-8b", "p5.48xlarge", _cfg(**kw), gpus=8)


def test_validation_names_the_field_and_what_is_allowed():
    with pytest.raises(ConfigError, match="recompute_layers=4 with recompute=selective"):
        _cfg(recompute="selective", recompute_layers=4)
    with pytest.raises(ConfigError, match="recompute_layers"):
        _cfg(recompute_layers=0)
    with pytest.raises(
        ConfigError, match="at most 32, the blocks of the largest pipeline chunk"
    ) as err:
        _est(recompute_layers=33)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="at most 8"):  # 32 blocks over pp 2 x v 2 chunks
        estimate(
            "llama3-8b",
            "p5.48xlarge",
            _cfg(
                dp=2,
                tp=2,
                pp=2,
                virtual_stages=2,
                schedule="interleaved-1f1b",
                global_batch=16,
                recompute_layers=9,
            ),
            gpus=8,
        )


def test_every_block_is_the_same_plan_as_none_and_the_saved_bytes_interpolate():
    """recompute_layers = the chunk's blocks costs exactly what full recomputation of every block does; fewer
    recomputed blocks keep, block for block, what no recomputation keeps: saved(N) = N/L saved(full) +
    (L-N)/L saved(none), and the recomputation's time scales by N/L."""
    full, none = _est(), _est(recompute="none")
    every = _est(recompute_layers=LAYERS)
    assert (
        every.step_time_s == full.step_time_s
        and every.peak_bytes_per_gpu == full.peak_bytes_per_gpu
    )
    saved = lambda e: float(e.scores.saved_activations_bytes[0])  # noqa: E731
    rec = lambda e: float(e.scores.compute[0])  # noqa: E731
    for n in (1, 5, 16, 31):
        part = _est(recompute_layers=n)
        assert saved(part) == pytest.approx(
            n / LAYERS * saved(full) + (LAYERS - n) / LAYERS * saved(none), rel=1e-9
        )
        assert rec(part) == pytest.approx(
            rec(none) + n / LAYERS * (rec(full) - rec(none)), rel=1e-6
        )
        assert none.step_time_s < part.step_time_s < full.step_time_s
    times = [_est(recompute_layers=n).step_time_s for n in range(1, LAYERS + 1)]
    peaks = [_est(recompute_layers=n).peak_bytes_per_gpu for n in range(1, LAYERS + 1)]
    assert times == sorted(times) and peaks == sorted(peaks, reverse=True)


def test_only_stacks_that_recompute_chosen_blocks_take_it():
    for fw in ("megatron", "fsdp", "torchtitan"):
        assert load_framework(fw).capabilities.recompute_layers
    assert not load_framework("deepspeed").capabilities.recompute_layers
    with pytest.raises(
        ConfigError, match="deepspeed allows full recomputation of every block only"
    ) as err:
        _est(recompute_layers=5, framework="deepspeed", placement="PDT")
    assert "\n" not in str(err.value)


def test_cli_flag_and_its_errors():
    base = [
        "estimate",
        "llama3-8b",
        "--hardware",
        "p5.48xlarge",
        "--gpus",
        "8",
        "--dp",
        "8",
        "--seq",
        "8192",
        "--global-batch",
        "64",
    ]
    ok = CliRunner().invoke(
        app, [*base, "--recompute", "full", "--recompute-layers", "5", "--json"]
    )
    assert ok.exit_code == 0, ok.output
    import json

    assert json.loads(ok.output)["plan"]["recompute_layers"] == 5
    plain = CliRunner().invoke(app, [*base, "--recompute", "full", "--json"])
    assert "recompute_layers" not in json.loads(plain.output)["plan"]  # absent: every block
    for args, text in (
        (
            ["--recompute", "selective", "--recompute-layers", "5"],
            "recompute_layers=5 with recompute",
        ),
        (["--recompute", "full", "--recompute-layers", "40"], "at most 32"),
    ):
        bad = CliRunner().invoke(app, [*base, *args])
        assert (
            bad.exit_code == 2 and text in bad.output and len(bad.output.strip().splitlines()) == 1
        )


def test_plan_documents_round_trip(tmp_path):
    from planner.plan import load_plan

    doc = _est(recompute_layers=7).to_document()
    path = tmp_path / "plan.json"
    import json

    path.write_text(json.dumps(doc))
    assert load_plan(path).config.recompute_layers == 7
    for bad, text in (
        (0, "recompute_layers"),
        (33, "at most 32, the blocks of the largest pipeline chunk"),
    ):
        doc["plan"]["recompute_layers"] = bad
        path.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=text):
            load_plan(path)


def test_megatron_export_recomputes_the_first_blocks_of_each_chunk():
    from planner.exports import export_plan
    from planner.plan import plan_from_document

    plan = plan_from_document(_est(recompute_layers=5).to_document())
    text = export_plan(plan, "megatron").text
    assert "--recompute-granularity full" in text and "--recompute-method block" in text
    assert "--recompute-num-layers 5" in text
    every = export_plan(plan_from_document(_est().to_document()), "megatron").text
    assert "--recompute-method uniform" in every and "--recompute-num-layers 1" in every


def test_search_recomputes_only_as_many_blocks_as_memory_needs():
    """On 8 A100 40GB a Llama 3 8B step of 4k tokens fits only with recomputation; the FSDP stack recomputes
    chosen blocks, and the best plan recomputes fewer than all, fits, and beats recomputing every block."""
    from dataclasses import replace

    from planner.search import recommend

    rec = recommend(
        "llama3-8b", "p4d.24xlarge", gpus=8, global_batch=64, seq=4096, framework="fsdp", top=3
    )
    best = rec.best["plan"]
    assert best["recompute"] == "full" and 1 <= best["recompute_layers"] < LAYERS
    assert rec.best["prediction"]["memory"]["fits"]
    from planner.plan import plan_from_document

    cfg = plan_from_document(rec.best).config
    every = estimate("llama3-8b", "p4d.24xlarge", replace(cfg, recompute_layers=None), gpus=8)
    assert rec.best["prediction"]["step_time_s"] < every.step_time_s
    fewer = (
        estimate(
            "llama3-8b",
            "p4d.24xlarge",
            replace(cfg, recompute_layers=best["recompute_layers"] - 1),
            gpus=8,
        )
        if best["recompute_layers"] > 1
        else None
    )
    assert fewer is None or not fewer.fits  # the fewest recomputed blocks that fit
    ds = recommend(
        "llama3-8b", "p4d.24xlarge", gpus=8, global_batch=64, seq=4096, framework="deepspeed", top=3
    )
    assert all("recompute_layers" not in d["plan"] for d in (ds.best, *ds.alternatives))


def test_executor_wraps_only_the_first_blocks_of_the_stage():
    import torch.nn as nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from planner.executor.parallelize import apply_ac

    module = nn.Module()
    module.layers = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(6)})
    apply_ac(module, "full", 2)
    wrapped = [isinstance(module.layers[str(i)], CheckpointWrapper) for i in range(6)]
    assert wrapped == [True, True, False, False, False, False]
    module.layers = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(3)})
    apply_ac(module, "full")
    assert all(isinstance(m, CheckpointWrapper) for m in module.layers.values())


def test_torchtitan_2024_layer_ac_runs_recompute_every_second_block():
    """torchtitan's 2024-04 benchmarks ran selective_ac_option "2" (every second block wrapped): costed recomputing
    every block, the 8B and 13B rows were +10.7% and +13.1% and the 70B run that ran out of memory was predicted to
    fit; with half the blocks recomputed the two are within 5% and the third does not fit."""
    from benchmarks import published_rows as R
    from benchmarks.stack_predictions import predict

    cases = {c.id: c for c in R.load(("torchtitan",)) if "ac-layer" in c.id}
    for rid, layers in (("tt24a-llama3-8b-ac-layer", 32), ("tt24a-llama2-13b-ac-layer", 40)):
        assert cases[rid].config.recompute_layers == layers // 2
        assert abs(predict(cases[rid]).error) < 0.05
    oom = cases["tt24a-llama2-70b-lbs2-ac-layer-oom"]
    assert not oom.row["trained"] and predict(oom).fits is False


def test_megatron_bridge_llama3_8b_fp8_run_recomputes_five_of_its_32_layers():
    """Megatron-Bridge's Llama 3 8B H100 FP8-CS preset (recompute_num_layers=5, method block) was costed recomputing
    all 32 layers: +34.5%. Read as published, the row's prediction is within 12% (+10.1% since
    the Hopper FP8 GEMM rate's refit with quantized sequence-parallel gathers, +9.5% before)."""
    from benchmarks import published_rows as R
    from benchmarks.stack_predictions import predict

    case = next(c for c in R.load(("megatron",)) if c.id == "mb25.11-llama3-8b-h100-8gpu-fp8cs")
    assert case.config.recompute == "full" and case.config.recompute_layers == 5
    assert abs(predict(case).error) < 0.12


def test_uneven_interleaved_chunks_count_each_chunks_own_blocks():
    """Megatron-Core counts recompute_num_layers per model chunk: chunks (12, 4, 4, 12) on pp 2 x v 2 with N = 8
    recompute 8 + 4 = 12 blocks on each rank, not min(8 x 2, 16) = 16 (which would be every block)."""
    cfg = dict(
        dp=2,
        tp=2,
        pp=2,
        virtual_stages=2,
        schedule="interleaved-1f1b",
        global_batch=16,
        stages=(12, 4, 4, 12),
    )
    every, part = _est(**cfg), _est(recompute_layers=8, **cfg)
    assert (
        part.step_time_s < every.step_time_s and part.peak_bytes_per_gpu > every.peak_bytes_per_gpu
    )
    assert (
        _est(recompute_layers=12, **cfg).step_time_s == every.step_time_s
    )  # 12 covers the largest chunk
    from planner.estimate import rank_recomputed

    assert rank_recomputed([12, 4, 4, 12], 2, 8) == [12, 12]


def test_smaller_ranks_pay_for_their_own_recomputed_blocks():
    """Stages (17, 15) with N = 12: both ranks recompute 12 blocks, so the last rank's stage is 15 blocks' work plus
    12 recomputations (not 15 x the first rank's share 12/17): Step.recomputed_at_ends feeds stage_seconds."""
    import numpy as np

    from cost_models.pipeline import stage_seconds
    from cost_models.step import Step
    from hardware_profiles import load_profile
    from planner.estimate import candidate_of
    from planner.software import software_for
    from planner.sources import resolve_model

    spec = resolve_model("llama3-8b")
    cfg = _cfg(dp=4, pp=2, global_batch=32, stages=(17, 15), recompute_layers=12)
    x = Step.of(
        spec,
        load_profile("p5.48xlarge"),
        software_for("megatron"),
        candidate_of(cfg, spec.total_blocks),
        global_batch=32,
        seq=8192,
        precision="amp-bf16",
        optimizer="adamw",
    )
    first, last, most = (float(v[0]) for v in x.recomputed_at_ends())
    assert (first, last, most) == (12.0, 12.0, 12.0) and float(x.full_share[0]) == pytest.approx(
        12 / 17
    )
    unit = 0.3  # one block's recomputation
    block, rec = (
        np.array([1.0]),
        np.array([unit * 12 / 17]),
    )  # per block, with the busiest rank's share
    s = stage_seconds(x, block, {}, np.array([0.0]), np.array([2.5]), recompute_s=rec)
    # the last rank (15 blocks, the head's 2.5 s) paces: 15 + 2.5 + the 12 - 15 x 12/17 recomputations it adds
    assert float(s.slowest[0]) == pytest.approx(15 + 2.5 + (12 - 15 * 12 / 17) * unit)
    assert float(s.slowest[0]) > 15 * 1.0 + 2.5 + 1e-3  # without them: 17.5


def test_explain_tells_plans_apart_by_their_recomputed_blocks():
    from planner.explain import config_differences

    a, b = _est(recompute_layers=13).to_document()["plan"], _est().to_document()["plan"]
    assert config_differences(a, b) == ["recompute_layers 13->None"]
