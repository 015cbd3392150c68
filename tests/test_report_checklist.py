"""Checklist rules on hand-made plan documents: each verdict flips where the advice says it should."""

import copy

import pytest

from hardware_profiles import HardwareProfile
from planner.report import checklist
from planner.report.checklist import RuleContext

HW = HardwareProfile(
    name="test-node",
    device="TestGPU",
    devices_per_node=8,
    memory_bytes=40 * 10**9,
    memory_bandwidth_GBps=1500.0,
    peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0},
    intra_node_GBps_per_device=300.0,
    intra_node_latency_us=5.0,
    inter_node_Gbps_per_node=400.0,
    inter_node_latency_us=10.0,
    host_device_GBps=25.0,
    price_usd_per_hour=32.0,
    spot_price_usd_per_hour=None,
)


def _doc(
    *,
    dp=4,
    tp=2,
    pp=2,
    m=8,
    zero=0,
    precision="amp-bf16",
    peak=30e9,
    nodes=2,
    bubble=0.5,
    tp_comm=0.3,
    dp_comm=0.2,
    p2p=0.1,
    placement="DPT",
):
    step = 10.0
    return {
        "model": {"name": "fake", "params": 10**9},
        "hardware": {"name": "test-node", "gpus": dp * tp * pp, "nodes": nodes},
        "plan": {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "micro_batch": 1,
            "global_batch": dp * m,
            "num_microbatches": m,
            "schedule": "1f1b",
            "virtual_stages": 1,
            "zero": zero,
            "recompute": "none",
            "offload": "none",
            "sequence_parallel": False,
            "placement": placement,
            "precision": precision,
            "seq": 2048,
            "stages": [],
        },
        "prediction": {
            "step_time_s": step,
            "samples_per_s": dp * m / step,
            "tokens_per_s": dp * m * 2048 / step,
            "tflops_per_gpu": 100.0,
            "mfu": 0.3,
            "memory": {
                "peak_bytes_per_gpu": int(peak),
                "capacity_bytes": 40 * 10**9,
                "fits": peak <= 40e9,
                "params_bytes": 1,
                "grads_bytes": 1,
                "optimizer_bytes": int(8e9),
                "activations_bytes": 1,
                "other_bytes": 1,
            },
            "time_breakdown_s": {
                "compute": step - bubble - tp_comm - dp_comm - p2p,
                "tp_comm": tp_comm,
                "dp_comm": dp_comm,
                "pp_p2p": p2p,
                "bubble": bubble,
            },
        },
    }


def _ctx(doc, *, bn=0, what_if=None, hw=HW):
    return RuleContext(
        document=doc,
        hardware=hw,
        batchnorm_modules=bn,
        what_if=what_if or (lambda **_: None),
        train_tokens=300e9,
        tp_group_nodes=checklist.tp_group_nodes(doc["plan"], hw.devices_per_node),
    )


def _by_rule(results):
    return {r.rule: r for r in results}


def test_every_rule_is_evaluated_once_with_a_number():
    results = checklist.evaluate(_ctx(_doc()))
    assert len(results) == len(checklist.RULES) == 14
    assert len({r.rule for r in results}) == len(results)
    assert all(r.status in ("pass", "advice", "warn") and r.number and r.source for r in results)


def test_batchnorm_warns_only_when_present():
    assert _by_rule(checklist.evaluate(_ctx(_doc(), bn=3)))["batchnorm"].status == "warn"
    assert "3 BatchNorm" in _by_rule(checklist.evaluate(_ctx(_doc(), bn=3)))["batchnorm"].number
    assert _by_rule(checklist.evaluate(_ctx(_doc(), bn=0)))["batchnorm"].status == "pass"


def test_fewer_microbatches_than_stages_warns_with_the_bubble_share():
    r = checklist.microbatches_vs_stages(_ctx(_doc(pp=4, m=2, bubble=3.0)))
    assert r.status == "warn" and "30.0%" in r.number
    assert checklist.microbatches_vs_stages(_ctx(_doc(pp=4, m=8))).status == "pass"


@pytest.mark.parametrize(
    "tp,placement,nodes_spanned", [(8, "DPT", 1), (16, "DPT", 2), (2, "TPD", 2), (2, "DTP", 1)]
)
def test_tp_group_node_span_follows_the_placement(tp, placement, nodes_spanned):
    doc = _doc(dp=4, tp=tp, pp=2, placement=placement)
    assert checklist.tp_group_nodes(doc["plan"], 8) == nodes_spanned
    r = checklist.tp_inside_node(_ctx(doc))
    assert r.status == ("pass" if nodes_spanned == 1 else "warn")
    if nodes_spanned > 1:
        assert "6.2 GB/s/device" in r.number  # 400 Gbit/s / 8 bits / 8 devices


def test_memory_bound_plan_without_zero_warns_and_shows_the_what_if():
    doc = _doc(zero=0, peak=39e9)
    z1 = copy.deepcopy(doc)
    z1["prediction"]["memory"]["peak_bytes_per_gpu"] = int(33e9)
    r = checklist.shard_optimizer(_ctx(doc, what_if=lambda **ch: z1 if ch == {"zero": 1} else None))
    assert r.status == "warn" and f"ZeRO-1 peak {33e9 / 2**30:.1f} GiB" in r.number
    assert checklist.shard_optimizer(_ctx(_doc(zero=1, peak=39e9))).status == "pass"
    assert checklist.shard_optimizer(_ctx(_doc(zero=0, peak=10e9))).status == "pass"


def test_fp32_warns_with_the_amp_speedup():
    doc = _doc(precision="fp32")
    amp = copy.deepcopy(doc)
    amp["prediction"]["step_time_s"] = 4.0
    r = checklist.mixed_precision(_ctx(doc, what_if=lambda **ch: amp))
    assert r.status == "warn" and "2.50x faster" in r.number
    assert checklist.mixed_precision(_ctx(_doc())).status == "pass"


def test_pure_dp_that_fits_and_is_as_fast_warns():
    doc = _doc()
    dp = copy.deepcopy(doc)
    dp["plan"].update(dp=16, tp=1, pp=1)
    r = checklist.data_parallel_first(_ctx(doc, what_if=lambda **ch: dp))
    assert r.status == "warn"
    dp["prediction"]["memory"]["fits"] = False
    assert checklist.data_parallel_first(_ctx(doc, what_if=lambda **ch: dp)).status == "pass"


def test_nodes_close_uses_the_bandwidth_sensitivity():
    doc = _doc(nodes=4, dp_comm=0.1, p2p=0.05)
    slow = copy.deepcopy(doc)
    slow["prediction"]["step_time_s"] = 12.0
    r = checklist.nodes_close_together(
        _ctx(doc, what_if=lambda **ch: slow if "hardware_changes" in ch else None)
    )
    assert r.status == "warn" and "+20.0%" in r.number
    assert checklist.nodes_close_together(_ctx(_doc(nodes=1))).status == "pass"


def test_spot_rule_quotes_the_run_cost():
    r = checklist.spot_capacity(_ctx(_doc(nodes=2)))
    # 300e9 tokens / (32 x 2048 tokens per step) -> 4,577,638 steps x 10 s = 12,715.7 h; x 2 nodes x $32
    assert r.status == "warn" and "$813,802 on-demand" in r.number and "529.8 days" in r.number
    assert "90.0% less (as low as $81,380)" in r.number


def test_pareto_mask_equals_the_brute_force_definition():
    import numpy as np

    from planner.report.build import pareto_mask

    rng = np.random.default_rng(1)
    tok = rng.integers(0, 20, 300).astype(float)
    mem = rng.integers(0, 20, 300).astype(float)
    mask = pareto_mask(tok, mem)
    for i in range(len(tok)):
        dominated = np.any((tok >= tok[i]) & (mem <= mem[i]) & ((tok > tok[i]) | (mem < mem[i])))
        same = (tok == tok[i]) & (mem == mem[i])
        if dominated:
            assert not mask[i]
        else:  # exactly one of identical non-dominated points is kept
            assert mask[same].sum() == 1
    assert mask.any()


def test_short_pipeline_advice_offers_looped_schedules_only_when_m_allows_them():
    rule = lambda doc: _by_rule(checklist.evaluate(_ctx(doc)))["short-pipeline"]
    allowed = rule(_doc(pp=4, m=16, bubble=2.0))  # 16 % (16 // 4) == 0
    assert (
        allowed.status == "warn"
        and "interleaved/zero-bubble schedule would recover" in allowed.detail
    )
    refused = rule(_doc(pp=20, m=128, bubble=2.0, dp=1, tp=1))  # 128 % (128 // 20 = 6) != 0
    assert refused.status == "warn" and "which m=128 is not" in refused.detail


def test_pure_dp_is_also_tried_fully_sharded():
    doc = _doc(zero=0)
    plain, sharded = copy.deepcopy(doc), copy.deepcopy(doc)
    plain["prediction"]["memory"]["fits"] = False  # ZeRO-0 replicas do not fit...
    sharded["plan"].update(zero=3)  # ...ZeRO-3 (FSDP) does, as fast
    r = checklist.data_parallel_first(
        _ctx(doc, what_if=lambda **ch: sharded if ch.get("zero") == 3 else plain)
    )
    assert r.status == "warn" and "ZeRO-3 fits" in r.number
    sharded["prediction"]["memory"]["fits"] = False
    r = checklist.data_parallel_first(
        _ctx(doc, what_if=lambda **ch: sharded if ch.get("zero") == 3 else plain)
    )
    assert r.status == "pass" and "ZeRO 0 or 3" in r.detail


def test_a_plan_that_does_not_fit_never_passes_the_sharding_rule():
    r = checklist.shard_optimizer(_ctx(_doc(zero=1, peak=45e9)))  # capacity 40 GB
    assert r.status == "warn" and "does not fit even with ZeRO stage 1" in r.detail


def _with_goodput(doc, goodput, *, stall_h=1.0, restart_s=600.0, interruptions=10.0, lost_h=5.0):
    doc = copy.deepcopy(doc)
    doc["prediction"]["reliability"] = {
        "goodput": goodput,
        "expected_interruptions": interruptions,
        "time_to_train_s": 30 * 86400.0,
        "mtbf_hours": 72.0,
        "checkpoint_interval_s": 1800.0,
        "checkpoint": "blocking",
        "checkpoint_stall_s": 60.0,
        "lost_hours": lost_h,
        "checkpoint_hours": stall_h,
        "restart_s": restart_s,
        "checkpoint_read_s": 100.0,
    }
    return doc


def test_plan_for_failures_warns_below_llama3s_90_percent_and_names_the_biggest_loss():
    ok = checklist.plan_for_failures(_ctx(_with_goodput(_doc(), 0.95)))
    assert (
        ok.status == "pass" and "goodput 95.0%" in ok.number and "every 180 steps" in ok.detail
    )  # 1800 s / 10 s
    stalls = checklist.plan_for_failures(_ctx(_with_goodput(_doc(), 0.85, stall_h=50.0)))
    assert (
        stalls.status == "warn"
        and "checkpoints" in stalls.detail
        and "--checkpoint async" in stalls.detail
    )
    restarts = checklist.plan_for_failures(
        _ctx(_with_goodput(_doc(), 0.85, restart_s=3600.0, lost_h=11.0))
    )
    assert restarts.status == "warn" and "restarts" in restarts.detail
    assert (
        checklist.plan_for_failures(_ctx(_doc())).status == "pass"
    )  # no run length: nothing to say


def test_the_gpu_count_includes_context_parallel_ranks_and_pure_dp_spans_them():
    """A cp=2 plan on 32 GPUs (dp4 tp2 pp2 cp2): pure data parallelism is asked for over all 32 GPUs
    with cp=1,
    and a batch it cannot split names 32 GPUs (the checklist said 480 on a 960-GPU cp=2 job)."""
    doc = _doc()
    doc["plan"]["cp"], doc["hardware"]["gpus"] = 2, 32
    asked = []
    ctx = _ctx(doc, what_if=lambda **changes: asked.append(changes))
    result = checklist.data_parallel_first(ctx)
    assert asked and all(a["dp"] == 32 and a["cp"] == 1 for a in asked)
    assert "is not a multiple of 32 GPUs" in result.number


def test_a_context_parallel_plan_is_not_called_pure_data_parallel():
    """cp=2 with tp = pp = 1 splits every sequence: the data-parallel rules compare it with pure DP instead of
    passing it as 'pure data parallel' (the report said so of a cp=2 plan)."""
    doc = _doc(tp=1, pp=1)
    doc["plan"]["cp"] = 2
    asked = []
    checklist.data_parallel_first(_ctx(doc, what_if=lambda **changes: asked.append(changes)))
    checklist.memory_savers_first(_ctx(doc, what_if=lambda **changes: asked.append(changes)))
    assert asked and all(a["cp"] == 1 for a in asked)
    plain = _doc(tp=1, pp=1)
    assert checklist.data_parallel_first(_ctx(plain)).number == "dp=4, tp=pp=cp=1"
