"""A plan made for one framework, exported to another: re-check it against the target's capabilities
(frameworks.rules.violations, the one rule set) and say what changes.

Only substitutions that keep the model, the batch and the parallel degrees and need no more memory
are made: a ZeRO stage the target lacks becomes the next stronger one it has (more sharding, less
memory), sequence parallelism is switched on where the target always applies it (less memory), a
rank order the target cannot build becomes its own (speed only), a GPipe schedule becomes 1F1B (same
bubble, less memory). Anything else the target cannot run is refused, naming it. The changed plan is
re-estimated on the target's framework profile, and the notes give the old and the new prediction.
"""

from __future__ import annotations

import dataclasses

from frameworks import FrameworkProfile, load_framework
from frameworks.rules import fp8_scaling_problem, placement_allowed, violations
from planner.errors import ConfigError
from planner.parallel import ParallelConfig
from planner.plan import fp8_scaling_of, run_options
from planner.estimate import estimate
from planner.exports.common import model_spec
from planner.plan import plan_from_document

FORMAT_FRAMEWORK = {
    "torchtitan": "torchtitan",
    "megatron": "megatron",
    "fsdp": "fsdp",
    "deepspeed": "deepspeed",
}
"""Export formats that are one of the costed frameworks (the SageMaker formats are AWS's own stack)."""


_THE_SOURCE_STACKS_OWN = {
    "kernels": "a swap of the stack's modules for another's, made",
    "compile": "torch.compile on the blocks, which the other stacks' exports do not switch on,",
    "train_metrics": "the trainer's per-micro-batch train metrics (Composer's), which the other "
    "stacks' training loops do not compute,",
}
"""Run options a plan keeps on its own stack only: another stack runs its own modules as its own
export launches them."""


def substitutions(
    cfg: ParallelConfig, target: FrameworkProfile
) -> tuple[ParallelConfig, list[str]]:
    """The nearest configuration `target` runs, by memory-safe substitutions only, and what changed."""
    caps, changes = target.capabilities, []
    new = dataclasses.replace(cfg, framework=target.name)
    zero_ok = caps.zero_with_pp if cfg.pp > 1 and cfg.dp > 1 else caps.zero
    if cfg.dp > 1 and cfg.zero not in zero_ok:
        stronger = [z for z in sorted(zero_ok) if z > cfg.zero]
        if stronger:
            new = dataclasses.replace(new, zero=stronger[0])
            changes.append(
                f"ZeRO-{cfg.zero} -> ZeRO-{stronger[0]} ({target.name} has no ZeRO-{cfg.zero}; it shards more)"
            )
    if cfg.tp > 1 and caps.sequence_parallel == "always" and not cfg.sequence_parallel:
        new = dataclasses.replace(new, sequence_parallel=True)
        changes.append(
            f"sequence parallelism on ({target.name} always applies it with tensor parallelism)"
        )
    if (
        cfg.pp > 1
        and cfg.schedule == "gpipe"
        and "gpipe" not in caps.schedules
        and "1f1b" in caps.schedules
    ):
        new = dataclasses.replace(new, schedule="1f1b")
        changes.append(
            f"schedule gpipe -> 1f1b ({target.name} has no GPipe; same bubble, fewer micro-batches in flight)"
        )
    degrees = {"D": cfg.dp, "P": cfg.pp, "T": cfg.tp, "C": cfg.cp, "E": cfg.ep}
    if caps.placements and not placement_allowed(
        target, cfg.placement, cp=cfg.cp, ep=cfg.ep, degrees=degrees
    ):
        own = caps.placements[0]
        placement = "".join(
            a for a in own if a in cfg.placement or degrees.get(a, 1) > 1 or a in "DPT"
        )
        new = dataclasses.replace(new, placement=placement)
        changes.append(
            f"placement {cfg.placement} -> {placement} (the rank order {target.name} builds)"
        )
    return new, changes


def framework_refusals(plan, fmt: str) -> list[str]:
    """What the target's framework cannot run of `plan` after the memory-safe substitutions (empty when
    `fmt` is not one of the costed frameworks or it can run it)."""
    name = FORMAT_FRAMEWORK.get(fmt)
    if name is None:
        return []
    target = load_framework(name)
    cfg = plan.config if name == plan.config.framework else substitutions(plan.config, target)[0]
    return violations(target, cfg)


def retarget(plan, fmt: str):
    """(plan for the target, notes) when `fmt` is another framework than the plan's; the plan itself
    and no notes otherwise. ConfigError (one line) when the target cannot run it."""
    name = FORMAT_FRAMEWORK.get(fmt)
    if name is None:
        return plan, []
    target = load_framework(name)
    scaling = fp8_scaling_of(plan.document)
    if name == plan.config.framework:
        problems = list(violations(target, plan.config))
        recipe_problem = fp8_scaling_problem(target, scaling)
        if recipe_problem:  # a plan file written before estimate checked the stack's recipes
            problems.append(recipe_problem)
        if problems:
            raise _cannot(fmt, problems)
        return plan, []
    new_cfg, changes = substitutions(plan.config, target)
    problems = violations(target, new_cfg)
    if problems:
        raise _cannot(fmt, problems, made_for=plan.config.framework)
    recipe = _settled_recipe(scaling, target, changes)
    spec = model_spec(plan)
    later = []
    document = dict(plan.document)
    est = None
    if spec is not None:
        options = run_options(plan.document)
        if recipe is not None:  # the stacks' defaults differ: say it, or it changes silently
            options = dataclasses.replace(options, fp8_scaling=recipe)
        for option, why in _THE_SOURCE_STACKS_OWN.items():
            if option in options.chosen():
                changes.append(f"{option} dropped ({why} on {plan.config.framework})")
                options = options.without(option)
        while True:
            try:
                est = estimate(spec, plan.hardware_name, new_cfg, gpus=plan.gpus, options=options)
                break
            except ConfigError as err:
                if (
                    err.field in options.chosen()
                ):  # a run option the target's stack has not: without it
                    changes.append(f"{err.field} dropped ({err})")
                    options = options.without(err.field)
                    continue
                # a dimension this build does not cost yet (expert parallelism)
                later.append(
                    f"not re-estimated on {name} ({err}); the plan's own prediction is kept"
                )
                break
        if est is not None:
            document = est.to_document()
            changes += _default_changes(plan, document, options)
    notes = [
        f"plan made for {plan.config.framework}, exported to {name}: "
        + ("; ".join(changes) or "no change needed"),
        *later,
    ]
    if est is not None:
        for key in ("alternatives", "search"):
            if key in plan.document:
                document[key] = plan.document[key]
        if (
            "checkpoint_interval_s" in plan.document["plan"]
        ):  # a wall-clock interval: it carries over
            document["plan"]["checkpoint_interval_s"] = plan.document["plan"][
                "checkpoint_interval_s"
            ]
        old = plan.prediction
        notes.append(
            f"on {name} the cost model predicts {est.step_time_s:.3f} s/step (plan: {old.step_time_s:.3f} s on "
            f"{plan.config.framework}), peak {est.peak_bytes_per_gpu / 2**30:.1f} GiB per GPU"
            + ("" if est.fits else ", which does NOT fit")
        )
    else:
        document["plan"] = dict(
            document["plan"],
            **{
                k: v
                for k, v in new_cfg.to_dict().items()
                if k in document["plan"] or k in ("framework",)
            },
        )
        if recipe is not None:
            document["software"] = {**(document.get("software") or {}), "fp8_scaling": recipe}
    return plan_from_document(document), notes


def _default_changes(plan, moved: dict, options) -> list[str]:
    """The stack defaults an FP8 plan changes with its stack, said (run_options carries only what
    the plan chose): whether its GEMM weights are held and gathered in FP8 (fp8_param_gather), a
    default of each stack and of its recipe (cost_models.step.Software.of: off under nvfp4).
    `moved`: the re-estimated plan's document."""
    if plan.config.precision != "fp8" or options.fp8_param_gather is not None:
        return []
    if min(plan.config.zero, moved["plan"]["zero"]) < 1:  # no distributed optimizer, no gather
        return []
    before = (plan.document.get("software") or {}).get("fp8_param_gather")
    after = moved["software"].get("fp8_param_gather")
    if before is None or after is None or bool(before) == bool(after):
        return []
    word = {True: "on", False: "off"}
    return [
        f"fp8_param_gather {word[bool(before)]} -> {word[bool(after)]} "
        f"({moved['software']['framework']}'s default under {moved['software'].get('fp8_scaling')})"
    ]


def _settled_recipe(scaling: str | None, target: FrameworkProfile, changes: list[str]):
    """The FP8 recipe the exported job runs: the plan's where the target runs it, else the target's
    default, said in `changes`; None for a plan without FP8."""
    if scaling is None or fp8_scaling_problem(target, scaling) is None:
        return scaling
    changes.append(
        f"fp8_scaling {scaling} -> {target.fp8_scaling} ({target.name} runs "
        + ", ".join(target.capabilities.fp8_scalings)
        + ")"
    )
    return target.fp8_scaling


def _cannot(fmt: str, problems: list[str], made_for: str | None = None) -> ConfigError:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    origin = f"the plan (made for {made_for}) " if made_for else "the plan "
    return ConfigError(
        "format",
        fmt,
        "a target that can run this plan",
        message=f"cannot export to {fmt}: {origin}asks for {problems[0]}{more}",
    )
