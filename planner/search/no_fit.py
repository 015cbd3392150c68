"""The errors of a search that ranks nothing: how far the leanest candidate misses and what would
make one fit (NoFitError), or a profile that makes every step infinite."""

from __future__ import annotations

import math

import numpy as np

from planner.candidates import SearchSpace
from planner.errors import ConfigError, NoFitError, PlannerError
from planner.search.request import Setup
from planner.search.results import NearMisses, ScoredSpace
from planner.search.space import Workload
from hardware_profiles import available_profiles, load_profile


def unranked_error(
    scored: ScoredSpace, setup: Setup, near: NearMisses = NearMisses()
) -> PlannerError:
    """Why a search ranks no candidate: some fit but none has a finite step (non_finite_error), or
    none fits, not even re-split unevenly (no_fit_error with `near`)."""
    if np.any(scored.fits):
        return non_finite_error(scored, setup.hardware)
    return no_fit_error(
        scored,
        model=setup.model,
        hardware=setup.hardware,
        workload=setup.workload,
        space=setup.space,
        held=setup.held,
        near=near,
    )


def no_fit_error(
    scored: ScoredSpace,
    *,
    model,
    hardware,
    workload: Workload,
    space: SearchSpace,
    held: dict[str, str] | None = None,
    near: NearMisses = NearMisses(),
) -> NoFitError:
    """How far the leanest candidate misses and what would make one fit (exit 3). `held` names the run option
    that kept a knob out of the search (e.g. full recompute: moe_a2a_overlap), where it was not the framework;
    `near`, the near-miss plans re-split unevenly that still missed (planner.search.near_miss)."""
    i = int(np.argmin(scored.leanest_needed_bytes))
    need = float(scored.leanest_needed_bytes[i])
    cap = scored.capacity_bytes
    cfg = workload.config(scored.leanest_arrays, i)
    world_size, framework = workload.world_size, workload.framework
    per_node = hardware.devices_per_node
    more = math.ceil(world_size * need / cap / per_node) * per_node
    fixes = [
        f"more GPUs (about {more}, {more // per_node} nodes: static memory shrinks roughly as 1/GPUs)"
    ]
    untried = []
    if 3 not in space.zero:
        untried.append("ZeRO-3")
    if "full" not in space.recompute:
        untried.append("full recompute")
    if "optimizer" not in space.offload:
        untried.append("optimizer offload")
    held = held or {}
    by_option = [f"{knob} (held by {held[knob]})" for knob in untried if knob in held]
    by_stack = [knob for knob in untried if knob not in held]
    if by_stack:
        fixes.append(
            "allow "
            + ", ".join(by_stack)
            + f" (not available on {framework}: try another --framework)"
        )
    if by_option:
        fixes.append("drop the run option that holds " + ", ".join(by_option))
    bigger = _larger_devices(hardware, need)
    if bigger:
        fixes.append("a larger device (" + ", ".join(bigger) + ")")
    fixes.append("a shorter --seq")
    cp = f" cp={cfg.cp}" if cfg.cp > 1 else ""
    tried = (
        f"dp={cfg.dp} tp={cfg.tp} pp={cfg.pp}{cp} micro_batch=1 zero={cfg.zero} recompute={cfg.recompute} "
        f"offload={cfg.offload}, the least memory over every degree, ZeRO stage, recompute and offload searched"
    )
    return NoFitError(
        f"no plan fits in {cap / 2**30:.1f} GiB per GPU on {world_size} x {hardware.name}: the leanest candidate "
        f"({tried}) needs {need / 2**30:.1f} GiB, {(need - cap) / 2**30:.1f} GiB ({need / cap - 1:.0%}) too much; "
        + _uneven_tried(near)
        + "it would fit with "
        + "; or ".join(fixes)
    )


def _uneven_tried(near: NearMisses) -> str:
    """The clause on the uneven stage splits tried (empty when none was): how many near-miss plans
    were re-split and, of the splits that still missed, the one that needs least."""
    if not near.resplit:
        return ""
    plans = f"{near.resplit} near-miss plan{'s' if near.resplit > 1 else ''}"
    if near.closest is None:
        return f"no uneven stage split of {plans} fits under the cap; "
    plan, memory = near.closest["plan"], near.closest["prediction"]["memory"]
    return (
        f"an uneven stage split of {plans} still missed (closest: dp={plan['dp']} tp={plan['tp']} "
        f"pp={plan['pp']} stages={plan['stages']} needs {memory['needed_bytes'] / 2**30:.1f} GiB); "
    )


def non_finite_error(scored: ScoredSpace, hardware) -> ConfigError:
    """Candidates fit but none has a finite step time: the profile makes some term impossible."""
    n = int(np.sum(scored.fits & ~np.isfinite(scored.step_time_s)))
    return ConfigError(
        "hardware",
        hardware.name,
        "a profile with positive efficiencies and bandwidths",
        message=f"hardware={hardware.name!r}: every candidate that fits ({n:,}) has an infinite or "
        f"undefined step time; a zero efficiency, rate or bandwidth in the profile makes "
        f"some term impossible",
    )


def _larger_devices(hardware, need_bytes: float) -> list[str]:
    try:
        names = available_profiles()
    except Exception:  # noqa: BLE001 - suggestions only; the error itself must still be raised
        return []
    out = []
    for name in names:
        try:
            profile = load_profile(name)
        except Exception:  # noqa: BLE001
            continue
        if profile.memory_bytes >= need_bytes and profile.name != hardware.name:
            out.append(f"{profile.name} {profile.memory_bytes / 2**30:.0f} GiB")
    return out
