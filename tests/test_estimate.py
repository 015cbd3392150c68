"""estimate(): validation, the plan document, uneven stages, scalar == vectorized, scorer speed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hardware_profiles import load_profile
from planner.errors import ConfigError
from planner.estimate import candidate_of, estimate
from planner.parallel import ParallelConfig
from planner.score import CandidateArrays, score
from planner.sources import resolve_model

HW = load_profile("dgx-a100-80g")
GPT3 = resolve_model("gpt3-175b")


def cfg(**kw):
    base = dict(dp=1, tp=8, pp=8, micro_batch=1, global_batch=64, seq=2048, precision="amp-fp16")
    base.update(kw)
    return ParallelConfig(**base)


def test_plan_document_has_the_contract_keys():
    doc = estimate(GPT3, HW, cfg(), gpus=64).to_document()
    assert doc["schema_version"] == "1"
    assert {"name", "params"} <= set(doc["model"]) and {"name", "gpus", "nodes"} <= set(
        doc["hardware"]
    )
    assert doc["hardware"]["nodes"] == 8
    plan = doc["plan"]
    for key in (
        "dp",
        "tp",
        "pp",
        "micro_batch",
        "global_batch",
        "num_microbatches",
        "schedule",
        "virtual_stages",
        "zero",
        "recompute",
        "offload",
        "sequence_parallel",
        "placement",
        "precision",
        "seq",
        "stages",
    ):
        assert key in plan
    assert plan["num_microbatches"] == 64 and sum(plan["stages"]) == 96
    pred = doc["prediction"]
    for key in ("step_time_s", "samples_per_s", "tokens_per_s", "tflops_per_gpu", "mfu"):
        assert pred[key] > 0
    mem = pred["memory"]
    assert (
        mem["peak_bytes_per_gpu"]
        == (
            mem["params_bytes"]
            + mem["grads_bytes"]
            + mem["optimizer_bytes"]
            + mem["activations_bytes"]
            + mem["other_bytes"]
        )
        or abs(
            mem["peak_bytes_per_gpu"]
            - sum(
                mem[k]
                for k in (
                    "params_bytes",
                    "grads_bytes",
                    "optimizer_bytes",
                    "activations_bytes",
                    "other_bytes",
                )
            )
        )
        <= 5
    )
    assert {"compute", "tp_comm", "dp_comm", "pp_p2p", "bubble"} <= set(pred["time_breakdown_s"])
    additive = {k: v for k, v in pred["time_breakdown_s"].items() if "_part_of_" not in k}
    assert sum(additive.values()) == pytest.approx(pred["step_time_s"], rel=1e-9)
    # tokens/s and the model-FLOPs definition (6 N tokens + attention, Narayanan eq. 3 with 72)
    assert pred["tokens_per_s"] == pytest.approx(64 * 2048 / pred["step_time_s"])


def test_model_flops_match_narayanan_eq3_with_72_and_a_causal_half():
    """Narayanan et al. 2021 eq. 3 counts the full s x s attention square (its s / 6h term); the MFU numerator
    counts the causal half a GPT needs, as Megatron-LM's num_floating_point_operations does: s / 12h."""
    est = estimate(GPT3, HW, cfg(), gpus=64)
    B, s, l, h, V = 64, 2048, 96, 12288, GPT3.vocab
    expected = 72 * B * s * l * h**2 * (1 + s / (12 * h) + V / (12 * l * h))
    assert est.scores.model_flops_per_step == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize(
    "framework,configs",
    [
        (
            "megatron",
            [
                cfg(),
                cfg(recompute="selective", sequence_parallel=True),
                cfg(schedule="interleaved-1f1b", virtual_stages=3),
                cfg(dp=2, pp=4, zero=1, micro_batch=2),
                cfg(dp=8, tp=2, pp=4, zero=1),
                cfg(dp=4, tp=4, pp=4, placement="PDT", offload="optimizer"),
            ],
        ),
        (
            "torchtitan",
            [
                cfg(sequence_parallel=True, framework="torchtitan", precision="amp-bf16"),
                cfg(
                    dp=2,
                    pp=4,
                    zero=2,
                    micro_batch=2,
                    schedule="gpipe",
                    framework="torchtitan",
                    precision="amp-bf16",
                    placement="PDT",
                    sequence_parallel=True,
                ),
                cfg(
                    dp=8,
                    tp=2,
                    pp=4,
                    zero=3,
                    sequence_parallel=True,
                    framework="torchtitan",
                    precision="amp-bf16",
                    placement="PDT",
                    offload="optimizer",
                ),
            ],
        ),
    ],
)
def test_scalar_equals_vectorized(framework, configs):
    singles = [estimate(GPT3, HW, c, gpus=64) for c in configs]
    arrays = [candidate_of(c, GPT3.total_blocks) for c in configs]
    stacked = CandidateArrays.concat(arrays)
    # one vectorized call with all candidates (same global batch is needed for one call)
    many = score(
        GPT3,
        HW,
        stacked,
        global_batch=64,
        seq=2048,
        precision=configs[0].precision,
        software=singles[0].software,
    )
    for i, est in enumerate(singles):
        # the vectorized closed form is the scalar closed form; estimate() then reads the step off the
        # simulated step (cost_models.timeline, tests/test_timeline.py)
        closed = float(np.asarray(est.scores.closed_form_step_s)[0])
        assert many.step_time_s[i] == pytest.approx(closed, rel=1e-12)
        assert many.peak_bytes_per_gpu[i] == pytest.approx(est.peak_bytes_per_gpu, abs=1)


def test_uneven_stages_move_load_and_memory():
    even = estimate(GPT3, HW, cfg(pp=8), gpus=64)
    heavy_first = estimate(GPT3, HW, cfg(pp=8, stages=(20,) + (11,) * 6 + (10,)), gpus=64)
    assert heavy_first.step_time_s > even.step_time_s
    assert heavy_first.peak_bytes_per_gpu > even.peak_bytes_per_gpu


def test_a_config_that_does_not_fit_is_still_evaluated():
    est = estimate(GPT3, HW, ParallelConfig(dp=8, global_batch=8, seq=2048), gpus=8)
    assert not est.fits and est.step_time_s > 0
    assert est.to_document()["prediction"]["memory"]["fits"] is False


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(config=cfg(dp=2), gpus=64), "dp*tp*pp*cp"),
        (dict(config=cfg(tp=5, pp=1, dp=1), gpus=5), "tp"),
        (dict(config=cfg(tp=1, pp=128, dp=1, global_batch=128), gpus=128), "pp"),
        (dict(config=cfg(pp=2, stages=(40, 40)), gpus=16), "stages"),
    ],
)
def test_invalid_configurations_raise_config_error(bad, field):
    with pytest.raises(ConfigError) as err:
        estimate(GPT3, HW, bad["config"], gpus=bad["gpus"])
    assert err.value.field == field


def test_scores_100k_candidates_fast():
    n = 100_000
    r = np.random.default_rng(0)
    tp = r.choice([1, 2, 4, 8], n)
    pp = r.choice([1, 2, 4, 8, 16], n)
    c = CandidateArrays(
        dp=1024 // (tp * pp),
        tp=tp,
        pp=pp,
        micro_batch=r.choice([1, 2, 4], n),
        virtual_stages=np.ones(n, int),
        zero=r.integers(0, 4, n),
        recompute=r.integers(0, 3, n),
        offload=r.integers(0, 3, n),
        sequence_parallel=r.integers(0, 2, n).astype(bool),
        schedule=r.integers(0, 2, n),
        placement=r.integers(0, 6, n),
    )
    score(
        GPT3,
        HW,
        c.__class__(
            **{
                f: getattr(c, f)[:10]
                for f in (
                    "dp",
                    "tp",
                    "pp",
                    "micro_batch",
                    "virtual_stages",
                    "zero",
                    "recompute",
                    "offload",
                    "sequence_parallel",
                    "schedule",
                    "placement",
                )
            }
        ),
        global_batch=4096,
        seq=2048,
    )
    t0 = time.perf_counter()
    s = score(GPT3, HW, c, global_batch=4096, seq=2048)
    elapsed = time.perf_counter() - t0
    assert np.all(np.isfinite(s.step_time_s)) and np.all(s.peak_bytes_per_gpu > 0)
    assert elapsed < 3.0  # ~0.5 s on the 2-core CI machine; generous bound for shared runners


def test_python_api_planner_estimate_by_names():
    import planner

    c = cfg()
    est = planner.estimate("gpt3-175b", "dgx-a100-80g", c, gpus=64)
    doc = est.to_document()
    # the names resolve to the model and machine they name, checked against facts, not the resolvers:
    # GPT-3 175B (174.6e9 parameters with its 50257-token embedding, Brown et al. 2020 Table 2.1) on
    # 8 nodes of 8 A100 80GB
    assert (
        doc["model"]["name"],
        doc["model"]["params"],
        doc["model"]["layers"],
        doc["plan"]["seq"],
    ) == ("gpt3-175b", 174_604_259_328, 96, 2048)
    assert (doc["hardware"]["name"], doc["hardware"]["gpus"], doc["hardware"]["nodes"]) == (
        "dgx-a100-80g",
        64,
        8,
    )
    assert "A100" in doc["hardware"]["device"] and "80GB" in doc["hardware"]["device"]
    assert 80e9 <= doc["prediction"]["memory"]["capacity_bytes"] <= 80 * 2**30
    # the same prediction as with resolved objects; a second call works once `planner.estimate` is the
    # module (planner/estimate.py's callable module); another machine's name changes the prediction
    assert est.step_time_s == estimate(GPT3, HW, c, gpus=64).step_time_s
    assert planner.estimate("gpt3-175b", "dgx-a100-80g", c, gpus=64).step_time_s == est.step_time_s
    small = planner.estimate("gpt3-175b", "p4d.24xlarge", c, gpus=64)  # A100 40GB, slower HBM
    assert small.to_document()["prediction"]["memory"]["capacity_bytes"] < 40 * 2**30
    assert small.step_time_s > est.step_time_s


def test_default_even_split_matches_estimate():
    # blocks not divisible by pp * v: the vectorized default split equals estimate()'s stages
    for pp, v in ((5, 1), (7, 1), (5, 2), (7, 3), (8, 3)):
        schedule = "interleaved-1f1b" if v > 1 else "1f1b"
        c = cfg(pp=pp, dp=1, tp=8, virtual_stages=v, schedule=schedule, global_batch=pp * 4)
        est = estimate(GPT3, HW, c, gpus=8 * pp)
        a = candidate_of(c, GPT3.total_blocks)
        bare = CandidateArrays(
            **{
                f: getattr(a, f)
                for f in (
                    "dp",
                    "tp",
                    "pp",
                    "micro_batch",
                    "virtual_stages",
                    "zero",
                    "recompute",
                    "offload",
                    "sequence_parallel",
                    "schedule",
                    "placement",
                )
            }
        )
        s = score(GPT3, HW, bare, global_batch=pp * 4, seq=2048, precision="amp-fp16")
        closed = float(np.asarray(est.scores.closed_form_step_s)[0])
        assert float(s.step_time_s[0]) == pytest.approx(closed, rel=1e-12)
        assert float(s.peak_bytes_per_gpu[0]) == pytest.approx(est.peak_bytes_per_gpu, abs=1)


def test_a_middle_rank_with_more_blocks_holds_the_peak():
    # 1F1B: rank k keeps p - k micro-batches in flight. Rank 1 with 26 blocks x 7 in flight outweighs
    # rank 0 with 2 blocks x 8 (plus the embedding): the peak is rank 1's, not the first or last rank's.
    stages = (2, 26, 12, 12, 12, 12, 10, 10)
    est = estimate(GPT3, HW, cfg(pp=8, stages=stages), gpus=64)
    ranks = est.to_document()["prediction"]["memory_per_rank"]
    assert [r["rank"] for r in ranks] == list(range(8))
    peaks = [r["peak_bytes_per_gpu"] for r in ranks]
    assert max(peaks) == peaks[1] == est.peak_bytes_per_gpu
    assert ranks[1]["activations_bytes"] > 10 * ranks[0]["activations_bytes"]
    # the first/last-only evaluation (no per-rank blocks) would have missed it
    c = candidate_of(cfg(pp=8, stages=stages), GPT3.total_blocks)
    ends_only = score(
        GPT3,
        HW,
        CandidateArrays(
            **{f: getattr(c, f) for f in CandidateArrays.__slots__ if f != "rank_blocks"}
        ),
        global_batch=64,
        seq=2048,
        precision="amp-fp16",
    )
    assert float(ends_only.peak_bytes_per_gpu[0]) < est.peak_bytes_per_gpu


def test_even_split_peaks_on_an_end_rank():
    # The search scores only the first and the last rank of even splits: rank 0 holds the most blocks
    # and the most micro-batches in flight, so no middle rank can exceed it.
    torchtitan = dict(
        framework="torchtitan", precision="amp-bf16", sequence_parallel=True, placement="PDT"
    )
    for c in (
        cfg(pp=8),
        cfg(pp=8, schedule="gpipe", **torchtitan),
        cfg(pp=8, schedule="interleaved-1f1b", virtual_stages=3),
        cfg(pp=4, tp=8, dp=2, zero=1, micro_batch=2),
        cfg(pp=8, schedule="zero-bubble", **torchtitan),
    ):
        ranks = estimate(GPT3, HW, c, gpus=64).memory_per_rank()
        peaks = [r["peak_bytes_per_gpu"] for r in ranks]
        assert max(peaks) == max(peaks[0], peaks[-1])
        assert all(
            peaks[k] >= peaks[k + 1] for k in range(len(peaks) - 2)
        )  # fewer in flight down the pipe


def test_interleaved_last_rank_keeps_its_warmup_chunks():
    # Megatron's interleaved schedule (p = 8, v = 3, 12 blocks per rank): rank k holds
    # ((p - k - 1) 2 + (v - 1) p + 1) / v stage-loads; the last rank ((v - 1) p + 1) / v = 17/3, not 1.
    inter = estimate(
        GPT3, HW, cfg(pp=8, schedule="interleaved-1f1b", virtual_stages=3), gpus=64
    ).memory_per_rank()
    one_f = estimate(GPT3, HW, cfg(pp=8), gpus=64).memory_per_rank()
    acts = [r["activations_bytes"] for r in inter]
    stage_load = (acts[1] - acts[2]) * 3 / 2  # middle ranks differ by 2/v stage-loads
    assert acts[6] == pytest.approx(19 / 3 * stage_load, rel=1e-6)
    # same blocks and head on the last rank; only the in-flight count of its blocks differs
    assert acts[7] - one_f[7]["activations_bytes"] == pytest.approx(
        (17 / 3 - 1) * stage_load, rel=1e-6
    )


def test_a_factory_module_that_describes_its_transformer_is_scored(monkeypatch):
    # `.spec` (the reference Transformer) or a Hugging Face-style `.config`: scored as that transformer,
    # named after the factory so a plan file re-builds the same module; a description whose
    # parameters do not match the module's measured ones is refused (exit 2), as is a plain module.
    from pathlib import Path

    from planner.sources import resolve_model, transformer_spec

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    small = ParallelConfig(dp=2, tp=2, pp=2, micro_batch=1, global_batch=8, seq=32)
    for factory, catalogued in (
        ("fixtures.factories:small_llama", "SMALL_LLAMA"),
        ("fixtures.factories:hf_style_llama", None),
    ):
        spec = transformer_spec(resolve_model(factory))
        assert (
            spec.name == factory and spec.heads == 4 and spec.n_kv_heads == 2 and spec.layers == 4
        )
        est = estimate(factory, HW, small, gpus=8)
        if catalogued:
            from tests.fixtures import factories

            direct = estimate(getattr(factories, catalogued), HW, small, gpus=8)
            assert est.step_time_s == pytest.approx(direct.step_time_s, rel=1e-12)
            assert est.peak_bytes_per_gpu == direct.peak_bytes_per_gpu
    with pytest.raises(ConfigError, match="holds .* its description"):
        estimate("fixtures.factories:hf_style_llama_misdescribed", HW, small, gpus=8)
    with pytest.raises(ConfigError, match="profiled .* but not scored"):
        estimate(
            "fixtures.factories:convnet", HW, ParallelConfig(dp=8, global_batch=8, seq=8), gpus=8
        )
