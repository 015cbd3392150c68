"""The search space: the objectives, the degree rules' view of a model, the values the rules admit
and what the framework holds, the pinned and limited dimensions checked, and a candidate row as a
ParallelConfig."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields, replace
from typing import Mapping

import numpy as np

from cost_models.step import Step
from frameworks.rules import check_model_runnable, mtp_without_pp_or_cp
from planner.candidates import SearchSpace, config_of_row, cp_comm_allowed
from planner.errors import ConfigError
from planner.run_options import RunOptions
from planner.parallel import (
    CP_COMMS,
    ParallelConfig,
    default_placement,
    expert_parallel_degrees,
    offloads,
)


OBJECTIVES = ("throughput", "cost", "memory", "time-to-train")
PREFERENCES = ("headroom", "fastest")
"""Which of the plans the model cannot rank comes first (planner.uncertainty.ranked_by_preference):
headroom, the one with the fewest axes and then the least memory; fastest, the predicted order."""


MEMORY_OBJECTIVE_SLACK = 0.05
"""The memory objective accepts candidates up to 5 % slower than the fastest."""


def _model_shape(model) -> tuple[int, int, int]:
    """(heads, kv_heads, blocks) the degree rules read; models without heads allow tp = 1 only."""
    heads = getattr(model, "heads", None)
    blocks = getattr(model, "total_blocks", None) or getattr(model, "layers", None)
    if isinstance(blocks, (list, tuple)):
        blocks = len(blocks)
    if not heads:
        return 1, 1, int(blocks or 1)
    return int(heads), int(getattr(model, "n_kv_heads", heads)), int(blocks)


def _take(rows: Mapping[str, np.ndarray], mask) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in rows.items()}


def config_of(
    arrays: Mapping[str, np.ndarray],
    i: int,
    *,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str,
    stages: tuple[int, ...] = (),
    framework: str = "megatron",
) -> ParallelConfig:
    """Row i of candidate arrays as a ParallelConfig (planner.candidates.config_of_row)."""
    return config_of_row(
        arrays,
        i,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        stages=stages,
        framework=framework,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What every candidate of one search shares beside its row: the world size, global batch,
    sequence, precision, optimizer and framework (what the scorer and config_of take with it)."""

    world_size: int
    global_batch: int
    seq: int
    precision: str
    optimizer: str = "adamw"
    framework: str = "megatron"

    def score_kw(self) -> dict:
        """The keywords planner.score.score takes beside the candidates."""
        return dict(
            global_batch=self.global_batch,
            seq=self.seq,
            precision=self.precision,
            optimizer=self.optimizer,
        )

    def config_kw(self) -> dict:
        """The keywords config_of takes beside the row."""
        return self.score_kw() | {"framework": self.framework}

    def config(self, arrays: Mapping[str, np.ndarray], i: int) -> ParallelConfig:
        """Row i of candidate arrays as a ParallelConfig (config_of)."""
        return config_of(arrays, i, **self.config_kw())


def narrowed(
    space: SearchSpace, software, model, options: RunOptions = RunOptions()
) -> tuple[SearchSpace, dict[str, str]]:
    """The space the run options let the stack run, and the knobs they hold out, each with the option
    that holds it (what no_fit_error names). With `bf16_optimizer` only ZeRO-1 without optimizer
    offload (what DeepSpeed's BF16_Optimizer runs); with fp8_param_gather asked for only ZeRO >= 1
    (parameters gathered at all); with the MoE exchange overlap only plans
    Megatron-Core runs it with: interleaved stages when pipelined, no full recomputation."""
    if software.bf16_optimizer:  # BF16_Optimizer shards like ZeRO-1 and runs its step on the device
        space = replace(
            space,
            zero=(1,),
            zero_with_pp=(1,),
            offload=tuple(o for o in space.offload if not offloads(o, "optimizer")),
        )
    held = {}
    if options.fp8_param_gather:  # Megatron-LM asserts its distributed optimizer (ZeRO >= 1)
        space = replace(
            space,
            zero=tuple(z for z in space.zero if z >= 1),
            zero_with_pp=tuple(z for z in space.zero_with_pp if z >= 1),
        )
        held["ZeRO-0"] = "fp8_param_gather"
    if software.moe_a2a_overlap and model.moe is not None:
        # only plans frameworks.rules.a2a_overlap_conflict lets the overlap run on: interleaved stages when
        # pipelined, no full recomputation
        space = replace(
            space,
            schedules=tuple(s for s in space.schedules if s == "interleaved-1f1b"),
            recompute=tuple(r for r in space.recompute if r != "full"),
        )
        if not space.recompute:
            raise ConfigError(
                "moe_a2a_overlap",
                True,
                "false",
                message="moe_a2a_overlap cannot run with full recomputation, the only recompute the "
                "search may try (allowed with the overlap: recompute none or selective)",
            )
        held["full recompute"] = "moe_a2a_overlap"
    if software.bf16_optimizer:
        held.update({"ZeRO-3": "bf16_optimizer", "optimizer offload": "bf16_optimizer"})
    return space, held


def _no_space_reason(world, global_batch, heads, blocks, rejected) -> str:
    reasons = "; ".join(f"{k}: {v}" for k, v in sorted(rejected.items()))
    return (
        f"a world size with at least one valid (dp, tp, pp, cp): tp | heads({heads}), pp <= blocks({blocks}), "
        f"seq % (2 cp) == 0, dp | global_batch({global_batch}); every split of {world} was rejected ({reasons})"
    )


SEARCHED_DIMENSIONS = ("cp", "cp_comm", "dp_shard", "ep")
"""The dimensions beyond dp x tp x pp whose values the search reports (SearchStats.values_tried)."""


def held_dimensions(framework, model) -> dict[str, str]:
    """Dimensions `framework` holds at 1 for `model` (SearchSpace.for_framework narrows them), each with the reason
    and what would lift it, for recommend to say: a stack that runs multi-token-prediction modules only without
    pipeline or context parallelism (frameworks.rules.mtp_without_pp_or_cp)."""
    if not mtp_without_pp_or_cp(framework, model):
        return {}
    why = (
        f"{framework.name} runs the model's {model.mtp_modules} multi-token-prediction module(s) only with pp = cp "
        f"= 1 (frameworks/{framework.name}.json: mtp_with_pp_or_cp false); without them (a config.json without "
        "num_nextn_predict_layers) the search pipelines the model"
    )
    return {"pp": why, "cp": why}


def values_tried(rows: Mapping[str, np.ndarray]) -> dict[str, list]:
    """The distinct cp, cp_comm (names), dp_shard and ep values among candidate rows (the skeletons the
    rules admit, before any bound): what `explain` reports as tried."""
    out = {
        name: sorted(int(v) for v in np.unique(rows[name]))
        for name in SEARCHED_DIMENSIONS
        if name in rows
    }
    if "cp_comm" in out:
        out["cp_comm"] = [CP_COMMS[i] for i in out["cp_comm"]]
    return out


def ep_costed() -> bool:
    """Whether the cost model prices expert parallelism (cost_models.step.Step reads an `ep` array). Until
    it does, an ep > 1 candidate would score exactly as its ep = 1 twin and planner.estimate refuses it, so
    the search enumerates ep but scores only ep = 1 (`_costed`)."""
    return "ep" in {f.name for f in fields(Step)}


def _costed(rows: Mapping[str, np.ndarray], rejected: Counter) -> dict[str, np.ndarray]:
    """Skeleton rows the cost model can price: all of them once ep_costed(), else those with ep = 1 (the
    others counted under their reason)."""
    if "ep" not in rows or ep_costed():
        return dict(rows)
    mask = rows["ep"] == 1
    if (~mask).any():
        rejected["ep > 1 not costed by this build (scores as ep = 1; skeletons)"] += int(
            (~mask).sum()
        )
    return _take(rows, mask)


def check_space(space: SearchSpace, model, framework, *, world: int, seq: int) -> None:
    """The pinned and limited values of the new dimensions (recommend --cp/--max-cp/--cp-comm/--dp-shard/--ep/
    --max-ep) checked against the framework's capabilities (frameworks.rules' vocabulary), the model and the
    sequence: one ConfigError naming the flag, the value and what is allowed."""
    caps, name = framework.capabilities, framework.name
    check_model_runnable(framework, model)
    heads, kv_heads, _ = _model_shape(model)
    for flag, value in (("max-cp", space.max_cp), ("max-ep", space.max_ep)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(flag, value, "a positive integer")
    for c in space.cp_comm:
        if c not in CP_COMMS:
            raise ConfigError("cp-comm", c, "one of " + ", ".join(CP_COMMS))
        if (
            caps.cp_comm and c not in caps.cp_comm and space.cp_comm != CP_COMMS
        ):  # a user's list, not the default
            raise ConfigError(
                "cp-comm", c, f"a key/value exchange {name} runs: " + ", ".join(caps.cp_comm)
            )
    for cp in space.cp or ():
        if not isinstance(cp, int) or cp < 1 or world % cp:
            raise ConfigError("cp", cp, f"a divisor of the world size {world}")
        if space.max_cp is not None and cp > space.max_cp:
            raise ConfigError("cp", cp, f"at most --max-cp {space.max_cp}")
        if cp > 1 and not caps.cp_comm:
            raise ConfigError("cp", cp, f"1: {name} has no context parallelism")
        if cp > 1 and mtp_without_pp_or_cp(framework, model):
            raise ConfigError(
                "cp",
                cp,
                f"1: {name} runs the model's multi-token-prediction modules without context "
                "parallelism",
            )
        comms = [c for c in space.cp_comm if c in caps.cp_comm] or ["p2p"]
        if cp > 1 and not any(
            cp_comm_allowed(c, cp=cp, tp=1, seq=seq, heads=heads, kv_heads=kv_heads) for c in comms
        ):
            ParallelConfig(
                cp=cp, placement=default_placement(cp), cp_comm=comms[0]
            ).check_sequence(  # its message
                seq, heads=heads, kv_heads=kv_heads
            )
    if space.dp_shard is not None:
        if (
            not isinstance(space.dp_shard, int)
            or space.dp_shard < 0
            or (space.dp_shard and world % space.dp_shard)
        ):
            raise ConfigError(
                "dp-shard",
                space.dp_shard,
                f"0 (all dp ranks) or a divisor of the world size {world}",
            )
        if space.dp_shard and not caps.hsdp:
            raise ConfigError(
                "dp-shard", space.dp_shard, f"0: {name} shards over all dp ranks only"
            )
    moe = getattr(model, "moe", None)
    for ep in space.ep or ():
        if not isinstance(ep, int) or ep < 1:
            raise ConfigError("ep", ep, "a positive integer")
        if space.max_ep is not None and ep > space.max_ep:
            raise ConfigError("ep", ep, f"at most --max-ep {space.max_ep}")
        if ep == 1:
            continue
        if moe is None:
            raise ConfigError(
                "ep",
                ep,
                f"1: {getattr(model, 'name', 'the model')} is dense (expert parallelism "
                "needs a mixture-of-experts model)",
            )
        if moe.experts % ep:
            raise ConfigError(
                "ep",
                ep,
                f"a divisor of the {moe.experts} experts: "
                + ", ".join(map(str, expert_parallel_degrees(dp=moe.experts, experts=moe.experts))),
            )
        if not caps.ep:
            raise ConfigError("ep", ep, f"1: {name} has no expert parallelism")
        if not ep_costed():
            raise ConfigError(
                "ep",
                ep,
                "1 until expert parallelism is costed (planner estimate refuses ep > 1 too)",
            )
