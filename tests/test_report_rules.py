"""The checklist's context-parallelism, FP8 and hybrid-sharding rules on real plans: each fires where
the practice says it should and not elsewhere, and the numbers in its finding are planner.estimate's
for the changed configuration (the one cost model), never typed in."""

import copy
import dataclasses

import pytest

from hardware_profiles import load_profile
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.report import backend, checklist
from planner.report.build import Scenario, rule_context
from planner.run_options import RunOptions

GB = 1e9
GiB = 2**30


def _context(model: str, hw_name: str, cfg: ParallelConfig):
    """The report's own RuleContext (planner.report.build.rule_context) for this plan."""
    hw = load_profile(hw_name)
    spec = backend.resolve(model, cfg.seq)
    doc = backend.estimate_document(spec, hw, cfg, gpus=cfg.world_size)
    return rule_context(
        spec, hw, doc, Scenario(model=model, hardware=hw_name, gpus=cfg.world_size, seq=cfg.seq)
    )


def _est(model: str, hw_name: str, cfg: ParallelConfig):
    return estimate(model, hw_name, cfg, gpus=cfg.world_size)


def _change(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.1f}%"


def _gb(x: float) -> str:
    return f"{x / GiB:.1f} GiB"


# --- context parallelism -----------------------------------------------------------------------------

LONG = ParallelConfig(dp=64, seq=196608, global_batch=64, zero=1, recompute="full")
"""192k tokens: with the profile's bf16 gradients only cp=8 fits Llama 3 8B on 64 H100s (cp=4 needs
79.4 GiB)."""
LONG_TP = ParallelConfig(
    dp=8, tp=8, sequence_parallel=True, seq=131072, global_batch=64, zero=1, recompute="full"
)
SHORT = ParallelConfig(dp=64, seq=2048, global_batch=512, zero=1)
FP8_PLAN = ParallelConfig(dp=8, seq=2048, global_batch=32, zero=1, recompute="full")


def _with_cp(cfg: ParallelConfig, cp: int, **changes) -> ParallelConfig:
    return dataclasses.replace(cfg, cp=cp, dp=cfg.dp * cfg.cp // cp, placement="DPCT", **changes)


def test_cp_fires_at_192k_tokens_where_only_cp_makes_the_plan_fit():
    ctx = _context("llama3-8b", "p5.48xlarge", LONG)
    r = checklist.context_parallel(ctx)
    plan = _est("llama3-8b", "p5.48xlarge", LONG)
    assert not plan.fits
    mem = plan.memory()
    seq_bytes = mem["activations_bytes"] + mem["other_bytes"]
    assert (
        f"activations + working buffers {_gb(seq_bytes)} = {100 * seq_bytes / mem['peak_bytes_per_gpu']:.1f}%"
        in r.number
    )
    for cp in (2, 4, 8):  # the what-ifs are estimate() at that cp, dp x cp kept
        other = _est("llama3-8b", "p5.48xlarge", _with_cp(LONG, cp))
        assert (
            f"cp={cp}: peak {_gb(other.peak_bytes_per_gpu)} "
            f"({(other.peak_bytes_per_gpu - plan.peak_bytes_per_gpu) / GiB:+.1f} GiB/GPU"
        ) in r.number
        assert f"step {_change(other.step_time_s, plan.step_time_s)}" in r.number
        assert f"exposed KV exchange {other.time_breakdown_s()['cp_comm']:.3g} s" in r.number
    cp8 = _est("llama3-8b", "p5.48xlarge", _with_cp(LONG, 8))
    assert cp8.fits and not _est("llama3-8b", "p5.48xlarge", _with_cp(LONG, 4)).fits
    assert (
        r.status == "warn"
        and "cp=8 splits" in r.detail
        and f"{cp8.step_time_s:.4g} s per step" in r.detail
    )
    assert "Ring Attention" in r.source and "context" in r.source.lower()


def test_cp_pays_at_128k_tokens_by_buying_out_the_recomputation():
    ctx = _context("llama3-8b", "p5.48xlarge", LONG_TP)
    r = checklist.context_parallel(ctx)
    plan = _est("llama3-8b", "p5.48xlarge", LONG_TP)
    # the plan's own cp cannot drop the recomputation; cp=2 can, and that is faster
    assert not _est("llama3-8b", "p5.48xlarge", dataclasses.replace(LONG_TP, recompute="none")).fits
    cp2 = _est("llama3-8b", "p5.48xlarge", _with_cp(LONG_TP, 2, recompute="none"))
    assert cp2.fits and cp2.step_time_s < checklist.AS_FAST_FRACTION * plan.step_time_s
    assert r.status == "advice"
    assert f"cp=2 with recompute none: peak {_gb(cp2.peak_bytes_per_gpu)}" in r.number
    assert f"{100 * (1 - cp2.step_time_s / plan.step_time_s):.1f}% faster" in r.detail


MID = ParallelConfig(dp=16, tp=4, sequence_parallel=True, seq=32768, global_batch=64, zero=1)


def test_cp_is_advised_where_activations_dominate_and_cp_costs_little():
    ctx = _context("llama3-8b", "p5.48xlarge", MID)
    r = checklist.context_parallel(ctx)
    plan, cp2 = (
        _est("llama3-8b", "p5.48xlarge", MID),
        _est("llama3-8b", "p5.48xlarge", _with_cp(MID, 2)),
    )
    mem = plan.memory()
    share = (mem["activations_bytes"] + mem["other_bytes"]) / mem["peak_bytes_per_gpu"]
    assert plan.fits and share >= checklist.ACTIVATION_DOMINANT_FRACTION
    assert (
        cp2.fits
        and plan.step_time_s <= cp2.step_time_s <= plan.step_time_s / checklist.AS_FAST_FRACTION
    )
    assert r.status == "advice" and r.detail.startswith("Activations dominate the memory")
    assert f"cp=2 frees {_gb(plan.peak_bytes_per_gpu - cp2.peak_bytes_per_gpu)} per GPU" in r.detail
    assert f"{100 * (cp2.step_time_s / plan.step_time_s - 1):.1f}% slower steps" in r.detail


def test_cp_advice_names_the_degree_that_frees_the_most_memory_within_the_as_fast_band():
    ctx = _context("llama3-8b", "p5.48xlarge", MID)
    step = ctx.document["prediction"]["step_time_s"]

    def what_if(hardware_changes=None, **changes):
        doc = ctx.what_if(hardware_changes, **changes)
        if doc is not None and changes.get("cp", 1) > 1:  # every higher degree as fast as the plan
            doc = dict(
                doc,
                prediction=dict(
                    doc["prediction"],
                    step_time_s=step,
                    tokens_per_s=ctx.document["prediction"]["tokens_per_s"],
                ),
            )
        return doc

    r = checklist.context_parallel(dataclasses.replace(ctx, what_if=what_if))
    cp8 = _est("llama3-8b", "p5.48xlarge", _with_cp(MID, 8))
    assert (
        r.status == "advice"
        and f"cp=8 frees {_gb(ctx.document['prediction']['memory']['peak_bytes_per_gpu'] - cp8.peak_bytes_per_gpu)}"
        in r.detail
    )


def test_cp_is_not_advised_when_recomputation_keeps_the_activations_small():
    # the same plan with full recomputation: cp=2 still costs little, but activations no longer dominate
    cfg = dataclasses.replace(MID, recompute="full")
    r = checklist.context_parallel(_context("llama3-8b", "p5.48xlarge", cfg))
    plan, cp2 = (
        _est("llama3-8b", "p5.48xlarge", cfg),
        _est("llama3-8b", "p5.48xlarge", _with_cp(cfg, 2)),
    )
    mem = plan.memory()
    assert (mem["activations_bytes"] + mem["other_bytes"]) / mem[
        "peak_bytes_per_gpu"
    ] < checklist.ACTIVATION_DOMINANT_FRACTION
    assert cp2.fits and cp2.step_time_s <= plan.step_time_s / checklist.AS_FAST_FRACTION
    assert r.status == "pass" and r.detail.startswith("Not worth it at 32,768 tokens")


def test_dominant_activations_alone_do_not_make_cp_pay():
    # llama3-8b at 8k tokens on one p5 (the committed example's plan): activations are most of the peak,
    # but the plan fits and cp=2 costs more than 2% per step
    cfg = ParallelConfig(dp=8, seq=8192, global_batch=512, zero=3)
    r = checklist.context_parallel(_context("llama3-8b", "p5.48xlarge", cfg))
    plan, cp2 = (
        _est("llama3-8b", "p5.48xlarge", cfg),
        _est("llama3-8b", "p5.48xlarge", _with_cp(cfg, 2)),
    )
    assert plan.fits and cp2.step_time_s > plan.step_time_s / checklist.AS_FAST_FRACTION
    assert (
        r.status == "pass"
        and r.detail.startswith("Activations dominate")
        and "CP costs more than it saves" in r.detail
    )
    assert f"cp=2 is {100 * (cp2.step_time_s / plan.step_time_s - 1):.1f}% slower" in r.detail


def test_cp_takes_no_credit_for_dropping_recomputation_the_plan_can_drop_alone():
    # llama3-8b at 2k tokens fits without recomputation at cp=1: a faster 'cp=2 without recompute' is
    # the recomputation's doing, not context parallelism's
    assert _est("llama3-8b", "p5.48xlarge", dataclasses.replace(FP8_PLAN, recompute="none")).fits
    r = checklist.context_parallel(_context("llama3-8b", "p5.48xlarge", FP8_PLAN))
    assert r.status == "pass" and "with recompute" not in r.number + r.detail


def test_cp_does_not_pay_at_2k_tokens_and_says_where_the_time_goes():
    ctx = _context("llama3-8b", "p5.48xlarge", SHORT)
    r = checklist.context_parallel(ctx)
    plan = _est("llama3-8b", "p5.48xlarge", SHORT)
    cp2 = _est("llama3-8b", "p5.48xlarge", _with_cp(SHORT, 2))
    assert (
        cp2.step_time_s > plan.step_time_s and cp2.time_breakdown_s()["cp_comm"] > 0
    )  # the ring shows
    assert r.status == "pass" and r.detail.startswith("Not worth it at 2,048 tokens")
    assert (
        f"only {100 * (plan.memory()['activations_bytes'] + plan.memory()['other_bytes']) / plan.peak_bytes_per_gpu:.1f}% of the peak"
        in r.detail
    )
    assert f"cp=2 is {100 * (cp2.step_time_s / plan.step_time_s - 1):.1f}% slower" in r.detail
    assert f"cp_comm +{cp2.time_breakdown_s()['cp_comm']:.3g} s" in r.detail
    assert f"save {_gb(plan.peak_bytes_per_gpu - cp2.peak_bytes_per_gpu)} per GPU" in r.detail


def test_a_short_sequence_plan_that_uses_cp_is_warned_off_it():
    cfg = _with_cp(SHORT, 2)
    r = checklist.context_parallel(_context("llama3-8b", "p5.48xlarge", cfg))
    plan, cp1 = _est("llama3-8b", "p5.48xlarge", cfg), _est("llama3-8b", "p5.48xlarge", SHORT)
    assert r.status == "warn" and "does not pay at 2,048 tokens" in r.detail
    assert (
        f"cp=1 fits and is {100 * (1 - cp1.step_time_s / plan.step_time_s):.1f}% faster" in r.detail
    )
    assert f"cp=2 exposes {plan.time_breakdown_s()['cp_comm']:.3g} s of KV exchange" in r.number


def test_cp_a_sequence_cannot_take_says_why_in_one_line():
    # 1022 tokens cannot be cut into 2 cp chunks of equal length for any cp (Megatron's load-balanced split)
    cfg = ParallelConfig(dp=8, seq=1022, global_batch=16, zero=1)
    r = checklist.context_parallel(_context("gpt2", "p5.48xlarge", cfg))
    assert r.status == "pass" and "cp=2: " in r.number and "divisible by 2*cp" in r.number
    assert "No other context-parallel degree is a valid configuration" in r.detail


def test_cp_on_a_stack_without_it_says_why_in_one_line():
    cfg = dataclasses.replace(SHORT, zero=3, framework="fsdp")
    r = checklist.context_parallel(_context("llama3-8b", "p5.48xlarge", cfg))
    assert r.status == "pass" and r.number == "fsdp has no context parallelism (cp_comm: none)"
    assert "stacks with CP: deepspeed, megatron, torchtitan" in r.detail


def test_cp_changes_keep_the_gpus_and_put_c_just_outside_t():
    plan = {"dp": 16, "cp": 2, "placement": "PDCT", "cp_comm": "all_gather", "dp_shard": 8}
    assert checklist.cp_changes(plan, 8, ("p2p", "all_gather")) == {
        "cp": 8,
        "dp": 4,
        "placement": "PDCT",
        "cp_comm": "all_gather",
        "dp_shard": 0,
    }
    assert (
        checklist.cp_changes({"dp": 6, "placement": "DPT"}, 4, ("a2a",)) is None
    )  # 6 ranks, not 4k
    assert checklist.cp_changes({"dp": 8, "placement": "DPT"}, 2, ("a2a",))["placement"] == "DPCT"


# --- FP8 -----------------------------------------------------------------------------------------------


def test_fp8_does_not_apply_on_a100_and_says_so():
    r = checklist.fp8_gemms(_context("llama3-8b", "p4d.24xlarge", FP8_PLAN))
    assert "fp8" not in load_profile("p4d.24xlarge").peak_tflops
    assert r.status == "pass" and "no FP8 peak" in r.number and "Not applicable" in r.detail


def test_fp8_pays_on_h100_for_a_gemm_bound_8b_model_with_estimates_numbers():
    r = checklist.fp8_gemms(_context("llama3-8b", "p5.48xlarge", FP8_PLAN))
    bf16 = _est("llama3-8b", "p5.48xlarge", FP8_PLAN)
    fp8 = _est("llama3-8b", "p5.48xlarge", dataclasses.replace(FP8_PLAN, precision="fp8"))
    assert fp8.fits and fp8.step_time_s < (1 - checklist.FP8_MIN_GAIN) * bf16.step_time_s
    assert r.status == "advice"
    assert (
        f"step {bf16.step_time_s:.4g} s at amp-bf16 vs {fp8.step_time_s:.4g} s at fp8 "
        f"({_change(fp8.step_time_s, bf16.step_time_s)}"
    ) in r.number
    assert (
        f"peak memory {_gb(bf16.peak_bytes_per_gpu)} vs {_gb(fp8.peak_bytes_per_gpu)}" in r.number
    )
    # megatron.json's fp8_cast_bytes_per_element under its default recipe
    assert "casts 4 bytes per GEMM operand element (megatron, tensorwise)" in r.number
    assert (
        "linear GEMMs 92.9% of a block's FLOPs at seq 2,048, hidden 4096" in r.number
    )  # 4 x 4096^2 x (..)
    assert "Micikevicius" in r.source and "Transformer Engine" in r.source


def test_fp8_does_not_pay_for_a_small_host_bound_model():
    cfg = ParallelConfig(dp=8, seq=1024, global_batch=64, zero=1)
    r = checklist.fp8_gemms(_context("gpt2", "p5.48xlarge", cfg))
    bf16 = _est("gpt2", "p5.48xlarge", cfg)
    fp8 = _est("gpt2", "p5.48xlarge", dataclasses.replace(cfg, precision="fp8"))
    assert 1 - fp8.step_time_s / bf16.step_time_s < checklist.FP8_MIN_GAIN
    host = bf16.time_breakdown_s()["host_wait"] / bf16.step_time_s
    assert r.status == "pass" and "does not pay" in r.detail
    assert f"kernel launches ({100 * host:.1f}% of it)" in r.detail and "hidden 768" in r.number


def test_fp8_is_not_advised_for_a_plan_that_does_not_fit_at_bf16():
    r = checklist.fp8_gemms(_context("llama3-8b", "p5.48xlarge", LONG))
    assert not _est("llama3-8b", "p5.48xlarge", LONG).fits
    assert r.status == "pass" and r.detail.startswith("The plan does not fit at amp-bf16")


def test_an_fp8_plan_that_gains_little_is_advised_back_to_bf16_and_one_that_pays_passes():
    small = ParallelConfig(dp=8, seq=1024, global_batch=64, zero=1, precision="fp8")
    assert checklist.fp8_gemms(_context("gpt2", "p5.48xlarge", small)).status == "advice"
    big = dataclasses.replace(FP8_PLAN, precision="fp8")
    r = checklist.fp8_gemms(_context("llama3-8b", "p5.48xlarge", big))
    assert r.status == "pass" and "FP8 pays here" in r.detail


def test_an_fp8_plan_slower_than_bf16_is_warned():
    ctx = _context("llama3-8b", "p5.48xlarge", dataclasses.replace(FP8_PLAN, precision="fp8"))
    slower = copy.deepcopy(dict(ctx.document))
    bf16 = ctx.what_if(precision="amp-bf16")
    slower["prediction"] = dict(
        slower["prediction"], step_time_s=1.5 * bf16["prediction"]["step_time_s"]
    )
    r = checklist.fp8_gemms(dataclasses.replace(ctx, document=slower))
    assert r.status == "warn" and "slower than amp-bf16" in r.detail


def test_fp8_on_a_stack_without_an_fp8_recipe_says_why():
    from frameworks import load_framework

    assert "fp8" not in load_framework("deepspeed").capabilities.precisions
    r = checklist.fp8_gemms(
        _context("llama3-8b", "p5.48xlarge", dataclasses.replace(FP8_PLAN, framework="deepspeed"))
    )
    assert r.status == "pass" and r.number.startswith("deepspeed has no FP8 recipe")
    assert "stacks with FP8 GEMMs: fsdp, megatron, torchtitan" in r.detail  # from frameworks/*.json


# --- hybrid sharding -------------------------------------------------------------------------------------


def _zero1(nodes: int, **changes) -> ParallelConfig:
    return ParallelConfig(
        dp=8 * nodes, seq=4096, global_batch=16 * nodes, zero=1, recompute="full", **changes
    )


def test_hsdp_does_not_pay_on_64_nodes_where_the_gather_hides_under_the_forward():
    # One 1k-token sequence per GPU: little compute to hide the collectives under. The stack's
    # schedule decides (issue 32): Megatron-Core's distributed optimizer with several instances
    # all-reduces each bucket's shard over the instances right after its reduce-scatter, on the
    # same asynchronous path under the backward (param_and_grad_buffer.py start_grad_sync, "With
    # multiple DistOpt instances, we need to all-reduce across instances"; FSDP's HYBRID_SHARD
    # the same in its post-backward stream), and gathers only inside the instance. Full sharding
    # sends the same bytes across nodes, (n-1)/n of a shard each way, but half as the parameter
    # all-gather, which --overlap-param-gather runs under the next forward. So HSDP carries
    # twice the cross-node bytes in the backward and does not pay, and the rule says so.
    cfg = dataclasses.replace(_zero1(64), seq=1024, global_batch=512)
    r = checklist.hybrid_sharding(_context("llama3-8b", "p5.48xlarge", cfg))
    full = _est("llama3-8b", "p5.48xlarge", cfg)
    hybrid = _est("llama3-8b", "p5.48xlarge", dataclasses.replace(cfg, dp_shard=8))
    assert full.scores.step.sw.overlap_param_gather
    dp_comm = (hybrid.time_breakdown_s()["dp_comm"], full.time_breakdown_s()["dp_comm"])
    # the exposed reduction is about the same (bf16 gradients: 0.070 s vs 0.071 s); the bytes HSDP
    # adds under the backward slow the compute they share the GPU with (overlap_interference)
    assert dp_comm[0] == pytest.approx(dp_comm[1], rel=0.05)
    assert hybrid.step_time_s > full.step_time_s
    assert hybrid.step_time_s > checklist.AS_FAST_FRACTION * full.step_time_s
    assert r.status == "pass" and "costs no more time" in r.detail
    assert (
        f"exposed DP communication {dp_comm[0]:.3g} s with dp_shard=8 vs "
        f"{dp_comm[1]:.3g} s fully sharded, step "
        f"{_change(hybrid.step_time_s, full.step_time_s)}"
    ) in r.number
    assert "dp=512 over 64 NVLink domains of 8 devices" in r.number
    assert "HYBRID_SHARD" in r.source and "Zhao et al. 2023" in r.source


def test_hsdp_does_not_pay_on_2_nodes():
    cfg = _zero1(2)
    r = checklist.hybrid_sharding(_context("llama3-8b", "p5.48xlarge", cfg))
    full = _est("llama3-8b", "p5.48xlarge", cfg)
    hybrid = _est("llama3-8b", "p5.48xlarge", dataclasses.replace(cfg, dp_shard=8))
    assert hybrid.step_time_s > checklist.AS_FAST_FRACTION * full.step_time_s
    assert r.status == "pass" and "costs no more time" in r.detail
    assert f"step {_change(hybrid.step_time_s, full.step_time_s)}" in r.number


def test_a_plan_already_sharded_inside_the_domain_passes():
    r = checklist.hybrid_sharding(_context("llama3-8b", "p5.48xlarge", _zero1(64, dp_shard=8)))
    assert r.status == "pass" and "shards inside the NVLink domain (dp_shard=8)" in r.detail


@pytest.mark.parametrize(
    "cfg,words",
    [
        (
            ParallelConfig(dp=16, seq=4096, global_batch=32, zero=0, recompute="full"),
            "no sharded states",
        ),
        (
            ParallelConfig(dp=8, seq=4096, global_batch=16, zero=1, recompute="full"),
            "inside one NVLink domain",
        ),
        (
            ParallelConfig(dp=16, tp=8, sequence_parallel=True, seq=4096, global_batch=32, zero=1),
            "1 data-parallel rank",
        ),
    ],
)
def test_hsdp_says_why_it_does_not_apply(cfg, words):
    r = checklist.hybrid_sharding(_context("llama3-8b", "p5.48xlarge", cfg))
    assert r.status == "pass" and words in r.number


def test_the_shard_group_is_the_nvlink_domain_not_the_node():
    # p6e-gb200.36xlarge: 4 GPUs per instance, 72 in one NVLink domain (UltraServer)
    hw = load_profile("p6e-gb200.36xlarge")
    assert (hw.devices_per_node, hw.nvlink_domain_devices) == (4, 72)
    assert checklist.nvlink_shard_group({"dp": 144, "tp": 1, "pp": 1, "placement": "DPT"}, 72) == 72
    assert checklist.nvlink_shard_group({"dp": 144, "tp": 2, "pp": 1, "placement": "DPT"}, 72) == 36
    cfg = ParallelConfig(dp=144, seq=4096, global_batch=288, zero=1, recompute="full")
    r = checklist.hybrid_sharding(_context("llama3-8b", "p6e-gb200.36xlarge", cfg))
    assert "dp_shard=72" in r.number and "over 2 NVLink domains of 72 devices" in r.number


# --- the checklist as a whole -------------------------------------------------------------------------------


def test_every_rule_carries_a_source_and_the_new_rules_are_in_the_checklist():
    results = checklist.evaluate(_context("llama3-8b", "p5.48xlarge", SHORT))
    assert {"context-parallel", "fp8", "hybrid-sharding"} <= {r.rule for r in results}
    assert all(r.source and r.status in checklist.STATUSES for r in results)
    assert set(checklist.SOURCES) == {r.rule for r in results}


def test_tp_group_nodes_counts_a_context_parallel_layout():
    # C sits between T and the outer axes: tp=8 inside a node stays there with cp=2 around it
    plan = {"dp": 2, "pp": 1, "tp": 8, "cp": 2, "placement": "DPCT"}
    assert checklist.tp_group_nodes(plan, 8) == 1
    assert checklist.tp_group_nodes(dict(plan, tp=4, placement="CTDP"), 8) == 1
    assert (
        checklist.tp_group_nodes(dict(plan, dp=8, tp=2, placement="CTDP"), 8) == 2
    )  # T stride dp x pp = 8


# --- what-ifs keep the plan's run options ----------------------------------------------------------


def test_what_ifs_run_with_the_plans_own_options():
    """A what-if changes the plan's configuration, not how the run is set up: a plan that runs
    Megatron's TP communication overlap (off by default) is estimated again with it on."""
    cfg = ParallelConfig(dp=8, tp=8, sequence_parallel=True, seq=8192, global_batch=64, zero=1)
    overlap = RunOptions(tp_comm_overlap=True)
    hw = load_profile("p5.48xlarge")
    spec = backend.resolve("llama3-8b", cfg.seq)
    doc = estimate(spec, hw, cfg, gpus=cfg.world_size, options=overlap).to_document()
    scenario = Scenario(model="llama3-8b", hardware="p5.48xlarge", gpus=64, seq=cfg.seq)
    ctx = rule_context(spec, hw, doc, scenario)
    changed = dataclasses.replace(cfg, recompute="selective")
    with_it = estimate(spec, hw, changed, gpus=64, options=overlap).step_time_s
    without = estimate(spec, hw, changed, gpus=64).step_time_s
    assert with_it < without  # the option matters here
    assert ctx.what_if(recompute="selective")["prediction"]["step_time_s"] == pytest.approx(
        with_it, rel=1e-12
    )


def test_what_ifs_keep_a_gradient_dtype_the_plan_chose():
    """Megatron-LM's own --bf16 keeps fp32 gradients where the megatron profile keeps bf16: a plan
    that says so (software.grad_reduce_bytes 4) is estimated again with them, as its file says."""
    cfg = ParallelConfig(dp=8, seq=4096, global_batch=8, zero=0)
    fp32 = RunOptions(grad_reduce_dtype="fp32")
    hw = load_profile("dgx-h100")
    spec = backend.resolve("llama2-7b", cfg.seq)
    doc = estimate(spec, hw, cfg, gpus=8, options=fp32).to_document()
    assert doc["software"]["grad_reduce_bytes"] == 4
    ctx = rule_context(spec, hw, doc, Scenario(model="llama2-7b", hardware="dgx-h100", gpus=8))
    changed = dataclasses.replace(cfg, recompute="full")
    expected = estimate(spec, hw, changed, gpus=8, options=fp32)
    assert expected.peak_bytes_per_gpu > estimate(spec, hw, changed, gpus=8).peak_bytes_per_gpu
    what_if = ctx.what_if(recompute="full")["prediction"]
    assert what_if["memory"]["peak_bytes_per_gpu"] == expected.peak_bytes_per_gpu
    assert what_if["step_time_s"] == pytest.approx(expected.step_time_s, rel=1e-12)
