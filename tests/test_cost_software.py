"""Software facts a run sets (cost_models.step.Software and frameworks/*.json): tensor-parallel overlap,
torchtitan's per-operator selective recompute, torch.compile, FP8 GEMM efficiency, and NVLink domains
that hold a whole job. Each is checked on the cost terms and through estimate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dataclasses import replace

import numpy as np
import pytest

from cost_models import blocks as B
from cost_models import comm as C
from cost_models.compute import eff, gemm_efficiency_max
from hardware_profiles import load_profile
from planner.catalog import get
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.placement import aligned_domain, group_locality
from planner.run_options import RunOptions

LLAMA8 = get("llama3-8b")
ROOT = Path(__file__).resolve().parents[1]


def _cfg(**kw):
    base = dict(
        dp=8,
        tp=8,
        pp=1,
        micro_batch=1,
        global_batch=64,
        seq=8192,
        sequence_parallel=True,
        framework="megatron",
    )
    return ParallelConfig(**{**base, **kw})


def test_tp_overlap_hides_tp_communication_up_to_the_gemms_and_never_adds_time():
    cfg = _cfg()
    plain = estimate(
        "llama3-70b", "p5.48xlarge", cfg, gpus=64, options=RunOptions(tp_comm_overlap=False)
    )
    over = estimate(
        "llama3-70b", "p5.48xlarge", cfg, gpus=64, options=RunOptions(tp_comm_overlap=True)
    )
    br_plain, br_over = (
        plain.to_document()["prediction"]["time_breakdown_s"],
        over.to_document()["prediction"]["time_breakdown_s"],
    )
    assert br_over["tp_comm"] < 0.5 * br_plain["tp_comm"]  # mostly hidden behind the GEMMs
    assert br_over["tp_comm"] > 0.0  # interference of the hidden part
    assert over.step_time_s < plain.step_time_s
    assert over.to_document()["software"]["tp_comm_overlap"] is True


OVERLAP_ARGS = [
    "estimate",
    "llama3-70b",
    "--hardware",
    "p5.48xlarge",
    "--gpus",
    "64",
    "--dp",
    "8",
    "--tp",
    "8",
    "--sequence-parallel",
    "--global-batch",
    "64",
    "--json",
]


@pytest.mark.parametrize(
    "flag, key, on",
    [
        ("--tp-comm-overlap", "tp_comm_overlap", True),
        ("--no-overlap-grad-reduce", "overlap_grad_reduce", False),
    ],
)
def test_the_overlap_options_on_the_command_line_reach_the_cost_terms(flag, key, on):
    """--tp-comm-overlap and --[no-]overlap-grad-reduce (RunOptions) are what estimate() with the same
    options predicts, and the plan document says the choice."""
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    res = CliRunner().invoke(app, OVERLAP_ARGS + [flag])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["software"][key] is on
    cfg = _cfg(dp=8, tp=8, global_batch=64)
    direct = estimate("llama3-70b", "p5.48xlarge", cfg, gpus=64, options=RunOptions(**{key: on}))
    assert doc["prediction"]["step_time_s"] == pytest.approx(direct.step_time_s, rel=1e-12)
    default = estimate("llama3-70b", "p5.48xlarge", cfg, gpus=64)
    assert direct.step_time_s != pytest.approx(default.step_time_s, rel=1e-6)


INTERLEAVED_ARGS = [
    "estimate",
    "gpt3-175b",
    "--hardware",
    "p4d.24xlarge",
    "--gpus",
    "64",
    "--dp",
    "2",
    "--tp",
    "8",
    "--pp",
    "4",
    "--virtual-stages",
    "4",
    "--global-batch",
    "64",
    "--zero",
    "1",
    "--json",
]


@pytest.mark.parametrize(
    "flag, key, term",
    [
        ("--no-overlap-p2p", "overlap_p2p", "pp_p2p"),
        ("--no-overlap-param-gather", "overlap_param_gather", "dp_comm"),
    ],
)
def test_turning_a_megatron_overlap_off_exposes_its_communication(flag, key, term):
    """Megatron-Core overlaps the interleaved schedule's sends (overlap_p2p_comm) and the distributed
    optimizer's parameter gathers (--overlap-param-gather) by default (frameworks/megatron.json); the
    run options turn either off, the plan says so, and the term it hid comes back on the timeline."""
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    on, off = (
        json.loads(CliRunner().invoke(app, INTERLEAVED_ARGS + extra).stdout)
        for extra in ([], [flag])
    )
    assert on["software"][key] is True and off["software"][key] is False
    assert off["prediction"]["time_breakdown_s"][term] > on["prediction"]["time_breakdown_s"][term]
    assert off["prediction"]["step_time_s"] > on["prediction"]["step_time_s"]


@pytest.mark.parametrize("framework", ["deepspeed", "fsdp"])
def test_tp_comm_overlap_on_a_stack_without_it_is_one_line_and_exit_2(framework):
    from typer.testing import CliRunner

    from planner.cli import app

    res = CliRunner().invoke(
        app,
        [
            "estimate",
            "llama3-8b",
            "--hardware",
            "p5.48xlarge",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--framework",
            framework,
            "--tp-comm-overlap",
        ],
    )
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "tp_comm_overlap" in res.output


def test_tp_exposed_formula():
    from frameworks import load_framework

    class X:  # the fields the term reads
        sw = type("S", (), {"tp_comm_overlap": True, "framework": load_framework("megatron")})()
        hw = load_profile("p5.48xlarge")
        full = np.array([False])
        full_share = np.array([0.0])
        tp = np.array([8])
        sp = np.array([True])  # Megatron-LM overlaps only with sequence parallelism

        @staticmethod
        def is_schedule(name):
            return np.array([False])

    tp = C.TpSeconds(
        allreduce=np.array(1.0), fwd=np.array(2.0), bwd=np.array(2.0), recompute=np.array(0.0)
    )
    block = type("Bk", (), {"gemm_fwd": np.array(1.5), "gemm_bwd": np.array(3.0)})()
    from cost_models.compute import eff

    i = eff(X.hw, "overlap_interference")
    # fwd: 2 s of collectives beside 1.5 s of GEMMs shows 0.5 + i 1.5; bwd: all 2 s hidden, i 2
    assert float(C.tp_exposed_seconds(X, tp, block)[0]) == pytest.approx(0.5 + i * 1.5 + i * 2.0)
    X.sp = np.array([False])  # without it nothing is hidden
    assert float(C.tp_exposed_seconds(X, tp, block)[0]) == pytest.approx(4.0)


def _paired_tp_case(framework: str, *, overlap: bool):
    """The fields tp_exposed_parts reads for a dense block on 8 p5 ranks with sequence parallelism,
    each side's pair 1 s per pass (all-gather 0.5 + reduce-scatter 0.5), and a block whose QKV,
    projection, fc1 and fc2 GEMMs take 0.2, 0.1, 2.0 and 1.0 s (forward): (x, tp, block)."""
    from types import SimpleNamespace

    from frameworks import load_framework

    x = SimpleNamespace(
        sw=SimpleNamespace(tp_comm_overlap=overlap, framework=load_framework(framework)),
        hw=load_profile("p5.48xlarge"),
        full=np.array([False]),
        full_share=np.array([0.0]),
        tp=np.array([8]),
        sp=np.array([True]),
        is_schedule=lambda name: np.array([False]),
    )
    pair = np.array(1.0)
    tp = C.TpSeconds(
        allreduce=pair,
        fwd=2 * pair,
        bwd=2 * pair,
        recompute=np.array(0.0),
        pair_fwd=pair,
        pair_bwd=pair,
        mlp_linear=np.array(True),
    )
    block = SimpleNamespace(gemm_fwd=np.array(3.3), gemm_bwd=np.array(6.6))
    block.tp_paired_fwd = (np.array(0.2), np.array(0.1), np.array(2.0), np.array(1.0))
    return x, tp, block


def test_each_overlapped_collective_hides_only_under_the_gemm_it_is_fused_with():
    X, tp, block = _paired_tp_case("megatron", overlap=True)
    i = eff(X.hw, "overlap_interference")
    # per pass: 0.3 + 0.4 of attention's collectives show, the MLP's hide; 4 hidden parts; the
    # backward also re-gathers each side's input (0.5) beside its dgrad: QKV's shows 0.3
    per_pass = (0.5 - 0.2) + (0.5 - 0.1) + i * (0.2 + 0.1 + 0.5 + 0.5)
    regather = (0.5 - 0.2) + i * 0.2 + i * 0.5
    assert float(C.tp_exposed_seconds(X, tp, block)[0]) == pytest.approx(2 * per_pass + regather)
    # against the pass's GEMMs as a whole it would all hide
    block.tp_paired_fwd = None
    assert float(C.tp_exposed_seconds(X, tp, block)[0]) == pytest.approx(2 * i * 2.0)
    # an FP8 all-gather (0.3 s) beside its 16-bit reduce-scatter (0.7 s): forward, the gathers
    # under QKV and fc1, the scatters under the projection and fc2; backward, the scatters of the
    # input gradient under QKV's and fc1's dgrad, the output gradient's gathers under the others'
    block.tp_paired_fwd = (np.array(0.2), np.array(0.1), np.array(2.0), np.array(1.0))
    fp8 = replace(tp, gather_fwd=np.array(0.3), gather_bwd=np.array(0.3))
    fwd = (0.3 - 0.2) + (0.7 - 0.1) + i * (0.2 + 0.1 + 0.3 + 0.7)
    bwd = (0.7 - 0.2) + (0.3 - 0.1) + i * (0.2 + 0.1 + 0.7 + 0.3)
    regather = (0.3 - 0.2) + i * 0.2 + i * 0.3  # the forward's FP8 all-gather again
    assert float(C.tp_exposed_seconds(X, fp8, block)[0]) == pytest.approx(fwd + bwd + regather)


def test_op_sac_saves_less_than_megatron_selective_and_recomputes_the_unsaved_matmuls():
    sac = B.op_sac(LLAMA8, "amp-bf16", "torch")
    table = B.block_table(LLAMA8, "amp-bf16", "torch", flash=True)
    megatron_selective = (table.saved.rep - table.scores_saved.rep) + (
        table.saved.shard - table.scores_saved.shard
    )
    # input 2h, q h, v kv, attention out h + lse 4 a, w1 out f, w2 out h (bf16 c = 2)
    h, kv, f, a = 4096, 1024, 14336, 32
    assert sac.saved.rep + sac.saved.shard == 2 * (2 * h + h + kv + h + f) + 4 * a
    assert sac.saved.rep + sac.saved.shard < 0.5 * megatron_selective
    # k (h x kv), o (h x h), w3 (h x f) of q, k, v, o, w1, w3, w2
    assert sac.gemm_fraction == pytest.approx(
        (h * kv + h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f)
    )


def test_torchtitan_selective_is_the_op_policy_in_estimate_and_profile():
    from planner.profiler import profile_spec

    cfg = _cfg(
        dp=8,
        tp=1,
        zero=3,
        sequence_parallel=False,
        framework="torchtitan",
        recompute="selective",
        global_batch=16,
        micro_batch=2,
    )
    est = estimate(LLAMA8, "p5.48xlarge", cfg, gpus=8)
    prof = profile_spec(LLAMA8, micro_batch=2, seq=8192, framework="torchtitan")
    per_block = prof.layers[1].activation_bytes["selective"]
    sac = B.op_sac(LLAMA8, "amp-bf16", "torch").saved
    assert per_block == pytest.approx((sac.rep + sac.shard) * 2 * 8192, rel=1e-9)
    assert est.to_document()["prediction"]["memory"]["saved_activations_bytes"] >= 32 * per_block


def test_compile_streams_fewer_bytes_and_is_never_slower():
    cfg = _cfg(
        dp=8,
        tp=1,
        zero=3,
        sequence_parallel=False,
        framework="torchtitan",
        global_batch=16,
        micro_batch=2,
    )
    eager = estimate(LLAMA8, "p5.48xlarge", cfg, gpus=8)
    compiled = estimate(LLAMA8, "p5.48xlarge", cfg, gpus=8, options=RunOptions(compile=True))
    assert compiled.step_time_s < eager.step_time_s
    assert compiled.peak_bytes_per_gpu == eager.peak_bytes_per_gpu  # saved tensors unchanged


def test_rowwise_fp8_casts_every_operand_twice_and_changes_nothing_else():
    from cost_models.compute import fp8_cast_bytes
    from planner.errors import ConfigError

    cfg = _cfg(dp=8, tp=8, zero=3, framework="torchtitan", precision="fp8", global_batch=64)
    tensorwise = estimate(LLAMA8, "p5.48xlarge", cfg, gpus=64)
    rowwise = estimate(
        LLAMA8, "p5.48xlarge", cfg, gpus=64, options=RunOptions(fp8_scaling="rowwise")
    )
    assert rowwise.step_time_s > tensorwise.step_time_s
    assert rowwise.peak_bytes_per_gpu == tensorwise.peak_bytes_per_gpu
    x = type("X", (), {})()
    x.precision, x.sw = "fp8", rowwise.software
    assert fp8_cast_bytes(x) == 2 * rowwise.software.framework.fp8_cast_bytes_per_element
    x.precision = "amp-bf16"
    assert fp8_cast_bytes(x) == 0.0
    bf16 = _cfg(dp=8, tp=8, zero=3, framework="torchtitan", global_batch=64)
    assert (
        estimate(
            LLAMA8, "p5.48xlarge", bf16, gpus=64, options=RunOptions(fp8_scaling="rowwise")
        ).step_time_s
        == estimate(LLAMA8, "p5.48xlarge", bf16, gpus=64).step_time_s
    )
    with pytest.raises(ConfigError, match="fp8_scaling"):
        estimate(LLAMA8, "p5.48xlarge", cfg, gpus=64, options=RunOptions(fp8_scaling="colwise"))
    # recommend searches FP8 plans with it, every plan document says so, and explain's fresh search keeps it
    from planner.explain import _software_options
    from planner.search import recommend

    rec = recommend(
        LLAMA8,
        "p5.48xlarge",
        gpus=64,
        global_batch=64,
        precision="fp8",
        framework="torchtitan",
        top=2,
        options=RunOptions(fp8_scaling="rowwise"),
    )
    assert all(d["software"]["fp8_scaling"] == "rowwise" for d in (rec.best, *rec.alternatives))
    assert _software_options(rec.best).fp8_scaling == "rowwise"
    plain = recommend(
        LLAMA8,
        "p5.48xlarge",
        gpus=64,
        global_batch=64,
        precision="fp8",
        framework="torchtitan",
        top=1,
    )
    assert (
        plain.best["software"]["fp8_scaling"] == "tensorwise"
        and "fp8_scaling" not in _software_options(plain.best).chosen()
    )
    assert rec.best["prediction"]["step_time_s"] > plain.best["prediction"]["step_time_s"]


def test_a_power_capped_part_slows_compute_bound_kernels_only():
    from cost_models.compute import gemm_seconds, memory_bound_seconds

    hw = load_profile("p5.48xlarge")
    capped = dataclasses.replace(
        hw, efficiency={**hw.efficiency, "power_limit_clock_fraction": 0.5}
    )
    big = dict(m=8192, n=8192, k=8192, precision="amp-bf16")
    fixed = hw.efficiency["gemm_fixed_us"] * 1e-6
    assert float(gemm_seconds(hw=capped, **big)) - fixed == pytest.approx(
        2 * (float(gemm_seconds(hw=hw, **big)) - fixed)
    )
    assert float(memory_bound_seconds(1e9, capped)) == float(memory_bound_seconds(1e9, hw))
    cfg = _cfg(
        dp=8,
        tp=1,
        zero=3,
        sequence_parallel=False,
        framework="torchtitan",
        global_batch=16,
        micro_batch=2,
    )
    slow, fast = estimate(LLAMA8, capped, cfg, gpus=8), estimate(LLAMA8, hw, cfg, gpus=8)
    assert (
        slow.step_time_s > fast.step_time_s and slow.mfu < fast.mfu
    )  # MFU keeps the datasheet peak


def test_the_sustained_clock_scales_tensor_core_time_and_a_short_benchmark_runs_at_boost():
    from cost_models.compute import (
        gemm_seconds,
        memory_bound_seconds,
        short_benchmark,
        sustained_flops,
    )

    hw = load_profile("p5.48xlarge")
    frac = hw.efficiency["sustained_clock_fraction"]
    assert 0.6 <= frac < 1.0  # Hopper's rates were measured at boost clock on one idle H100
    boost = short_benchmark(hw)
    assert (
        boost.efficiency["sustained_clock_fraction"] == 1.0
        and hw.efficiency["sustained_clock_fraction"] == frac
    )
    assert sustained_flops(hw, "amp-bf16") == pytest.approx(
        frac * sustained_flops(boost, "amp-bf16")
    )
    big = dict(m=8192, n=8192, k=8192, precision="amp-bf16")
    fixed = hw.efficiency["gemm_fixed_us"] * 1e-6
    assert float(gemm_seconds(hw=hw, **big)) - fixed == pytest.approx(
        (float(gemm_seconds(hw=boost, **big)) - fixed) / frac
    )
    assert float(memory_bound_seconds(1e9, hw)) == float(memory_bound_seconds(1e9, boost))
    cfg = _cfg(
        dp=8,
        tp=1,
        zero=3,
        sequence_parallel=False,
        framework="torchtitan",
        global_batch=16,
        micro_batch=2,
    )
    assert (
        estimate(LLAMA8, hw, cfg, gpus=8).step_time_s
        > estimate(LLAMA8, boost, cfg, gpus=8).step_time_s
    )


def test_only_profiles_whose_rates_came_from_short_benchmarks_hold_a_sustained_clock():
    """A100 and Blackwell rates were fitted to multi-GPU training runs, which already run at sustained clocks."""
    for name in ("dgx-h100", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"):
        assert load_profile(name).efficiency["sustained_clock_fraction"] < 1.0, name
    for name in ("dgx-a100-80g", "p4d.24xlarge", "dgx-b200", "gb200-nvl72"):
        assert load_profile(name).efficiency.get("sustained_clock_fraction", 1.0) == 1.0, name


def test_fp8_gemm_efficiency_has_its_own_key_with_a_fallback():
    hw = load_profile("p5.48xlarge")
    assert gemm_efficiency_max(hw, "fp8") == hw.efficiency.get(
        "gemm_efficiency_max_fp8", hw.efficiency["gemm_efficiency_max"]
    )
    other = dataclasses.replace(hw, efficiency={**hw.efficiency, "gemm_efficiency_max_fp8": 0.5})
    assert (
        gemm_efficiency_max(other, "fp8") == 0.5
        and gemm_efficiency_max(other, "amp-bf16") == hw.efficiency["gemm_efficiency_max"]
    )


def test_a_job_inside_one_nvlink_domain_keeps_every_group_on_nvlink():
    assert (
        int(aligned_domain(72, 64)) == 64
        and int(aligned_domain(72, 128)) == 64
        and int(aligned_domain(8, 64)) == 8
    )
    assert int(aligned_domain(72, 144)) == 72
    local = group_locality(
        np.array([0]), dp=np.array([64]), pp=np.array([1]), tp=np.array([1]), devices_per_node=72
    )
    assert int(local["D"][0]) == 64
    # two racks: a 64-rank data-parallel group per rack stays on NVLink, the 128-rank one does not
    local = group_locality(
        np.array([0]), dp=np.array([128]), pp=np.array([1]), tp=np.array([1]), devices_per_node=72
    )
    assert int(local["D"][0]) == 64
    gb200 = estimate(
        "llama3-70b",
        "gb200-nvl72",
        _cfg(dp=64, tp=1, zero=3, sequence_parallel=False, global_batch=128, precision="fp8"),
        gpus=64,
    )
    assert (
        gb200.to_document()["prediction"]["time_breakdown_s"]["dp_comm"] < 0.1 * gb200.step_time_s
    )


def _tp_stub(precision, framework="megatron", scaling="tensorwise", sp=True):
    from frameworks import load_framework

    class X:  # the fields tp_pair_seconds reads
        sw = type("S", (), {"framework": load_framework(framework), "fp8_scaling": scaling})()
        hw = load_profile("p5.48xlarge")
        tokens = np.array([8192.0])
        spec = LLAMA8
        c = 2.0
        tp = np.array([8])
        local = {"T": np.array([8])}

    X.precision = precision
    X.sp = np.array([sp])
    return X


@pytest.mark.parametrize(
    "scaling, forward, backward",
    [
        ("tensorwise", 1.0, 1.0),  # one FP8 copy, transposed after the gather
        ("delayed", 1.0, 1.0),
        ("mxfp8", 1.0, 2.0),  # row- and column-wise copies of the output gradient
        ("nvfp4", 0.5 + 1 / 16, 2 * (0.5 + 1 / 16)),
    ],
)
def test_transformer_engine_gathers_sequence_parallel_tensors_in_the_recipes_bytes(
    scaling, forward, backward
):
    """TE quantizes the norm output before the column-parallel all-gather (row-wise data) and the
    output gradient before the row-parallel one (row- and column-wise for block-scaled recipes:
    linear.py sets both usages, distributed.py gathers both; frameworks/megatron.json
    sources.fp8_tp_gather); the reduce-scatter stays 16-bit, so the pair saves what a ring
    all-gather of 2 - gathered bytes an element moves over NVLink: (n - 1) / n of it."""
    x = _tp_stub("fp8", scaling=scaling)
    elements = float(x.tokens[0]) * LLAMA8.hidden
    allreduce = C.group_collective_seconds("allreduce", elements * 2.0, x.tp, x.local["T"], x.hw)
    for pair, gathered in zip(C.tp_pair_seconds(x, allreduce), (forward, backward)):
        saved = (2.0 - gathered) * elements * 7 / 8 / C.intra_bus_Bps(x.hw, "allgather")
        assert float(allreduce[0] - pair[0]) == pytest.approx(saved, rel=1e-9, abs=1e-15)
    for unchanged in (
        _tp_stub("amp-bf16"),  # nothing quantized
        _tp_stub("fp8", sp=False),  # all-reduces of the full activation, 16-bit
        _tp_stub("fp8", framework="deepspeed"),  # Megatron-DeepSpeed's own linears, 16-bit
        _tp_stub("fp8", framework="torchtitan", scaling="rowwise"),  # plain tensor-parallel styles
    ):
        for pair in C.tp_pair_seconds(unchanged, allreduce):
            assert float(pair[0]) == float(allreduce[0])


def test_torchaos_tensorwise_tensor_parallel_styles_gather_float8():
    """torchtitan's tensorwise float8 swaps in torchao's Float8ColwiseParallel / RowwiseParallel,
    which cast before the all-gathers (frameworks/torchtitan.json sources.fp8_tp_gather); a
    profile may name only recipes it runs."""
    from frameworks.loader import framework_from_dict

    x = _tp_stub("fp8", framework="torchtitan", scaling="tensorwise")
    elements = float(x.tokens[0]) * LLAMA8.hidden
    allreduce = C.group_collective_seconds("allreduce", elements * 2.0, x.tp, x.local["T"], x.hw)
    saved = 1.0 * elements * 7 / 8 / C.intra_bus_Bps(x.hw, "allgather")
    for pair in C.tp_pair_seconds(x, allreduce):
        assert float(allreduce[0] - pair[0]) == pytest.approx(saved, rel=1e-9)
    data = json.loads((ROOT / "frameworks" / "torchtitan.json").read_text(encoding="utf-8"))
    with pytest.raises(ConfigError, match="fp8_tp_gather.*recipes of capabilities.fp8_scalings"):
        framework_from_dict(data | {"fp8_tp_gather": ["mxfp8"]})


def test_an_fp8_sequence_parallel_plan_pays_for_16_bit_reduce_scatters_only():
    """Estimate end to end: the FP8 plan's all-gathers move one byte an element where the
    reduce-scatters move two. Per side, in units of a 16-bit all-gather: the forward shows its
    all-gather and reduce-scatter (FP8 1 + 2, bf16 2 + 2); Megatron's backward shows the output
    gradient's all-gather (1, 2) and hides the input's re-gather and the input gradient's
    reduce-scatter beside its GEMMs at the interference i (i (1 + 2), i (2 + 2)). The collectives'
    latency and the embedding's 16-bit all-reduce raise the ratio a little above the bytes'."""
    i = eff(load_profile("p5.48xlarge"), "overlap_interference")
    by_bytes = (3 + 1 + 3 * i) / (4 + 2 + 4 * i)
    ratio = _fp8_over_bf16_tp_comm("llama3-70b", _cfg(global_batch=8), gpus=64)
    assert by_bytes < ratio < by_bytes + 0.07


def test_the_all_gather_dispatchers_pair_stays_16_bit_under_fp8():
    """An MoE block on Megatron-Core's all-gather dispatcher (ep 1, expert_tp = tp) gathers its
    tokens with gather_from_sequence_parallel_region, not Transformer Engine's quantizing linears:
    only attention's pair saves bytes under FP8, so the block's tensor-parallel time falls about
    an eighth where a dense block's falls about a quarter."""
    cfg = _cfg(dp=1, tp=8, expert_tp=8, global_batch=8, zero=1)
    assert 0.86 < _fp8_over_bf16_tp_comm("mixtral-8x7b", cfg, gpus=8) < 0.9


def _fp8_over_bf16_tp_comm(model, cfg, *, gpus) -> float:
    """The FP8 plan's tensor-parallel time over the bf16 plan's, the overlap off, on p5.48xlarge."""
    times = {}
    for precision in ("amp-bf16", "fp8"):
        est = estimate(
            model,
            "p5.48xlarge",
            dataclasses.replace(cfg, precision=precision),
            gpus=gpus,
            options=RunOptions(tp_comm_overlap=False),
        )
        times[precision] = est.to_document()["prediction"]["time_breakdown_s"]["tp_comm"]
    return times["fp8"] / times["amp-bf16"]


def test_megatrons_column_parallel_backward_runs_its_collectives_beside_its_gemms():
    """Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication.backward: with sequence
    parallelism the output gradient's all-gather shows, the input's re-gather runs beside the data
    gradient and the input gradient's reduce-scatter beside the weight gradient; without it the
    all-reduce beside the weight gradient. torchtitan's DTensor backward shows them all."""
    from frameworks import load_framework

    X, tp, block = _paired_tp_case("megatron", overlap=False)
    i = eff(X.hw, "overlap_interference")
    # sequence parallel: the output gradient's all-gather (0.5) shows; the input's re-gather and
    # the input gradient's reduce-scatter (0.5 each) run beside QKV's 0.2 s GEMMs, fc1's 2.0 s
    attention = 0.5 + 2 * ((0.5 - 0.2) + i * 0.2)
    mlp = 0.5 + 2 * (i * 0.5)

    def one(a):
        return float(np.asarray(a).reshape(-1)[0])

    fwd, bwd, rec = C.tp_exposed_parts(X, tp, block)
    assert one(fwd) == 2.0 and one(bwd) == pytest.approx(attention + mlp)
    # FP8 gathers (0.3 s forward, 0.4 s backward: both orientations), 16-bit reduce-scatters; an
    # MoE block whose MLP pair is the dispatcher's (mlp_linear False) shows that pair whole
    fp8 = replace(
        tp, gather_fwd=np.array(0.3), gather_bwd=np.array(0.4), mlp_linear=np.array(False)
    )
    attention = 0.4 + ((0.3 - 0.2) + i * 0.2) + ((0.6 - 0.2) + i * 0.2)
    assert one(C.tp_exposed_parts(X, fp8, block)[1]) == pytest.approx(attention + 1.0)
    X.sp = np.array([False])  # the input gradient's all-reduce (1 s) beside the wgrad GEMM
    _, bwd, _ = C.tp_exposed_parts(X, tp, block)
    assert one(bwd) == pytest.approx((1.0 - 0.2 + i * 0.2) + i * 1.0)
    X.sw.framework = load_framework("torchtitan")  # DTensor's backward: all of them show
    assert one(C.tp_exposed_parts(X, tp, block)[1]) == 2.0
