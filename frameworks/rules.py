"""What a software stack can run: the one owner of the rule set.

`violations(framework, config)` lists, in words a user can act on, every way a ParallelConfig asks
for something the stack's capabilities (frameworks/*.json) do not have. `planner estimate` refuses the
first one (exit 2), the search proposes only plans without any (planner.candidates.SearchSpace.for_framework
derives its knobs from the same capabilities), and `planner export` re-checks a plan against another
target with it.
"""

from __future__ import annotations

import numpy as np

from frameworks import FrameworkProfile
from planner.errors import ConfigError
from planner.parallel import default_placement


def used_placement(placement: str, *, cp: int = 1, ep: int = 1) -> str:
    """The placement's order of the axes a plan actually uses (C only when cp > 1, E when ep > 1)."""
    unused = ("" if cp > 1 else "C") + ("" if ep > 1 else "E")
    return "".join(letter for letter in placement if letter not in unused)


def placement_allowed(
    framework: FrameworkProfile,
    placement: str,
    *,
    cp: int = 1,
    ep: int = 1,
    degrees: dict[str, int] | None = None,
) -> bool:
    """Whether the stack can lay ranks out in this order. Axes of degree 1 do not constrain it."""
    allowed = framework.capabilities.placements
    if not allowed:
        return True
    degrees = degrees or {}
    keep = lambda text: "".join(
        a for a in used_placement(text, cp=cp, ep=ep) if degrees.get(a, 2) > 1
    )  # noqa: E731
    return keep(placement) in {keep(p) for p in allowed}


def framework_placement(framework: FrameworkProfile, *, cp: int = 1, ep: int = 1) -> str:
    """The rank order a plan gets on this stack when it names none: planner.parallel.default_placement where the
    stack builds it, else the stack's own first order (DeepSpeed's PDT) over the axes the plan uses."""
    placement = default_placement(cp, ep)
    if placement_allowed(framework, placement, cp=cp, ep=ep):
        return placement
    return used_placement(framework.capabilities.placements[0], cp=cp, ep=ep)


def fp8_scaling_problem(framework: FrameworkProfile, scaling: str | None) -> str | None:
    """Why `framework` cannot run the FP8 recipe `scaling` (capabilities.fp8_scalings); None where it
    can, where no recipe is named, or where the stack has no FP8 at all (its precision says so)."""
    caps = framework.capabilities
    if scaling is None or "fp8" not in caps.precisions or scaling in caps.fp8_scalings:
        return None
    runs = ", ".join(caps.fp8_scalings)
    return f"fp8_scaling={scaling}: {framework.name} runs the FP8 recipes {runs}"


def violations(framework: FrameworkProfile, cfg) -> list[str]:
    """Every capability of `framework` that `cfg` (a ParallelConfig) exceeds, as one line each."""
    caps, name, out = framework.capabilities, framework.name, []

    def no(what: str, allowed) -> None:
        shown = ", ".join(map(str, allowed)) if isinstance(allowed, (list, tuple)) else str(allowed)
        out.append(f"{what}: {name} allows {shown or 'none'}")

    if cfg.precision not in caps.precisions:
        no(f"precision={cfg.precision}", caps.precisions)
    if cfg.pp > 1:
        if not caps.schedules:
            no(f"pp={cfg.pp}", "pp=1 only (no pipeline parallelism)")
        elif cfg.schedule not in caps.schedules:
            no(f"schedule={cfg.schedule}", caps.schedules)
        if cfg.virtual_stages > caps.max_virtual_stages:
            no(f"virtual_stages={cfg.virtual_stages}", f"at most {caps.max_virtual_stages}")
        if cfg.dp > 1 and cfg.zero not in caps.zero_with_pp:
            no(
                f"zero={cfg.zero} with pp={cfg.pp}",
                f"ZeRO stages {list(caps.zero_with_pp)} with pipelining",
            )
    if cfg.dp > 1 and cfg.zero not in caps.zero:
        no(f"zero={cfg.zero}", caps.zero)
    if cfg.tp > 1 and not caps.tp:
        no(f"tp={cfg.tp}", "tp=1 only (no tensor parallelism)")
    if cfg.tp > 1 and caps.sequence_parallel == "always" and not cfg.sequence_parallel:
        out.append(
            f"sequence_parallel=false with tp={cfg.tp}: {name} always applies sequence parallelism with "
            "tensor parallelism (set sequence_parallel)"
        )
    if cfg.tp > 1 and caps.sequence_parallel == "never" and cfg.sequence_parallel:
        no("sequence_parallel=true", "no sequence parallelism")
    if cfg.cp > 1 and cfg.cp_comm not in caps.cp_comm:
        no(
            f"cp={cfg.cp} with cp_comm={cfg.cp_comm}",
            ["cp=1 only"] if not caps.cp_comm else caps.cp_comm,
        )
    if cfg.cp > 1 and cfg.tp > 1 and cfg.sequence_parallel and not caps.cp_with_sequence_parallel:
        no(
            f"cp={cfg.cp} with sequence_parallel=true",
            "context parallelism with sequence_parallel=false only",
        )
    if cfg.ep > 1 and not caps.ep:
        no(f"ep={cfg.ep}", "ep=1 only (no expert parallelism)")
    if cfg.expert_tp > 1 and not caps.expert_tp:
        no(f"expert_tp={cfg.expert_tp}", "expert_tp=1 only")
    if cfg.dp_shard not in (0, cfg.dp) and cfg.zero >= 1 and not caps.hsdp:
        no(f"dp_shard={cfg.dp_shard}", "shard groups of all dp ranks only (no hybrid sharding)")
    if cfg.offloads("optimizer") and cfg.zero < caps.optimizer_offload_min_zero:
        no(
            f"offload={cfg.offload} with ZeRO-{cfg.zero}",
            f"optimizer offload with ZeRO >= {caps.optimizer_offload_min_zero} (with data parallelism)",
        )
    if cfg.offload not in caps.offload:
        no(f"offload={cfg.offload}", caps.offload)
    elif (
        cfg.offloads("activations")
        and caps.activation_offload == "without_pp_or_recompute"
        and (cfg.pp > 1 or cfg.recompute != "none")
    ):
        no(
            f"offload=activations with pp={cfg.pp}, recompute={cfg.recompute}",
            "activation offload only with pp=1 and recompute=none",
        )
    if cfg.recompute not in caps.recompute:
        no(f"recompute={cfg.recompute}", caps.recompute)
    if cfg.recompute_layers is not None and not caps.recompute_layers:
        no(
            f"recompute_layers={cfg.recompute_layers}",
            "full recomputation of every block only (no recompute_layers)",
        )
    degrees = {"D": cfg.dp, "P": cfg.pp, "T": cfg.tp, "C": cfg.cp, "E": cfg.ep}
    if not placement_allowed(framework, cfg.placement, cp=cfg.cp, ep=cfg.ep, degrees=degrees):
        no(
            f"placement={cfg.placement}",
            [used_placement(p, cp=cfg.cp, ep=cfg.ep) for p in caps.placements],
        )
    return out


def mtp_without_pp_or_cp(framework: FrameworkProfile, spec) -> bool:
    """Whether `framework` must run `spec` with pp = cp = 1: the model has multi-token-prediction modules and the
    stack runs them without pipeline or context parallelism (capabilities.mtp_with_pp_or_cp); read by estimate
    (check_model_runnable), the search (SearchSpace.for_framework, check_space) and the torchtitan exporter."""
    return bool(getattr(spec, "mtp_modules", 0)) and not framework.capabilities.mtp_with_pp_or_cp


def check_model_runnable(framework: FrameworkProfile, spec, cfg=None) -> None:
    """ConfigError (one line) when `framework` does not build the model: a mixture-of-experts architecture
    outside its moe_model_types; with `cfg` (a ParallelConfig), multi-token-prediction modules under pipeline or
    context parallelism where the stack runs them without (mtp_with_pp_or_cp)."""
    caps = framework.capabilities
    types = caps.moe_model_types
    if (
        getattr(spec, "moe", None) is not None
        and types is not None
        and spec.model_type not in types
    ):
        raise ConfigError(
            "framework",
            framework.name,
            "a stack that builds the model",
            message=f"framework {framework.name} cannot run this plan: mixture-of-experts model_type="
            f"{spec.model_type}: {framework.name} builds {', '.join(types)}",
        )
    moe = getattr(spec, "moe", None)
    if (
        cfg is not None
        and moe is not None
        and framework.experts_follow_tp_without_ep
        and cfg.ep == 1
        and cfg.tp > 1
        and moe.expert_ffn % cfg.tp
    ):
        raise ConfigError(
            "tp",
            cfg.tp,
            f"a divisor of expert_ffn({moe.expert_ffn}) with ep=1",
            message=(
                f"framework {framework.name} cannot run this plan: tp={cfg.tp} with ep=1 shards every expert over the "
                f"tensor-parallel ranks, and expert_ffn={moe.expert_ffn} does not divide by {cfg.tp}; use ep > 1 or a "
                "tp that divides it"
            ),
        )
    if cfg is not None and mtp_without_pp_or_cp(framework, spec) and (cfg.pp > 1 or cfg.cp > 1):
        raise ConfigError(
            "framework",
            framework.name,
            "a plan the framework can run",
            message=f"framework {framework.name} cannot run this plan: {spec.mtp_modules} multi-token-"
            f"prediction module(s) with pp={cfg.pp}, cp={cfg.cp}: {framework.name} runs them with "
            "pp=1 and cp=1 only",
        )


def check_runnable(framework: FrameworkProfile, cfg) -> None:
    """ConfigError naming the first thing `framework` cannot run (see violations)."""
    problems = violations(framework, cfg)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(
            "framework",
            framework.name,
            "a plan the framework can run",
            message=f"framework {framework.name} cannot run this plan: {problems[0]}{more}",
        )


def a2a_overlap_conflict(
    *,
    pp: int,
    virtual_stages: int,
    recompute: str,
    precision: str,
    recompute_modules=(),
    mtp_modules: int = 0,
) -> str | None:
    """Why Megatron-Core would not run the expert-parallel exchange overlap (--overlap-moe-expert-parallel-comm) on
    this plan, or None. Its TransformerConfig.__post_init__ asserts (megatron-core 0.19.2 transformer_config.py):
    virtual pipeline stages when pp > 1, no full recomputation, no 'moe' among the recomputed modules, bf16 or
    fp16 training, at most one MTP layer. The one owner of the rule: the search keeps to it, estimate refuses it
    and the Megatron-LM export re-checks it."""
    if pp > 1 and virtual_stages <= 1:
        return f"needs virtual pipeline stages with pp={pp} (--virtual-stages >= 2)"
    if recompute == "full":
        return "cannot run with full recomputation"
    if "moe" in (recompute_modules or ()):
        return "cannot run with 'moe' among the recomputed modules"
    if precision == "fp32":
        return "needs bf16 or fp16 training (precision fp32)"
    if (mtp_modules or 0) > 1:
        return f"runs at most one MTP layer ({mtp_modules})"
    return None


def a2a_overlap_runs(
    *,
    ep,
    pp,
    virtual_stages,
    full_recompute,
    precision: str,
    recompute_modules=(),
    mtp_modules: int = 0,
) -> np.ndarray:
    """Per candidate (arrays ep, pp, virtual_stages, full_recompute), whether Megatron-Core runs the
    expert-parallel exchange overlap: ep > 1 (TransformerConfig.__post_init__: 'only supported with
    expert model parallelism') and a2a_overlap_conflict finds nothing, over arrays for the search's
    cost term (cost_models.moe.ep_block_seconds); tests/test_free_overlaps.py checks the two agree on
    every combination."""
    static = a2a_overlap_conflict(
        pp=1,
        virtual_stages=1,
        recompute="none",
        precision=precision,
        recompute_modules=recompute_modules,
        mtp_modules=mtp_modules,
    )
    pp, v = np.asarray(pp), np.asarray(virtual_stages)
    staged = (pp <= 1) | (v > 1)
    return (static is None) & (np.asarray(ep) > 1) & staged & ~np.asarray(full_recompute, bool)


def check_moe_runnable(framework: FrameworkProfile, software, spec, cfg) -> None:
    """ConfigError (one line, the field the run option is named by) when a mixture-of-experts run asks `framework`
    for a token dispatcher, an exchange overlap or FP8 dispatch it has not (capabilities.moe_dispatchers,
    moe_a2a_overlap, moe_fp8_dispatch), or for the overlap where the stack cannot run it (a2a_overlap_conflict).
    Dense models route no tokens: nothing to check."""
    if getattr(spec, "moe", None) is None:
        return
    caps, name = framework.capabilities, framework.name

    def cannot(field, value, allowed, why):
        raise ConfigError(
            field,
            value,
            allowed,
            message=f"framework {name} cannot run this plan: {field}={value}: {why} (allowed: {allowed})",
        )

    if software.moe_dispatcher not in caps.moe_dispatchers:
        allowed = ", ".join(caps.moe_dispatchers)
        cannot(
            "moe_dispatcher",
            software.moe_dispatcher,
            allowed,
            f"{name} dispatches tokens with {allowed}",
        )
    if software.moe_a2a_overlap and not caps.moe_a2a_overlap:
        cannot(
            "moe_a2a_overlap",
            True,
            "false",
            f"{name} runs the expert-parallel exchange between the router and the "
            "experts, not under another micro-batch's computation",
        )
    if software.moe_a2a_overlap and cfg is not None and cfg.ep > 1:
        why = a2a_overlap_conflict(
            pp=cfg.pp,
            virtual_stages=cfg.virtual_stages,
            recompute=cfg.recompute,
            precision=cfg.precision,
            recompute_modules=software.recompute_modules,
            mtp_modules=spec.mtp_modules,
        )
        if why:
            cannot("moe_a2a_overlap", True, "false", f"the overlap {why}")
    if software.moe_fp8_dispatch and not caps.moe_fp8_dispatch:
        cannot(
            "moe_fp8_dispatch",
            True,
            "false",
            f"{name}'s dispatchers send the tokens in the compute dtype",
        )
