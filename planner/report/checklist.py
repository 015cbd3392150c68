"""The best-practice checklist: each rule of the seed documents applied to this model and plan.

A rule is a small function of a `RuleContext` returning a `RuleResult` (pass or warn) with the
number behind the verdict. Every number comes from the plan document estimate() produced, from a
what-if estimate() of a changed configuration, from the hardware profile, or from counting the
model's modules; no rule computes a cost itself.

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np

Status = Literal["pass", "warn"]
GB = 1e9

MEMORY_BOUND_FRACTION = 0.85
"""Peak/capacity above which a plan counts as memory-bound (allocator fragmentation headroom)."""
BUBBLE_WARN_FRACTION = 0.10
"""Pipeline bubble + p2p share of the step above which the pipeline counts as too long."""
INTER_NODE_WARN_FRACTION = 0.10
"""Step-time share of exposed inter-node communication above which placement matters."""


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
    return f"{x / GB:.1f} GB"


def _tok(doc: Mapping[str, Any]) -> float:
    return float(doc["prediction"]["tokens_per_s"])


def _peak(doc: Mapping[str, Any]) -> int:
    return int(doc["prediction"]["memory"]["peak_bytes_per_gpu"])


def _fits(doc: Mapping[str, Any]) -> bool:
    return bool(doc["prediction"]["memory"]["fits"])


def _pure_dp(ctx: RuleContext, **changes) -> Mapping[str, Any] | None:
    gpus = ctx.plan["dp"] * ctx.plan["tp"] * ctx.plan["pp"]
    return ctx.what_if(dp=gpus, tp=1, pp=1, virtual_stages=1, stages=(), sequence_parallel=False,
                       schedule="1f1b", **changes)


def data_parallel_first(ctx: RuleContext) -> RuleResult:
    title = "Start with data parallelism"
    plan = ctx.plan
    if plan["tp"] == 1 and plan["pp"] == 1:
        return RuleResult(rule="data-parallel-first", title=title, status="pass",
                          number=f"dp={plan['dp']}, tp=pp=1",
                          detail="The plan is pure data parallel (with ZeRO stage "
                                 f"{plan['zero']}); no model parallelism is needed.")
    # pure DP at micro-batch 1 with the plan's ZeRO stage, and fully sharded (ZeRO-3, FSDP) as well:
    # the fastest variant that fits, else the leanest
    variants = [(plan["zero"], _pure_dp(ctx, micro_batch=1))]
    if plan["zero"] < 3:
        variants.append((3, _pure_dp(ctx, micro_batch=1, zero=3)))
    variants = [(z, d) for z, d in variants if d is not None]
    fitting = [(z, d) for z, d in variants if _fits(d)]
    zero, dp = (max(fitting, key=lambda zd: _tok(zd[1])) if fitting else
                min(variants, key=lambda zd: _peak(zd[1])) if variants else (plan["zero"], None))
    if dp is None:
        gpus = plan["dp"] * plan["tp"] * plan["pp"]
        return RuleResult(rule="data-parallel-first", title=title, status="pass",
                          number=f"global batch {plan['global_batch']} is not a multiple of {gpus} GPUs",
                          detail="Pure data parallelism cannot split this global batch evenly over every GPU; "
                                 "model parallelism is needed to use them all.")
    if not _fits(dp):
        return RuleResult(rule="data-parallel-first", title=title, status="pass",
                          number=f"pure DP peak {_gb(_peak(dp))} > capacity {_gb(ctx.prediction['memory']['capacity_bytes'])}",
                          detail=f"Pure data parallelism (micro-batch 1, ZeRO {' or '.join(str(z) for z, _ in variants)}) "
                                 f"does not fit, so tp={plan['tp']}, pp={plan['pp']} is justified.")
    ratio = _tok(dp) / _tok(ctx.document)
    status: Status = "warn" if ratio >= 0.98 else "pass"
    return RuleResult(rule="data-parallel-first", title=title, status=status,
                      number=f"pure DP with ZeRO-{zero} fits ({_gb(_peak(dp))}) at {_tok(dp):,.0f} tok/s = "
                             f"{ratio:.2f}x the plan",
                      detail=("Pure data parallelism fits and is as fast: prefer it (simpler, no model changes)."
                              if status == "warn" else
                              "Pure data parallelism fits but is slower than this plan's model parallelism."))


def mixed_precision(ctx: RuleContext) -> RuleResult:
    title = "Use mixed precision"
    precision = ctx.plan["precision"]
    peaks = ctx.hardware.peak_tflops
    if precision != "fp32":
        half = peaks.get("bf16") or peaks.get("fp16") or 0.0
        full = peaks.get("tf32") or peaks.get("fp32") or 0.0
        return RuleResult(rule="mixed-precision", title=title, status="pass",
                          number=f"{precision}: {half:g} vs fp32/tf32 {full:g} peak TFLOP/s",
                          detail="The plan already computes in 16-bit.")
    amp = ctx.what_if(precision="amp-bf16")
    if amp is None:
        return RuleResult(rule="mixed-precision", title=title, status="warn", number="fp32",
                          detail="Train with torch.autocast(dtype=torch.bfloat16).")
    return RuleResult(rule="mixed-precision", title=title, status="warn",
                      number=f"amp-bf16: {ctx.step_time_s / float(amp['prediction']['step_time_s']):.2f}x faster, "
                             f"peak {_gb(_peak(amp))} vs {_gb(_peak(ctx.document))}",
                      detail="Train with torch.autocast(dtype=torch.bfloat16) (fp32 master weights).")


def memory_savers_first(ctx: RuleContext) -> RuleResult:
    title = "Try smaller micro-batches, recomputation or shorter sequences before model parallelism"
    plan = ctx.plan
    if plan["tp"] == 1 and plan["pp"] == 1:
        return RuleResult(rule="memory-savers-first", title=title, status="pass",
                          number=f"micro-batch {plan['micro_batch']}, recompute {plan['recompute']}",
                          detail="No model parallelism in the plan.")
    variants = {"micro-batch 1": _pure_dp(ctx, micro_batch=1),
                "micro-batch 1 + full recompute": _pure_dp(ctx, micro_batch=1, recompute="full"),
                f"micro-batch 1 + full recompute + seq {plan['seq'] // 2}":
                    _pure_dp(ctx, micro_batch=1, recompute="full", seq=max(plan["seq"] // 2, 1))}
    tried = {k: v for k, v in variants.items() if v is not None}
    if not tried:
        gpus = plan["dp"] * plan["tp"] * plan["pp"]
        return RuleResult(rule="memory-savers-first", title=title, status="pass",
                          number=f"global batch {plan['global_batch']} is not a multiple of {gpus} GPUs",
                          detail="Pure data parallelism cannot split this global batch evenly over every GPU, "
                                 "whatever the micro-batch; model parallelism is needed to use them all.")
    name, best = min(tried.items(), key=lambda kv: _peak(kv[1]))
    if _fits(best) and _tok(best) >= 0.98 * _tok(ctx.document):
        return RuleResult(rule="memory-savers-first", title=title, status="warn",
                          number=f"pure DP with {name}: {_gb(_peak(best))}, {_tok(best):,.0f} tok/s",
                          detail="Memory savers alone make pure data parallelism fit at this speed.")
    verdict = "fits but is slower" if _fits(best) else "still does not fit"
    return RuleResult(rule="memory-savers-first", title=title, status="pass",
                      number=f"pure DP with {name}: peak {_gb(_peak(best))} "
                             f"(capacity {_gb(ctx.prediction['memory']['capacity_bytes'])})",
                      detail=f"The leanest pure data-parallel variant {verdict}; model parallelism is justified.")


def tp_inside_node(ctx: RuleContext) -> RuleResult:
    title = "Keep tensor parallelism inside a node"
    plan, hw = ctx.plan, ctx.hardware
    tp_share = ctx.share("tp_comm")
    if plan["tp"] == 1:
        return RuleResult(rule="tp-inside-node", title=title, status="pass", number="tp=1",
                          detail="No tensor parallelism.")
    if ctx.tp_group_nodes <= 1:
        return RuleResult(rule="tp-inside-node", title=title, status="pass",
                          number=f"tp={plan['tp']} on {hw.intra_node_GBps_per_device:g} GB/s/device NVLink; "
                                 f"TP comm {_pct(tp_share)} of the step",
                          detail="Each tensor-parallel group sits inside one node.")
    per_device_GBps = hw.inter_node_GBps_per_node / hw.devices_per_node
    return RuleResult(rule="tp-inside-node", title=title, status="warn",
                      number=f"TP group spans {ctx.tp_group_nodes} nodes: {per_device_GBps:.1f} GB/s/device "
                             f"across nodes vs {hw.intra_node_GBps_per_device:g} GB/s inside; "
                             f"TP comm {_pct(tp_share)} of the step",
                      detail=f"Use tp <= {hw.devices_per_node} and put T innermost in the placement (e.g. DPT).")


def microbatches_vs_stages(ctx: RuleContext) -> RuleResult:
    title = "Use at least as many micro-batches as pipeline stages"
    plan = ctx.plan
    m, pp = plan["num_microbatches"], plan["pp"]
    bubble = ctx.share("bubble")
    if pp == 1:
        return RuleResult(rule="microbatches-ge-stages", title=title, status="pass", number="pp=1",
                          detail="No pipeline.")
    status: Status = "pass" if m >= pp else "warn"
    return RuleResult(rule="microbatches-ge-stages", title=title, status=status,
                      number=f"{m} micro-batches / {pp} stages; bubble {_pct(bubble)} of the step",
                      detail=("Enough micro-batches to fill the pipeline." if status == "pass" else
                              f"Raise the global batch or lower the micro-batch so that m >= {pp}."))


def short_pipelines(ctx: RuleContext) -> RuleResult:
    title = "Keep pipelines short"
    plan = ctx.plan
    if plan["pp"] == 1:
        return RuleResult(rule="short-pipeline", title=title, status="pass", number="pp=1",
                          detail="No pipeline.")
    idle = ctx.share("bubble", "pp_p2p")
    status: Status = "pass" if idle <= BUBBLE_WARN_FRACTION else "warn"
    from planner.parallel import LOOPED_SCHEDULES, looped_rounds, looped_rounds_ok

    m, pp = plan["num_microbatches"], plan["pp"]
    if plan["schedule"] in LOOPED_SCHEDULES:
        fix = "Fewer stages or more micro-batches would recover this time."
    elif looped_rounds_ok(m, pp):
        fix = "Fewer stages, more micro-batches or an interleaved/zero-bubble schedule would recover this time."
    else:
        fix = (f"Fewer stages or more micro-batches would recover this time; interleaved/zero-bubble schedules "
               f"need m a multiple of max(1, m // pp) = {int(looped_rounds(m, pp))}, which m={m} is not (change the "
               f"global batch).")
    return RuleResult(rule="short-pipeline", title=title, status=status,
                      number=f"pp={pp} ({plan['schedule']}): bubble + p2p {_pct(idle)} of the step",
                      detail="The pipeline costs little." if status == "pass" else fix)


def shard_optimizer(ctx: RuleContext) -> RuleResult:
    title = "Shard the optimizer state when memory-bound"
    plan, mem = ctx.plan, ctx.prediction["memory"]
    frac = mem["peak_bytes_per_gpu"] / mem["capacity_bytes"] if mem["capacity_bytes"] else float("inf")
    opt = f"optimizer state {_gb(mem['optimizer_bytes'])}/GPU, peak {_pct(frac)} of capacity"
    if not mem["fits"] and plan["zero"] >= 1:
        return RuleResult(rule="shard-optimizer", title=title, status="warn", number=opt,
                          detail=f"The plan does not fit even with ZeRO stage {plan['zero']}: shard further "
                                 "(ZeRO-3), recompute, or add tensor/pipeline parallelism.")
    if plan["zero"] >= 1:
        return RuleResult(rule="shard-optimizer", title=title, status="pass", number=opt,
                          detail=f"ZeRO stage {plan['zero']} shards the optimizer state over dp={plan['dp']}.")
    if plan["dp"] == 1:
        return RuleResult(rule="shard-optimizer", title=title, status="pass", number=opt,
                          detail="dp=1: there is no data-parallel group to shard over.")
    if frac <= MEMORY_BOUND_FRACTION and mem["fits"]:
        return RuleResult(rule="shard-optimizer", title=title, status="pass", number=opt,
                          detail="Not memory-bound; sharding is optional.")
    z1 = ctx.what_if(zero=1)
    saving = f"; ZeRO-1 peak {_gb(_peak(z1))}" if z1 is not None else ""
    return RuleResult(rule="shard-optimizer", title=title, status="warn", number=opt + saving,
                      detail="Use ZeRO-1 (torch.distributed.optim.ZeroRedundancyOptimizer or FSDP2 "
                             "reshard_after_forward=False).")


def batchnorm(ctx: RuleContext) -> RuleResult:
    title = "Synchronise BatchNorm across devices or avoid it"
    n = ctx.batchnorm_modules
    if n == 0:
        return RuleResult(rule="batchnorm", title=title, status="pass", number="0 BatchNorm modules",
                          detail="No BatchNorm: statistics do not depend on the per-device batch.")
    return RuleResult(rule="batchnorm", title=title, status="warn",
                      number=f"{n} BatchNorm modules; per-device statistics over {ctx.plan['micro_batch']} "
                             f"samples of {ctx.plan['global_batch']}",
                      detail="Convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) or replace "
                             "them with GroupNorm/LayerNorm.")


def nodes_close_together(ctx: RuleContext) -> RuleResult:
    title = "Put nodes close together"
    hw, doc = ctx.hardware, ctx.document
    nodes = doc["hardware"]["nodes"]
    if nodes <= 1:
        return RuleResult(rule="nodes-close", title=title, status="pass", number="1 node",
                          detail="Single node: all traffic stays on NVLink/NVSwitch.")
    slow = ctx.what_if(hardware_changes={"inter_node_Gbps_per_node": hw.inter_node_Gbps_per_node / 2})
    exposed = ctx.share("dp_comm", "pp_p2p") + (ctx.share("tp_comm") if ctx.tp_group_nodes > 1 else 0.0)
    number = (f"{nodes} nodes at {hw.inter_node_Gbps_per_node:g} Gbit/s each; exposed DP/PP"
              f"{'/TP' if ctx.tp_group_nodes > 1 else ''} communication {_pct(exposed)} of the step")
    sensitivity = 0.0
    if slow is not None:
        sensitivity = float(slow["prediction"]["step_time_s"]) / ctx.step_time_s - 1.0
        number += f"; half the bandwidth -> step +{_pct(sensitivity)}"
    status: Status = "warn" if max(exposed, sensitivity) > INTER_NODE_WARN_FRACTION else "pass"
    return RuleResult(rule="nodes-close", title=title, status=status, number=number,
                      detail=("Use a cluster placement group (one spine) with EFA/InfiniBand for these nodes."
                              if status == "warn" else
                              "Inter-node traffic is a small share; placement is not critical."))


SPOT_MAX_DISCOUNT = 0.90
"""AWS: "Spot Instances are available at up to a 90% discount compared to On-Demand prices"
(aws.amazon.com/ec2/spot); the bound used when the profile has no spot price."""


def spot_capacity(ctx: RuleContext) -> RuleResult:
    title = "Use spot capacity with checkpoints (up to 90% cheaper)"
    hw = ctx.hardware
    nodes = ctx.document["hardware"]["nodes"]
    if not hw.price_usd_per_hour:
        return RuleResult(rule="spot-capacity", title=title, status="pass", number="no price in the profile",
                          detail="Not rented by the hour.")
    hours = run_seconds(ctx.document, ctx.train_tokens) / 3600.0
    on_demand = hours * nodes * hw.price_usd_per_hour
    run = f"{ctx.train_tokens:.3g} tokens in {hours / 24:.1f} days on {nodes} nodes"
    if hw.spot_price_usd_per_hour:
        spot = hours * nodes * hw.spot_price_usd_per_hour
        saving = 1.0 - hw.spot_price_usd_per_hour / hw.price_usd_per_hour
        number = f"${on_demand:,.0f} on-demand vs ${spot:,.0f} spot ({_pct(saving)} less) for {run}"
    else:
        saving = SPOT_MAX_DISCOUNT
        number = (f"${on_demand:,.0f} on-demand for {run}; spot up to {_pct(saving)} less "
                  f"(as low as ${on_demand * (1 - saving):,.0f})")
    status: Status = "warn" if saving > 0.05 and hours >= 1.0 else "pass"
    return RuleResult(rule="spot-capacity", title=title, status=status, number=number,
                      detail=("Run on spot capacity with frequent distributed checkpoints "
                              "(torch.distributed.checkpoint) and automatic restart."
                              if status == "warn" else "The run is short or spot saves little."))


GOODPUT_WARN_FRACTION = 0.90
"""Goodput below which the run loses more to failures than Llama 3 405B did on 16,384 GPUs (more than
90% effective training time; Grattafiori et al. 2024, Sec. 3.3.4)."""


def plan_for_failures(ctx: RuleContext) -> RuleResult:
    title = "Checkpoint at the interval failures call for"
    rel = ctx.prediction.get("reliability")
    if not rel:
        return RuleResult(rule="plan-for-failures", title=title, status="pass", number="no run length given",
                          detail="Give the run's tokens to see its expected interruptions and goodput.")
    days = rel["time_to_train_s"] / 86400.0
    interval_s = rel["checkpoint_interval_s"]
    steps = max(1, round(interval_s / ctx.step_time_s))
    number = (f"goodput {_pct(rel['goodput'])}: {rel['expected_interruptions']:.1f} interruptions expected over "
              f"{days:.1f} days (job MTBF {rel['mtbf_hours']:.1f} h); checkpoint every {interval_s / 60:.1f} min "
              f"({rel['checkpoint']}, {rel['checkpoint_stall_s']:.1f} s each); {rel['lost_hours']:.1f} h lost to "
              f"rework and restarts")
    if rel["goodput"] >= GOODPUT_WARN_FRACTION:
        return RuleResult(rule="plan-for-failures", title=title, status="pass", number=number,
                          detail=f"Checkpoint every {steps} steps (plan.checkpoint_interval_s; planner export "
                                 f"writes it) and restart automatically.")
    restarts_h = rel["expected_interruptions"] * rel["restart_s"] / 3600.0
    rework_h = max(rel["lost_hours"] - restarts_h, 0.0)
    worst = max((rel["checkpoint_hours"], "checkpoints"), (restarts_h, "restarts"), (rework_h, "rework"))[1]
    fix = {"checkpoints": "save asynchronously (--checkpoint async) or to faster storage (--storage)",
           "restarts": f"restart faster ({rel['restart_s']:.0f} s each, {rel['checkpoint_read_s']:.0f} s of it "
                       f"reading the checkpoint): faster storage, a sharded optimizer (ZeRO) so that replicas read "
                       f"less, spare nodes kept ready",
           "rework": "make checkpoints cheaper so that they can be taken more often (async saves, faster storage)"}
    return RuleResult(rule="plan-for-failures", title=title, status="warn", number=number,
                      detail=f"Most of the loss is {worst}: {fix[worst]}; checkpoint every {steps} steps meanwhile.")


RULES: tuple[Callable[[RuleContext], RuleResult], ...] = (
    data_parallel_first, mixed_precision, memory_savers_first, tp_inside_node, microbatches_vs_stages,
    short_pipelines, shard_optimizer, batchnorm, nodes_close_together, spot_capacity, plan_for_failures)


def evaluate(ctx: RuleContext) -> list[RuleResult]:
    """Every rule, in the order of the seed documents."""
    return [rule(ctx) for rule in RULES]


def tp_group_nodes(plan: Mapping[str, Any], devices_per_node: int) -> int:
    """Nodes spanned by the tensor-parallel group of rank 0 under the placement (row-major mesh)."""
    from planner.parallel import ParallelConfig
    from planner.plan import rank_layout

    cfg = ParallelConfig(dp=plan["dp"], tp=plan["tp"], pp=plan["pp"], micro_batch=1,
                         global_batch=plan["dp"], placement=plan["placement"])
    layout = rank_layout(cfg)
    tp_axis = cfg.placement.index("T")
    group = np.moveaxis(layout, tp_axis, -1).reshape(-1, cfg.tp)
    return max(len(set((g // devices_per_node).tolist())) for g in group)
