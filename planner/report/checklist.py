"""The best-practice checklist: each rule of the seed documents applied to this model and plan.

A rule is a small function of a `RuleContext` returning a `RuleResult` with the number behind the
verdict and the source of the practice. Status: pass (the plan follows the practice, or it does not
apply here and the number says why), advice (a change the cost model predicts pays for this plan) or
warn (the plan goes against the practice at a cost the number shows). Every number comes from the
plan document estimate() produced, from a what-if estimate() of a changed configuration, from the
hardware profile, or from counting the model's modules; no rule computes a cost itself.

Sources of the advice:
- "Start with data parallelism; try mixed precision, smaller micro-batches, recomputation or
  shorter sequences before model parallelism": PyTorch distributed overview
  (pytorch.org/tutorials/beginner/dist_overview.html); Hugging Face "Efficient training on
  multiple GPUs" (huggingface.co/docs/transformers/perf_train_gpu_many).
- "Keep tensor parallelism inside a node": Narayanan et al. 2021 (Megatron-LM, Sec. 3.2,
  Takeaway #1).
- "At least as many micro-batches as stages, short pipelines": Huang et al. 2019 (GPipe, bubble
  (P-1)/(m+P-1)); Narayanan et al. 2021 Sec. 2.2.
- "Shard optimizer states when memory-bound": Rajbhandari et al. 2020 (ZeRO, Sec. 5).
- "Synchronise BatchNorm across devices or avoid it": torch.nn.SyncBatchNorm documentation.
- "Put nodes close together; use spot capacity with checkpoints (up to 90% cheaper)": AWS EC2
  placement groups and Spot Instances documentation (aws.amazon.com/ec2/spot).
- "Checkpoint at the interval failures call for": Young 1974, Daly 2006 (the optimum interval);
  Grattafiori et al. 2024 (Llama 3, Sec. 3.3.4: more than 90% effective training time on 16K GPUs
  through fast checkpoints and restarts). The numbers are the plan's prediction.reliability
  (planner.goodput, docs/goodput.md).
- "Split long sequences with context parallelism; not short ones": Megatron-Core / NeMo context
  parallelism docs (docs.nvidia.com/nemo-framework/user-guide/latest/longcontext/contextparallel.html);
  Liu et al. 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context" (arXiv
  2310.01889). The numbers: the plan estimated again with cp changed (cost_models.comm.cp_block_seconds).
- "FP8 GEMMs where GEMMs dominate, on FP8 hardware": NVIDIA Transformer Engine FP8 primer
  (docs.nvidia.com/deeplearning/transformer-engine, "Using FP8 with Transformer Engine"); Micikevicius
  et al. 2022, "FP8 Formats for Deep Learning" (arXiv 2209.05433). The numbers: the plan estimated
  again at fp8 / amp-bf16 (cost_models.compute: FP8 GEMM peak, the framework's fp8_cast_bytes_per_element).
- "Shard inside the NVLink domain, replicate across it (HSDP)": PyTorch FSDP docs
  (ShardingStrategy.HYBRID_SHARD, docs.pytorch.org/docs/stable/fsdp.html); Zhao et al. 2023, "PyTorch
  FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023, arXiv 2304.11277). The
  numbers: the plan estimated again with dp_shard changed (cost_models.comm.dp_comm_seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np
from frameworks import load_framework
from planner.parallel import FRAMEWORKS, LOOPED_SCHEDULES, looped_rounds, looped_rounds_ok
from planner.placement import group_locality, placement_index, strides, with_context
from cost_models import flops as FL
from cost_models.compute import cast_bytes_per_element, linear_gemm_precision
from planner.plan import fp8_scaling_of

Status = Literal["pass", "advice", "warn"]
STATUSES: tuple[Status, ...] = ("pass", "advice", "warn")
GB = 1e9
GiB = 2**30

MEMORY_BOUND_FRACTION = 0.85
"""Peak/capacity above which a plan counts as memory-bound (allocator fragmentation headroom)."""
BUBBLE_WARN_FRACTION = 0.10
"""Pipeline bubble + p2p share of the step above which the pipeline counts as too long."""
INTER_NODE_WARN_FRACTION = 0.10
"""Step-time share of exposed inter-node communication above which placement matters."""
AS_FAST_FRACTION = 0.98
"""Two plans within 2% of each other's throughput count as equally fast: a what-if that gains less is
no reason to change the plan (the checklist's one 'as fast' band)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleResult:
    rule: str
    """Stable identifier, e.g. 'tp-inside-node'."""
    title: str
    """The advice, as the seed documents give it."""
    status: Status
    number: str
    """The number behind the verdict, formatted with its unit."""
    detail: str
    """What to do about it, for this model and plan."""
    source: str = ""
    """Where the practice comes from (documentation or paper), shown beside the advice."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleContext:
    document: Mapping[str, Any]
    """The chosen plan document (estimate's `to_document()`)."""
    hardware: Any
    """The HardwareProfile."""
    batchnorm_modules: int
    """BatchNorm modules found in the model (0 for catalog transformers)."""
    what_if: Callable[..., Mapping[str, Any] | None]
    """what_if(hardware_changes=None, **config_changes) -> the plan document estimate() gives for the
    plan with those ParallelConfig fields (and HardwareProfile fields) changed, or None when the
    change is not a valid configuration."""
    train_tokens: float
    """Tokens of the whole training run (for the cost of the run)."""
    tp_group_nodes: int
    """Nodes one tensor-parallel group spans under the plan's placement."""
    why_not: Callable[..., str | None] = field(default=lambda **_: None)
    """why_not(**config_changes) -> the one-line reason what_if() gives None for those changes (the
    ConfigError's message), or None when the change is valid."""
    spec: Any = None
    """The TransformerSpec the plan was estimated for (FLOP counts); None when not known."""
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def plan(self) -> Mapping[str, Any]:
        return self.document["plan"]

    @property
    def prediction(self) -> Mapping[str, Any]:
        return self.document["prediction"]

    @property
    def step_time_s(self) -> float:
        return float(self.prediction["step_time_s"])

    def share(self, *terms: str) -> float:
        """Fraction of the step time taken by these time-breakdown terms."""
        tb = self.prediction["time_breakdown_s"]
        return sum(float(tb.get(t, 0.0)) for t in terms) / self.step_time_s


def run_seconds(doc: Mapping[str, Any], tokens: float) -> float:
    """Wall time of a run of `tokens` tokens: whole optimizer steps x the estimated step time
    (the same count recommend's `to_train` uses)."""
    plan = doc["plan"]
    steps = math.ceil(tokens / (plan["global_batch"] * plan["seq"]))
    return steps * float(doc["prediction"]["step_time_s"])


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _gb(x: float) -> str:
    """Memory in GiB, as the command line shows it."""
    return f"{x / GiB:.1f} GiB"


def _tok(doc: Mapping[str, Any]) -> float:
    return float(doc["prediction"]["tokens_per_s"])


def _peak(doc: Mapping[str, Any]) -> int:
    return int(doc["prediction"]["memory"]["peak_bytes_per_gpu"])


def _fits(doc: Mapping[str, Any]) -> bool:
    return bool(doc["prediction"]["memory"]["fits"])


def _world(plan: Mapping[str, Any]) -> int:
    """GPUs the plan uses: dp x tp x pp x cp (expert parallelism reuses these ranks)."""
    return plan["dp"] * plan["tp"] * plan["pp"] * plan.get("cp", 1)


def _pure_dp(ctx: RuleContext, **changes) -> Mapping[str, Any] | None:
    """The plan as pure data parallelism over all its GPUs (tp = pp = cp = 1)."""
    return ctx.what_if(
        dp=_world(ctx.plan),
        tp=1,
        pp=1,
        cp=1,
        virtual_stages=1,
        stages=(),
        sequence_parallel=False,
        schedule="1f1b",
        **changes,
    )


def _pure_data_parallel(plan: Mapping[str, Any]) -> bool:
    """No model parallelism: tp = pp = cp = 1 (context parallelism splits each sequence over ranks)."""
    return plan["tp"] == 1 and plan["pp"] == 1 and plan.get("cp", 1) == 1


def data_parallel_first(ctx: RuleContext) -> RuleResult:
    title = "Start with data parallelism"
    plan = ctx.plan
    if _pure_data_parallel(plan):
        return RuleResult(
            rule="data-parallel-first",
            title=title,
            status="pass",
            number=f"dp={plan['dp']}, tp=pp=cp=1",
            detail="The plan is pure data parallel (with ZeRO stage "
            f"{plan['zero']}); no model parallelism is needed.",
        )
    # pure DP at micro-batch 1 with the plan's ZeRO stage, and fully sharded (ZeRO-3, FSDP) as well:
    # the fastest variant that fits, else the leanest
    variants = [(plan["zero"], _pure_dp(ctx, micro_batch=1))]
    if plan["zero"] < 3:
        variants.append((3, _pure_dp(ctx, micro_batch=1, zero=3)))
    variants = [(z, d) for z, d in variants if d is not None]
    fitting = [(z, d) for z, d in variants if _fits(d)]
    zero, dp = (
        max(fitting, key=lambda zd: _tok(zd[1]))
        if fitting
        else min(variants, key=lambda zd: _peak(zd[1]))
        if variants
        else (plan["zero"], None)
    )
    if dp is None:
        gpus = _world(plan)
        return RuleResult(
            rule="data-parallel-first",
            title=title,
            status="pass",
            number=f"global batch {plan['global_batch']} is not a multiple of {gpus} GPUs",
            detail="Pure data parallelism cannot split this global batch evenly over every GPU; "
            "model parallelism is needed to use them all.",
        )
    if not _fits(dp):
        return RuleResult(
            rule="data-parallel-first",
            title=title,
            status="pass",
            number=f"pure DP peak {_gb(_peak(dp))} > capacity {_gb(ctx.prediction['memory']['capacity_bytes'])}",
            detail=f"Pure data parallelism (micro-batch 1, ZeRO {' or '.join(str(z) for z, _ in variants)}) "
            f"does not fit, so tp={plan['tp']}, pp={plan['pp']}, cp={plan.get('cp', 1)} is justified.",
        )
    ratio = _tok(dp) / _tok(ctx.document)
    status: Status = "warn" if ratio >= AS_FAST_FRACTION else "pass"
    return RuleResult(
        rule="data-parallel-first",
        title=title,
        status=status,
        number=f"pure DP with ZeRO-{zero} fits ({_gb(_peak(dp))}) at {_tok(dp):,.0f} tok/s = "
        f"{ratio:.2f}x the plan",
        detail=(
            "Pure data parallelism fits and is as fast: prefer it (simpler, no model changes)."
            if status == "warn"
            else "Pure data parallelism fits but is slower than this plan's model parallelism."
        ),
    )


def mixed_precision(ctx: RuleContext) -> RuleResult:
    title = "Use mixed precision"
    precision = ctx.plan["precision"]
    peaks = ctx.hardware.peak_tflops
    if precision != "fp32":
        half = peaks.get("bf16") or peaks.get("fp16") or 0.0
        full = peaks.get("tf32") or peaks.get("fp32") or 0.0
        return RuleResult(
            rule="mixed-precision",
            title=title,
            status="pass",
            number=f"{precision}: {half:g} vs fp32/tf32 {full:g} peak TFLOP/s",
            detail="The plan already computes in 16-bit.",
        )
    amp = ctx.what_if(precision="amp-bf16")
    if amp is None:
        return RuleResult(
            rule="mixed-precision",
            title=title,
            status="warn",
            number="fp32",
            detail="Train with torch.autocast(dtype=torch.bfloat16).",
        )
    return RuleResult(
        rule="mixed-precision",
        title=title,
        status="warn",
        number=f"amp-bf16: {ctx.step_time_s / float(amp['prediction']['step_time_s']):.2f}x faster, "
        f"peak {_gb(_peak(amp))} vs {_gb(_peak(ctx.document))}",
        detail="Train with torch.autocast(dtype=torch.bfloat16) (fp32 master weights).",
    )


def memory_savers_first(ctx: RuleContext) -> RuleResult:
    title = "Try smaller micro-batches, recomputation or shorter sequences before model parallelism"
    plan = ctx.plan
    if _pure_data_parallel(plan):
        return RuleResult(
            rule="memory-savers-first",
            title=title,
            status="pass",
            number=f"micro-batch {plan['micro_batch']}, recompute {plan['recompute']}",
            detail="No model parallelism in the plan.",
        )
    variants = {
        "micro-batch 1": _pure_dp(ctx, micro_batch=1),
        "micro-batch 1 + full recompute": _pure_dp(ctx, micro_batch=1, recompute="full"),
        f"micro-batch 1 + full recompute + seq {plan['seq'] // 2}": _pure_dp(
            ctx, micro_batch=1, recompute="full", seq=max(plan["seq"] // 2, 1)
        ),
    }
    tried = {k: v for k, v in variants.items() if v is not None}
    if not tried:
        gpus = _world(plan)
        return RuleResult(
            rule="memory-savers-first",
            title=title,
            status="pass",
            number=f"global batch {plan['global_batch']} is not a multiple of {gpus} GPUs",
            detail="Pure data parallelism cannot split this global batch evenly over every GPU, "
            "whatever the micro-batch; model parallelism is needed to use them all.",
        )
    name, best = min(tried.items(), key=lambda kv: _peak(kv[1]))
    if _fits(best) and _tok(best) >= AS_FAST_FRACTION * _tok(ctx.document):
        return RuleResult(
            rule="memory-savers-first",
            title=title,
            status="warn",
            number=f"pure DP with {name}: {_gb(_peak(best))}, {_tok(best):,.0f} tok/s",
            detail="Memory savers alone make pure data parallelism fit at this speed.",
        )
    verdict = "fits but is slower" if _fits(best) else "still does not fit"
    return RuleResult(
        rule="memory-savers-first",
        title=title,
        status="pass",
        number=f"pure DP with {name}: peak {_gb(_peak(best))} "
        f"(capacity {_gb(ctx.prediction['memory']['capacity_bytes'])})",
        detail=f"The leanest pure data-parallel variant {verdict}; model parallelism is justified.",
    )


def tp_inside_node(ctx: RuleContext) -> RuleResult:
    title = "Keep tensor parallelism inside a node"
    plan, hw = ctx.plan, ctx.hardware
    tp_share = ctx.share("tp_comm")
    if plan["tp"] == 1:
        return RuleResult(
            rule="tp-inside-node",
            title=title,
            status="pass",
            number="tp=1",
            detail="No tensor parallelism.",
        )
    if ctx.tp_group_nodes <= 1:
        return RuleResult(
            rule="tp-inside-node",
            title=title,
            status="pass",
            number=f"tp={plan['tp']} on {hw.intra_node_GBps_per_device:g} GB/s/device NVLink; "
            f"TP comm {_pct(tp_share)} of the step",
            detail="Each tensor-parallel group sits inside one node.",
        )
    per_device_GBps = hw.inter_node_GBps_per_node / hw.devices_per_node
    return RuleResult(
        rule="tp-inside-node",
        title=title,
        status="warn",
        number=f"TP group spans {ctx.tp_group_nodes} nodes: {per_device_GBps:.1f} GB/s/device "
        f"across nodes vs {hw.intra_node_GBps_per_device:g} GB/s inside; "
        f"TP comm {_pct(tp_share)} of the step",
        detail=f"Use tp <= {hw.devices_per_node} and put T innermost in the placement (e.g. DPT).",
    )


def microbatches_vs_stages(ctx: RuleContext) -> RuleResult:
    title = "Use at least as many micro-batches as pipeline stages"
    plan = ctx.plan
    m, pp = plan["num_microbatches"], plan["pp"]
    bubble = ctx.share("bubble")
    if pp == 1:
        return RuleResult(
            rule="microbatches-ge-stages",
            title=title,
            status="pass",
            number="pp=1",
            detail="No pipeline.",
        )
    status: Status = "pass" if m >= pp else "warn"
    return RuleResult(
        rule="microbatches-ge-stages",
        title=title,
        status=status,
        number=f"{m} micro-batches / {pp} stages; bubble {_pct(bubble)} of the step",
        detail=(
            "Enough micro-batches to fill the pipeline."
            if status == "pass"
            else f"Raise the global batch or lower the micro-batch so that m >= {pp}."
        ),
    )


def short_pipelines(ctx: RuleContext) -> RuleResult:
    title = "Keep pipelines short"
    plan = ctx.plan
    if plan["pp"] == 1:
        return RuleResult(
            rule="short-pipeline", title=title, status="pass", number="pp=1", detail="No pipeline."
        )
    idle = ctx.share("bubble", "pp_p2p")
    status: Status = "pass" if idle <= BUBBLE_WARN_FRACTION else "warn"

    m, pp = plan["num_microbatches"], plan["pp"]
    if plan["schedule"] in LOOPED_SCHEDULES:
        fix = "Fewer stages or more micro-batches would recover this time."
    elif looped_rounds_ok(m, pp):
        fix = "Fewer stages, more micro-batches or an interleaved/zero-bubble schedule would recover this time."
    else:
        fix = (
            f"Fewer stages or more micro-batches would recover this time; interleaved/zero-bubble schedules "
            f"need m a multiple of max(1, m // pp) = {int(looped_rounds(m, pp))}, which m={m} is not (change the "
            f"global batch)."
        )
    return RuleResult(
        rule="short-pipeline",
        title=title,
        status=status,
        number=f"pp={pp} ({plan['schedule']}): bubble + p2p {_pct(idle)} of the step",
        detail="The pipeline costs little." if status == "pass" else fix,
    )


def shard_optimizer(ctx: RuleContext) -> RuleResult:
    title = "Shard the optimizer state when memory-bound"
    plan, mem = ctx.plan, ctx.prediction["memory"]
    frac = (
        mem["peak_bytes_per_gpu"] / mem["capacity_bytes"] if mem["capacity_bytes"] else float("inf")
    )
    opt = f"optimizer state {_gb(mem['optimizer_bytes'])}/GPU, peak {_pct(frac)} of capacity"
    if not mem["fits"] and plan["zero"] >= 1:
        return RuleResult(
            rule="shard-optimizer",
            title=title,
            status="warn",
            number=opt,
            detail=f"The plan does not fit even with ZeRO stage {plan['zero']}: shard further "
            "(ZeRO-3), recompute, or add tensor/pipeline parallelism.",
        )
    if plan["zero"] >= 1:
        return RuleResult(
            rule="shard-optimizer",
            title=title,
            status="pass",
            number=opt,
            detail=f"ZeRO stage {plan['zero']} shards the optimizer state over dp={plan['dp']}.",
        )
    if plan["dp"] == 1:
        return RuleResult(
            rule="shard-optimizer",
            title=title,
            status="pass",
            number=opt,
            detail="dp=1: there is no data-parallel group to shard over.",
        )
    if frac <= MEMORY_BOUND_FRACTION and mem["fits"]:
        return RuleResult(
            rule="shard-optimizer",
            title=title,
            status="pass",
            number=opt,
            detail="Not memory-bound; sharding is optional.",
        )
    z1 = ctx.what_if(zero=1)
    saving = f"; ZeRO-1 peak {_gb(_peak(z1))}" if z1 is not None else ""
    return RuleResult(
        rule="shard-optimizer",
        title=title,
        status="warn",
        number=opt + saving,
        detail="Use ZeRO-1 (torch.distributed.optim.ZeroRedundancyOptimizer or FSDP2 "
        "reshard_after_forward=False).",
    )


def batchnorm(ctx: RuleContext) -> RuleResult:
    title = "Synchronise BatchNorm across devices or avoid it"
    n = ctx.batchnorm_modules
    if n == 0:
        return RuleResult(
            rule="batchnorm",
            title=title,
            status="pass",
            number="0 BatchNorm modules",
            detail="No BatchNorm: statistics do not depend on the per-device batch.",
        )
    return RuleResult(
        rule="batchnorm",
        title=title,
        status="warn",
        number=f"{n} BatchNorm modules; per-device statistics over {ctx.plan['micro_batch']} "
        f"samples of {ctx.plan['global_batch']}",
        detail="Convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) or replace "
        "them with GroupNorm/LayerNorm.",
    )


def nodes_close_together(ctx: RuleContext) -> RuleResult:
    title = "Put nodes close together"
    hw, doc = ctx.hardware, ctx.document
    nodes = doc["hardware"]["nodes"]
    if nodes <= 1:
        return RuleResult(
            rule="nodes-close",
            title=title,
            status="pass",
            number="1 node",
            detail="Single node: all traffic stays on NVLink/NVSwitch.",
        )
    slow = ctx.what_if(
        hardware_changes={"inter_node_Gbps_per_node": hw.inter_node_Gbps_per_node / 2}
    )
    exposed = ctx.share("dp_comm", "pp_p2p") + (
        ctx.share("tp_comm") if ctx.tp_group_nodes > 1 else 0.0
    )
    number = (
        f"{nodes} nodes at {hw.inter_node_Gbps_per_node:g} Gbit/s each; exposed DP/PP"
        f"{'/TP' if ctx.tp_group_nodes > 1 else ''} communication {_pct(exposed)} of the step"
    )
    sensitivity = 0.0
    if slow is not None:
        sensitivity = float(slow["prediction"]["step_time_s"]) / ctx.step_time_s - 1.0
        number += f"; half the bandwidth -> step +{_pct(sensitivity)}"
    status: Status = "warn" if max(exposed, sensitivity) > INTER_NODE_WARN_FRACTION else "pass"
    return RuleResult(
        rule="nodes-close",
        title=title,
        status=status,
        number=number,
        detail=(
            "Use a cluster placement group (one spine) with EFA/InfiniBand for these nodes."
            if status == "warn"
            else "Inter-node traffic is a small share; placement is not critical."
        ),
    )


SPOT_MAX_DISCOUNT = 0.90
"""AWS: "Spot Instances are available at up to a 90% discount compared to On-Demand prices"
(aws.amazon.com/ec2/spot); the bound used when the profile has no spot price."""


def spot_capacity(ctx: RuleContext) -> RuleResult:
    title = "Use spot capacity with checkpoints (up to 90% cheaper)"
    hw = ctx.hardware
    nodes = ctx.document["hardware"]["nodes"]
    if not hw.price_usd_per_hour:
        return RuleResult(
            rule="spot-capacity",
            title=title,
            status="pass",
            number="no price in the profile",
            detail="Not rented by the hour.",
        )
    hours = run_seconds(ctx.document, ctx.train_tokens) / 3600.0
    on_demand = hours * nodes * hw.price_usd_per_hour
    run = f"{ctx.train_tokens:.3g} tokens in {hours / 24:.1f} days on {nodes} nodes"
    if hw.spot_price_usd_per_hour:
        spot = hours * nodes * hw.spot_price_usd_per_hour
        saving = 1.0 - hw.spot_price_usd_per_hour / hw.price_usd_per_hour
        number = f"${on_demand:,.0f} on-demand vs ${spot:,.0f} spot ({_pct(saving)} less) for {run}"
    else:
        saving = SPOT_MAX_DISCOUNT
        number = (
            f"${on_demand:,.0f} on-demand for {run}; spot up to {_pct(saving)} less "
            f"(as low as ${on_demand * (1 - saving):,.0f})"
        )
    status: Status = "warn" if saving > 0.05 and hours >= 1.0 else "pass"
    return RuleResult(
        rule="spot-capacity",
        title=title,
        status=status,
        number=number,
        detail=(
            "Run on spot capacity with frequent distributed checkpoints "
            "(torch.distributed.checkpoint) and automatic restart."
            if status == "warn"
            else "The run is short or spot saves little."
        ),
    )


GOODPUT_WARN_FRACTION = 0.90
"""Goodput below which the run loses more to failures than Llama 3 405B did on 16,384 GPUs (more than
90% effective training time; Grattafiori et al. 2024, Sec. 3.3.4)."""


def plan_for_failures(ctx: RuleContext) -> RuleResult:
    title = "Checkpoint at the interval failures call for"
    rel = ctx.prediction.get("reliability")
    if not rel:
        return RuleResult(
            rule="plan-for-failures",
            title=title,
            status="pass",
            number="no run length given",
            detail="Give the run's tokens to see its expected interruptions and goodput.",
        )
    days = rel["time_to_train_s"] / 86400.0
    interval_s = rel["checkpoint_interval_s"]
    steps = max(1, round(interval_s / ctx.step_time_s))
    number = (
        f"goodput {_pct(rel['goodput'])}: {rel['expected_interruptions']:.1f} interruptions expected over "
        f"{days:.1f} days (job MTBF {rel['mtbf_hours']:.1f} h); checkpoint every {interval_s / 60:.1f} min "
        f"({rel['checkpoint']}, {rel['checkpoint_stall_s']:.1f} s each); {rel['lost_hours']:.1f} h lost to "
        f"rework and restarts"
    )
    if rel["goodput"] >= GOODPUT_WARN_FRACTION:
        return RuleResult(
            rule="plan-for-failures",
            title=title,
            status="pass",
            number=number,
            detail=f"Checkpoint every {steps} steps (plan.checkpoint_interval_s; planner export "
            f"writes it) and restart automatically.",
        )
    restarts_h = rel["expected_interruptions"] * rel["restart_s"] / 3600.0
    rework_h = max(rel["lost_hours"] - restarts_h, 0.0)
    worst = max(
        (rel["checkpoint_hours"], "checkpoints"), (restarts_h, "restarts"), (rework_h, "rework")
    )[1]
    fix = {
        "checkpoints": "save asynchronously (--checkpoint async) or to faster storage (--storage)",
        "restarts": f"restart faster ({rel['restart_s']:.0f} s each, {rel['checkpoint_read_s']:.0f} s of it "
        f"reading the checkpoint): faster storage, a sharded optimizer (ZeRO) so that replicas read "
        f"less, spare nodes kept ready",
        "rework": "make checkpoints cheaper so that they can be taken more often (async saves, faster storage)",
    }
    return RuleResult(
        rule="plan-for-failures",
        title=title,
        status="warn",
        number=number,
        detail=f"Most of the loss is {worst}: {fix[worst]}; checkpoint every {steps} steps meanwhile.",
    )


# --- today's dense-training practices: context parallelism, FP8, hybrid sharding ------------------

CP_SOURCE = (
    "Megatron-Core / NeMo context parallelism docs (docs.nvidia.com/nemo-framework/user-guide/latest/"
    "longcontext/contextparallel.html); Liu et al. 2023, Ring Attention with Blockwise Transformers "
    "(arXiv 2310.01889)"
)
FP8_SOURCE = (
    "NVIDIA Transformer Engine docs, Using FP8 with Transformer Engine (docs.nvidia.com/deeplearning/"
    "transformer-engine); Micikevicius et al. 2022, FP8 Formats for Deep Learning (arXiv 2209.05433)"
)
HSDP_SOURCE = (
    "PyTorch FSDP docs, ShardingStrategy.HYBRID_SHARD (docs.pytorch.org/docs/stable/fsdp.html); "
    "Zhao et al. 2023, PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel (VLDB 2023, "
    "arXiv 2304.11277)"
)

CP_DEGREES = (1, 2, 4, 8)
"""Context-parallel degrees estimated beside the plan's own: up to a node of 8 GPUs, where the ring
stays on NVLink (Megatron-Core and torchtitan put cp just outside tp in the rank order)."""
ACTIVATION_DOMINANT_FRACTION = 0.5
"""Activations and working buffers above half the peak: they, not the model states, set the memory."""
FP8_MIN_GAIN = 0.05
"""Step-time gain below which FP8 does not pay for its numerics (per-tensor scaling recipes and
loss-curve checks, Transformer Engine docs): above the cost model's 3.8% mean error on the published
Megatron runs (docs/cost-model.md), so a smaller predicted gain may not be real."""
HOST_BOUND_FRACTION = 0.10
"""Share of the step spent waiting on the host's kernel launches above which the step is host-bound."""


def _step(doc: Mapping[str, Any]) -> float:
    return float(doc["prediction"]["step_time_s"])


def _change(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.1f}%"


def _speed(new: float, old: float) -> str:
    """'12.3% faster' / '4.5% slower': step time `new` against `old`."""
    return f"{100 * abs(1 - new / old):.1f}% {'faster' if new < old else 'slower'}"


def _faster(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Plan a gains more than the 'as fast' band over plan b (AS_FAST_FRACTION)."""
    return _step(a) <= AS_FAST_FRACTION * _step(b)


def _breakdown(doc: Mapping[str, Any], term: str) -> float:
    return float(doc["prediction"]["time_breakdown_s"].get(term, 0.0))


def _growth(slower: Mapping[str, Any], faster: Mapping[str, Any], terms: int = 3) -> str:
    """The step-time terms that grow most from `faster` to `slower` (time_breakdown_s), e.g.
    'dp_comm +0.04 s, compute +0.011 s': where the extra time goes, in the cost model's own words."""
    a, b = slower["prediction"]["time_breakdown_s"], faster["prediction"]["time_breakdown_s"]
    grown = sorted(
        ((float(a.get(k, 0.0)) - float(b.get(k, 0.0)), k) for k in a if "_part_of_" not in k),
        reverse=True,
    )
    return ", ".join(f"{k} +{d:.3g} s" for d, k in grown[:terms] if d > 0) or "no term grows"


def _framework(ctx: RuleContext):
    return load_framework(ctx.plan.get("framework", "megatron"))


def _stacks_with(has: Callable[[Any], bool]) -> str:
    """The shipped frameworks whose capabilities pass `has` (frameworks/*.json), e.g. 'megatron, torchtitan'."""
    return (
        ", ".join(name for name in FRAMEWORKS if has(load_framework(name).capabilities)) or "none"
    )


def sequence_bytes(doc: Mapping[str, Any]) -> int:
    """Bytes of the peak that grow with the tokens a GPU holds: activations plus working buffers
    (logits, the recomputation working set, workspaces) = peak - parameters - gradients - optimizer
    states (the plan document's memory terms, cost_models.memory.ResidentBytes.peak)."""
    mem = doc["prediction"]["memory"]
    return int(mem["activations_bytes"]) + int(mem["other_bytes"])


def cp_changes(plan: Mapping[str, Any], cp: int, comms: tuple[str, ...]) -> dict[str, Any] | None:
    """The ParallelConfig changes that run the plan at context-parallel degree `cp` on the same GPUs:
    dp x cp kept (world = dp x tp x pp x cp), C placed just outside T, the plan's cp_comm when the
    framework has it (else its first), the shard group kept when it still divides dp. None when
    dp x cp is not a multiple of `cp`."""
    ranks = plan["dp"] * plan.get("cp", 1)
    if ranks % cp:
        return None
    dp = ranks // cp
    placement = plan["placement"]
    if "C" not in placement:
        placement = with_context(placement)
    comm = plan.get("cp_comm", "p2p")
    shard = plan.get("dp_shard", 0)
    return {
        "cp": cp,
        "dp": dp,
        "placement": placement,
        "cp_comm": comm if comm in comms else comms[0],
        "dp_shard": shard if shard and dp % shard == 0 else 0,
    }


def _cp_variant_text(
    cp: int, doc: Mapping[str, Any], plan_doc: Mapping[str, Any], recompute: str | None = None
) -> str:
    label = f"cp={cp}" + (f" with recompute {recompute}" if recompute else "")
    return (
        f"{label}: peak {_gb(_peak(doc))} ({(_peak(doc) - _peak(plan_doc)) / GiB:+.1f} GiB/GPU"
        f"{'' if _fits(doc) else ', does not fit'}), step {_change(_step(doc), _step(plan_doc))}, "
        f"exposed KV exchange {_breakdown(doc, 'cp_comm'):.3g} s"
    )


def _cp_variants(
    ctx: RuleContext, comms: tuple[str, ...]
) -> tuple[dict[int, Mapping[str, Any]], list[str]]:
    """The plan estimated at every other degree of CP_DEGREES (dp x cp kept), and why the invalid ones are."""
    variants: dict[int, Mapping[str, Any]] = {}
    refused: list[str] = []
    for c in CP_DEGREES:
        changes = cp_changes(ctx.plan, c, comms) if c != ctx.plan.get("cp", 1) else None
        if changes is None:
            continue
        other = ctx.what_if(**changes)
        if other is None:
            refused.append(f"cp={c}: {ctx.why_not(**changes) or 'not a valid configuration'}")
        else:
            variants[c] = other
    return variants, refused


def _cp_buys_recompute(
    ctx: RuleContext, variants: Mapping[int, Mapping[str, Any]], comms: tuple[str, ...]
) -> dict[tuple[int, str], Mapping[str, Any]]:
    """What CP's memory buys: the plan at a higher cp with less recomputation, for each lighter
    recomputation the plan's own cp cannot afford (one it can is the recomputation's doing, not CP's)."""
    cp = ctx.plan.get("cp", 1)
    out: dict[tuple[int, str], Mapping[str, Any]] = {}
    for rc in {"full": ("selective", "none"), "selective": ("none",)}.get(
        ctx.plan["recompute"], ()
    ):
        same_cp = ctx.what_if(recompute=rc)
        if same_cp is not None and _fits(same_cp):
            continue
        for c in (c for c in variants if c > cp):
            other = ctx.what_if(**cp_changes(ctx.plan, c, comms), recompute=rc)
            if other is not None:
                out[(c, rc)] = other
    return out


def context_parallel(ctx: RuleContext) -> RuleResult:
    """Context parallelism splits every sequence over cp GPUs (activations / cp), paying a key/value
    exchange that the ring hides under attention only when attention is long enough (Liu et al. 2023;
    Megatron-Core CP docs). The numbers: the plan estimated again at cp in CP_DEGREES (dp x cp kept),
    and, where the plan recomputes, at higher cp with less recomputation (_cp_buys_recompute)."""
    title = "Split long sequences with context parallelism; not short ones"
    plan, doc = ctx.plan, ctx.document
    cp, seq = plan.get("cp", 1), plan["seq"]
    fw = _framework(ctx)
    comms = tuple(fw.capabilities.cp_comm)

    def result(status: Status, number: str, detail: str) -> RuleResult:
        return RuleResult(
            rule="context-parallel",
            title=title,
            status=status,
            number=number,
            detail=detail,
            source=CP_SOURCE,
        )

    if not comms:
        return result(
            "pass",
            f"{fw.name} has no context parallelism (cp_comm: none)",
            f"Not available on this stack: long sequences need recomputation or TP with sequence "
            f"parallelism here (stacks with CP: {_stacks_with(lambda caps: caps.cp_comm)}).",
        )
    share = sequence_bytes(doc) / _peak(doc) if _peak(doc) else 0.0
    number = (
        f"seq {seq:,}: activations + working buffers {_gb(sequence_bytes(doc))} = {_pct(share)} of the "
        f"{_gb(_peak(doc))} peak"
    )
    if cp > 1:
        number += f"; cp={cp} exposes {_breakdown(doc, 'cp_comm'):.3g} s of KV exchange ({_pct(ctx.share('cp_comm'))})"
    variants, refused = _cp_variants(ctx, comms)
    if not variants:
        return result(
            "pass",
            number + (f"; {refused[0]}" if refused else ""),
            "No other context-parallel degree is a valid configuration of this plan.",
        )
    relaxed = _cp_buys_recompute(ctx, variants, comms)
    number += "; " + "; ".join(_cp_variant_text(c, d, doc) for c, d in sorted(variants.items()))
    fitting = [
        (k, d)
        for k, d in [((c, None), d) for c, d in variants.items()] + list(relaxed.items())
        if _fits(d)
    ]
    best_key, best = min(fitting, key=lambda kd: _step(kd[1])) if fitting else ((None, None), None)
    if best_key[1] is not None:
        number += "; " + _cp_variant_text(best_key[0], best, doc, best_key[1])
    how = f"cp={best_key[0]}" + (f" with recompute {best_key[1]}" if best_key[1] else "")
    if not _fits(doc):
        if best is not None and best_key[0] > cp:
            return result(
                "warn",
                number,
                f"The plan does not fit; {how} splits each sequence's activations over "
                f"{best_key[0]} GPUs and fits at {_step(best):.4g} s per step.",
            )
        return result(
            "pass",
            number,
            f"Context parallelism up to cp={max(variants)} does not make the plan fit "
            f"either: its model states, not its activations, are too large.",
        )
    if best is not None and _faster(best, doc):
        if best_key[0] < cp:
            return result(
                "warn",
                number,
                f"Context parallelism does not pay at {seq:,} tokens: {how} fits and is "
                f"{_speed(_step(best), _step(doc))}: cp={cp} costs {_growth(doc, best)} "
                f"for {_gb(_peak(best) - _peak(doc))} per GPU.",
            )
        return result(
            "advice",
            number,
            f"Use {how}: {_speed(_step(best), _step(doc))} per step at "
            f"{_gb(_peak(best))} per GPU (the plan's cp={cp} cannot afford "
            f"{'that recomputation' if best_key[1] else 'it'}).",
        )
    status, detail = _cp_not_faster(ctx, variants, share)
    return result(status, number, detail)


def _cp_not_faster(
    ctx: RuleContext, variants: Mapping[int, Mapping[str, Any]], share: float
) -> tuple[Status, str]:
    """The plan fits and no other degree is faster: advice when activations dominate and a higher cp
    frees memory within the 'as fast' band, else why CP does not pay (where its time goes)."""
    doc, cp, seq = ctx.document, ctx.plan.get("cp", 1), ctx.plan["seq"]
    roomy = [
        (c, d)
        for c, d in variants.items()
        if c > cp and _fits(d) and _tok(d) >= AS_FAST_FRACTION * _tok(doc)
    ]
    if share >= ACTIVATION_DOMINANT_FRACTION and roomy:
        c, d = max(roomy, key=lambda cd: _peak(doc) - _peak(cd[1]))
        return (
            "advice",
            f"Activations dominate the memory: cp={c} frees {_gb(_peak(doc) - _peak(d))} per GPU for "
            f"{_speed(_step(d), _step(doc))} steps, room for a larger micro-batch or less recomputation "
            f"or tensor parallelism.",
        )
    if cp > 1:
        return ("pass", f"cp={cp} pays at {seq:,} tokens: no other degree fits and is faster.")
    c, d = min(variants.items(), key=lambda cd: _step(cd[1]))
    cost = (
        f"even cp={c} is {_speed(_step(d), _step(doc))} ({_growth(d, doc)}) to save "
        f"{_gb(_peak(doc) - _peak(d))} per GPU"
    )
    if share >= ACTIVATION_DOMINANT_FRACTION:
        return (
            "pass",
            f"Activations dominate ({_pct(share)} of the peak) but the plan fits and CP costs more "
            f"than it saves at {seq:,} tokens: {cost}.",
        )
    return (
        "pass",
        f"Not worth it at {seq:,} tokens: activations are only {_pct(share)} of the peak and {cost}.",
    )


def gemm_flop_share(spec, seq: int) -> float:
    """Share of one block's forward FLOPs in the linear GEMMs (what FP8 recipes run in FP8) against the
    attention core (QK^T and AV, kept in 16 bits): cost_models.flops' counts for one sequence."""

    gemm = float(FL.block_matmul_flops_fwd(spec, 1, seq))
    core = float(FL.attention_core_flops_fwd(spec, 1, seq))
    return gemm / (gemm + core)


def fp8_gemms(ctx: RuleContext) -> RuleResult:
    """FP8 doubles the tensor-core peak of the linear GEMMs (Hopper and later) but keeps attention,
    norms and the output layer in 16 bits and pays a cast per GEMM operand (Transformer Engine docs;
    Micikevicius et al. 2022). The number: the plan estimated at fp8 and at amp-bf16."""
    title = "Use FP8 GEMMs where GEMMs dominate, on FP8 hardware"

    def result(status: Status, number: str, detail: str) -> RuleResult:
        return RuleResult(
            rule="fp8", title=title, status=status, number=number, detail=detail, source=FP8_SOURCE
        )

    unavailable = _fp8_unavailable(ctx)
    if unavailable is not None:
        return result("pass", *unavailable)
    precision = ctx.plan["precision"]
    base_precision, base_doc, fp8_doc, missing = _fp8_pair(ctx)
    if base_doc is None or fp8_doc is None:
        return result(
            "pass",
            f"{'amp-bf16' if precision == 'fp8' else 'fp8'} is not a valid configuration of this "
            f"plan: {missing or 'refused'}",
            "Nothing to compare.",
        )
    status, detail = _fp8_verdict(precision, base_precision, base_doc, fp8_doc)
    return result(status, _fp8_number(ctx, base_precision, base_doc, fp8_doc), detail)


def _fp8_unavailable(ctx: RuleContext) -> tuple[str, str] | None:
    """(number, detail) where FP8 does not apply: no FP8 peak on the device, or no FP8 recipe in
    the stack; None where it does."""
    hw, peaks = ctx.hardware, ctx.hardware.peak_tflops
    if not peaks.get("fp8"):
        return (
            f"{hw.device}: no FP8 peak (peak_tflops: {', '.join(peaks)})",
            "Not applicable: this device has no FP8 tensor cores (Hopper, Ada and Blackwell do); "
            "train in bf16.",
        )
    fw = _framework(ctx)
    if "fp8" not in fw.capabilities.precisions:
        return (
            f"{fw.name} has no FP8 recipe (precisions: {', '.join(fw.capabilities.precisions)})",
            f"Not available on this stack (stacks with FP8 GEMMs: "
            f"{_stacks_with(lambda caps: 'fp8' in caps.precisions)}).",
        )
    return None


def _fp8_pair(ctx: RuleContext):
    """(16-bit precision, its document, the FP8 document, why one is missing): the plan as it is
    and its twin at the other precision (amp-bf16 for an FP8 plan)."""
    precision = ctx.plan["precision"]
    if precision == "fp8":
        base_precision, fp8_doc = "amp-bf16", ctx.document
        base_doc = ctx.what_if(precision=base_precision)
        missing = None if base_doc is not None else ctx.why_not(precision=base_precision)
        return base_precision, base_doc, fp8_doc, missing
    fp8_doc = ctx.what_if(precision="fp8")
    missing = None if fp8_doc is not None else ctx.why_not(precision="fp8")
    return precision, ctx.document, fp8_doc, missing


def _fp8_number(ctx: RuleContext, base_precision: str, base_doc, fp8_doc) -> str:
    """The two steps, the peaks, the peak memories, the GEMMs' share of a block and the casts."""
    fw, peaks, plan = _framework(ctx), ctx.hardware.peak_tflops, ctx.plan
    t16, t8 = _step(base_doc), _step(fp8_doc)
    recipe = fp8_scaling_of(fp8_doc) or fw.fp8_scaling
    low = linear_gemm_precision("fp8", recipe)  # NVFP4's GEMMs run on the FP4 tensor cores
    number = (
        f"step {t16:.4g} s at {base_precision} vs {t8:.4g} s at {low} ({_change(t8, t16)}; peak "
        f"{peaks[low]:g} vs {peaks.get('bf16', 0.0):g} TFLOP/s); "
        f"peak memory {_gb(_peak(base_doc))} vs {_gb(_peak(fp8_doc))}"
    )
    if ctx.spec is not None:
        number += (
            f"; linear GEMMs {_pct(gemm_flop_share(ctx.spec, plan['seq']))} of a block's FLOPs at seq "
            f"{plan['seq']:,}, hidden {ctx.spec.hidden}"
        )
    cast = cast_bytes_per_element(fw, recipe)
    return number + f"; casts {cast:.3g} bytes per GEMM operand element ({fw.name}, {recipe})"


def _fp8_verdict(precision: str, base_precision: str, base_doc, fp8_doc) -> tuple[Status, str]:
    """(status, detail) from FP8's gain over the 16-bit step, and whether each fits."""
    t16, t8 = _step(base_doc), _step(fp8_doc)
    gain = 1.0 - t8 / t16
    host = _breakdown(base_doc, "host_wait") / t16
    why = (
        f"the step waits on the host's kernel launches ({_pct(host)} of it), which FP8 does not shorten"
        if host > HOST_BOUND_FRACTION
        else "FP8 speeds up only the linear GEMMs; attention, norms, the output layer and the casts stay at "
        "16-bit speed"
    )
    if precision == "fp8":
        if gain < 0:
            return "warn", f"FP8 is slower than {base_precision} here ({why}): train in bf16."
        if gain < FP8_MIN_GAIN:
            return (
                "advice",
                f"FP8 gains only {_pct(gain)} ({why}): {base_precision} is about as "
                f"fast without FP8's scaling recipe and loss checks.",
            )
        return "pass", f"FP8 pays here: {_pct(gain)} less time per step."
    if not _fits(base_doc):
        return (
            "pass",
            f"The plan does not fit at {precision}; FP8 keeps bf16 activations and adds "
            f"FP8 weight copies, so fix the memory first.",
        )
    if gain >= FP8_MIN_GAIN and _fits(fp8_doc):
        return (
            "advice",
            f"Train the GEMMs in FP8 (precision fp8: Transformer Engine / torchao "
            f"float8 with delayed or current scaling): {_pct(gain)} less time per "
            f"step; check the loss curve against bf16 early.",
        )
    if gain >= FP8_MIN_GAIN:
        return (
            "pass",
            f"FP8 would save {_pct(gain)} per step but its FP8 weight copies need "
            f"{_gb(_peak(fp8_doc) - _peak(base_doc))} more per GPU and the plan no longer "
            f"fits; free memory first (ZeRO, recomputation).",
        )
    return (
        "pass",
        f"FP8 does not pay here ({_pct(gain)} less time per step, below "
        f"{_pct(FP8_MIN_GAIN)}): {why}.",
    )


def nvlink_shard_group(plan: Mapping[str, Any], nvlink_domain_devices: int) -> int:
    """Data-parallel ranks of one NVLink domain under the plan's placement: the hybrid shard group
    that keeps the shards' all-gathers and reduce-scatters on NVLink (planner.placement.group_locality,
    the cost model's own layout)."""
    local = group_locality(
        placement_index(plan["placement"]),
        plan["dp"],
        plan["pp"],
        plan["tp"],
        nvlink_domain_devices,
        cp=plan.get("cp", 1),
    )["D"]
    return int(np.asarray(local).reshape(-1)[0])


def hybrid_sharding(ctx: RuleContext) -> RuleResult:
    """HSDP: shard the states over the data-parallel ranks of one NVLink domain and replicate across
    domains, so that the per-step all-gathers and reduce-scatters stay on NVLink and only a shard's
    all-reduce crosses the network (PyTorch FSDP HYBRID_SHARD; Zhao et al. 2023), at the memory of a
    smaller shard group. The numbers: the plan estimated with dp_shard = the domain's dp ranks and
    with dp_shard = 0 (all dp ranks)."""
    title = "Shard inside the NVLink domain, replicate across it (HSDP)"
    plan, hw = ctx.plan, ctx.hardware
    dp, zero = plan["dp"], plan["zero"]
    domain = hw.nvlink_domain_devices

    def result(status: Status, number: str, detail: str) -> RuleResult:
        return RuleResult(
            rule="hybrid-sharding",
            title=title,
            status=status,
            number=number,
            detail=detail,
            source=HSDP_SOURCE,
        )

    if zero == 0 or dp == 1:
        return result(
            "pass",
            f"ZeRO-{zero}, dp={dp}: no sharded states",
            "Not applicable: hybrid sharding splits ZeRO/FSDP shard groups; this plan shards nothing "
            "over data parallelism.",
        )
    fw = _framework(ctx)
    if not fw.capabilities.hsdp:
        return result(
            "pass",
            f"{fw.name} has no hybrid sharding",
            "Not available on this stack: states shard over all data-parallel ranks.",
        )
    local = nvlink_shard_group(plan, domain)
    if local >= dp:
        return result(
            "pass",
            f"dp={dp} sits inside one NVLink domain of {domain} devices",
            "Full sharding already keeps its collectives on NVLink.",
        )
    if local <= 1:
        return result(
            "pass",
            f"1 data-parallel rank per NVLink domain of {domain} devices (tp={plan['tp']}, "
            f"cp={plan.get('cp', 1)}, pp={plan['pp']} fill it)",
            "A shard group inside the domain would shard nothing; sharding must cross it.",
        )
    shard = plan.get("dp_shard", 0) or dp
    full = ctx.document if shard == dp else ctx.what_if(dp_shard=0)
    hybrid = ctx.document if shard == local else ctx.what_if(dp_shard=local)
    if full is None or hybrid is None:
        change = {"dp_shard": 0} if full is None else {"dp_shard": local}
        return result(
            "pass",
            f"dp_shard={change['dp_shard']} is not a valid configuration of this plan: "
            f"{ctx.why_not(**change) or 'refused'}",
            "Nothing to compare.",
        )
    number = (
        f"dp={dp} over {dp // local} NVLink domains of {domain} devices: exposed DP communication "
        f"{_breakdown(hybrid, 'dp_comm'):.3g} s with dp_shard={local} vs {_breakdown(full, 'dp_comm'):.3g} s "
        f"fully sharded, step {_change(_step(hybrid), _step(full))}; peak {_gb(_peak(hybrid))} vs "
        f"{_gb(_peak(full))} ({(_peak(hybrid) - _peak(full)) / GiB:+.1f} GiB/GPU)"
    )
    if shard not in (dp, local):
        number += f"; the plan's dp_shard={shard}: step {_step(ctx.document):.4g} s"
    if shard == local:
        if _fits(full) and _faster(full, hybrid):
            return result(
                "advice",
                number,
                f"Full sharding (dp_shard=0) is {_speed(_step(full), _step(hybrid))} "
                f"here and saves {_gb(_peak(hybrid) - _peak(full))} per GPU.",
            )
        return result(
            "pass",
            number,
            f"The plan shards inside the NVLink domain (dp_shard={local}) and "
            f"replicates across it.",
        )
    if not _fits(hybrid):
        return result(
            "pass",
            number,
            f"Hybrid sharding would need {_gb(_peak(hybrid) - _peak(ctx.document))} more "
            f"per GPU and does not fit: keep the wider shard group.",
        )
    if _faster(hybrid, ctx.document):
        return result(
            "advice",
            number,
            f"Set dp_shard={local} (FSDP HYBRID_SHARD / torchtitan dp_replicate="
            f"{dp // local}, Megatron --num-distributed-optimizer-instances "
            f"{dp // local}): {_speed(_step(hybrid), _step(ctx.document))} per step "
            f"for {_gb(_peak(hybrid) - _peak(ctx.document))} more per GPU.",
        )
    return result(
        "pass",
        number,
        "Sharding over every data-parallel rank costs no more time here and needs less memory.",
    )


RULES: tuple[Callable[[RuleContext], RuleResult], ...] = (
    data_parallel_first,
    mixed_precision,
    memory_savers_first,
    tp_inside_node,
    microbatches_vs_stages,
    short_pipelines,
    shard_optimizer,
    hybrid_sharding,
    context_parallel,
    fp8_gemms,
    batchnorm,
    nodes_close_together,
    spot_capacity,
    plan_for_failures,
)


SOURCES: Mapping[str, str] = {
    "data-parallel-first": "PyTorch distributed overview (pytorch.org/tutorials/beginner/dist_overview.html); "
    "Hugging Face, Efficient training on multiple GPUs (huggingface.co/docs/transformers/"
    "perf_train_gpu_many)",
    "mixed-precision": "Micikevicius et al. 2018, Mixed Precision Training (arXiv 1710.03740); torch.autocast "
    "documentation",
    "memory-savers-first": "PyTorch distributed overview (pytorch.org/tutorials/beginner/dist_overview.html); "
    "Hugging Face, Efficient training on multiple GPUs",
    "tp-inside-node": "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters "
    "Using Megatron-LM, Sec. 3.2 (Takeaway #1)",
    "microbatches-ge-stages": "Huang et al. 2019, GPipe (bubble (P-1)/(m+P-1)); Narayanan et al. 2021, Sec. 2.2",
    "short-pipeline": "Huang et al. 2019, GPipe; Narayanan et al. 2021, Sec. 2.2",
    "shard-optimizer": "Rajbhandari et al. 2020, ZeRO: Memory Optimizations Toward Training Trillion Parameter "
    "Models, Sec. 5",
    "hybrid-sharding": HSDP_SOURCE,
    "context-parallel": CP_SOURCE,
    "fp8": FP8_SOURCE,
    "batchnorm": "torch.nn.SyncBatchNorm documentation",
    "nodes-close": "AWS EC2 placement groups documentation",
    "spot-capacity": "AWS EC2 Spot Instances (aws.amazon.com/ec2/spot)",
    "plan-for-failures": "Young 1974; Daly 2006 (optimum checkpoint interval); Grattafiori et al. 2024, The "
    "Llama 3 Herd of Models, Sec. 3.3.4",
}
"""Where each rule's practice comes from, by rule id (shown in the report beside the advice)."""


def evaluate(ctx: RuleContext) -> list[RuleResult]:
    """Every rule, in the order of the seed documents, each with its source (SOURCES)."""
    import dataclasses

    return [
        dataclasses.replace(r, source=r.source or SOURCES[r.rule])
        for r in (rule(ctx) for rule in RULES)
    ]


def tp_group_nodes(plan: Mapping[str, Any], devices_per_node: int) -> int:
    """Nodes spanned by the widest tensor-parallel group under the placement: ranks laid out with the
    cost model's strides (planner.placement.strides: row-major over the placement, C just outside T)."""
    sizes = {"D": plan["dp"], "P": plan["pp"], "C": plan.get("cp", 1), "T": plan["tp"]}
    st = strides(placement_index(plan["placement"]), sizes["D"], sizes["P"], sizes["T"], sizes["C"])
    axes = ("D", "P", "C", "T")  # T last: each row below is one tensor-parallel group
    grids = np.meshgrid(*(np.arange(sizes[a]) for a in axes), indexing="ij")
    ranks = sum(g * int(np.asarray(st[a]).reshape(-1)[0]) for g, a in zip(grids, axes))
    groups = np.asarray(ranks).reshape(-1, sizes["T"])
    return max(len(set((g // devices_per_node).tolist())) for g in groups)
