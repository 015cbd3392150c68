"""recommend(): resolve and check the request, narrow the space, search it, refine and document the
leaders, and rank the documents."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import numpy as np

from cost_models.compute import resolve_precision
from planner.candidates import SearchSpace
from planner.errors import ConfigError
from planner.option_rules import check_options
from planner.parallel import ParallelConfig, offloads
from planner.run_options import RunOptions
from planner.software import (
    check_activation_fp8_input,
    check_master_weights,
    check_moe_options,
    software_for,
)
from planner.search.branch_and_bound import score_space
from planner.search.documents import (
    _cp_versus,
    _ep_versus,
    _objective_value,
    _with_cost,
    key_numbers,
)
from planner.search.no_fit import no_fit_error, non_finite_error
from planner.search.refine import REFINE_TOP, fewest_recomputed_layers, uneven_stages
from planner.search.request import (
    _price_per_hour,
    _reliability_inputs,
    _resolve,
    default_global_batch,
    model_params,
)
from planner.search.results import Recommendation, rank
from planner.search.space import OBJECTIVES, check_space, config_of, held_dimensions


def recommend(
    model,
    hardware,
    *,
    gpus: int | None = None,
    nodes: int | None = None,
    global_batch: int | None = None,
    seq: int | None = None,
    precision: str | None = None,
    optimizer: str = "adamw",
    objective: str = "throughput",
    top: int = 5,
    spot: bool = False,
    price_per_hour: float | None = None,
    tokens: float | None = None,
    space: SearchSpace = SearchSpace(),
    refine: int = REFINE_TOP,
    progress: Callable[[int, int], None] | None = None,
    score_fn=None,
    estimate_fn=None,
    framework: str = "megatron",
    options: RunOptions | None = None,
    reliability=None,
) -> Recommendation:
    """Search the parallel strategies of `model` on `gpus` devices of `hardware` and rank them.

    `model` is a MODEL argument (catalog name, config.json, factory) or a resolved spec; `hardware`
    a profile name, path or HardwareProfile; `framework` the software stack (frameworks/*.json): only
    plans it can run are searched (SearchSpace.for_framework), costed with its profile, run with
    `options` (planner.run_options.RunOptions; None or an unset field: the framework's default), which
    score() and every estimate() that refines a leader take whole. With `options.bf16_optimizer` only
    ZeRO-1 without optimizer offload is searched (what DeepSpeed's BF16_Optimizer runs); with the MoE
    exchange overlap only plans Megatron-Core runs it with: interleaved stages when pipelined, no full
    recomputation (TransformerConfig.overlap_moe_expert_parallel_comm).
    With `tokens`, every plan document carries its goodput under failures (planner.goodput) from
    `reliability` (planner.goodput.ReliabilityInputs: the user's failure rates, restart time, storage,
    save mode, spot reclaim rate; None: the sourced defaults); objective "time-to-train" needs `tokens`.
    Raises ConfigError for bad input, NoFitError when no candidate fits in memory.
    """
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ConfigError("objective", objective, "one of " + ", ".join(OBJECTIVES))
    if top < 1:
        raise ConfigError("top", top, "a positive integer")
    reliability = _reliability_inputs(reliability, objective=objective, tokens=tokens, spot=spot)
    model, hardware, world, n_nodes = _resolve(model, hardware, gpus, nodes, seq)
    from frameworks.rules import check_moe_runnable

    options = options or RunOptions()
    software = software_for(framework, options)
    check_activation_fp8_input(software, model)
    precision = resolve_precision(
        hardware, precision
    )  # None: bf16 mixed precision where the device has bf16
    check_moe_options(model, precision, options)
    # what the stack cannot run whatever the degrees (the overlap's per-plan conditions restrict the space below)
    check_moe_runnable(
        software.framework,
        software,
        model,
        ParallelConfig(
            dp=2,
            ep=2,
            global_batch=2,
            placement="PDET",
            precision=precision,
            framework=software.framework.name,
        ),
    )
    check_master_weights(software, precision)
    ParallelConfig(
        precision=precision, optimizer=optimizer, framework=software.framework.name
    )  # validates them
    from frameworks.rules import violations

    problems = violations(
        software.framework, ParallelConfig(precision=precision, framework=software.framework.name)
    )
    if problems:
        raise ConfigError(
            "precision",
            precision,
            f"a precision {software.framework.name} runs",
            message=f"framework {software.framework.name} cannot run this plan: {problems[0]}",
        )
    seq = seq or model.seq
    check_space(space, model, software.framework, world=world, seq=seq)
    space = space.for_framework(software.framework, model)
    if software.bf16_optimizer:  # BF16_Optimizer shards like ZeRO-1 and runs its step on the device
        space = replace(
            space,
            zero=(1,),
            zero_with_pp=(1,),
            offload=tuple(o for o in space.offload if not offloads(o, "optimizer")),
        )
    held = {}
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
    global_batch = global_batch or default_global_batch(world, seq, model_params(model))
    price = _price_per_hour(hardware, n_nodes, spot, price_per_hour)
    # the one rule (planner.option_rules), for the Python API as for the commands
    check_options(
        objective=objective, hardware=hardware.name, price=price, price_per_hour=price_per_hour
    )
    if estimate_fn is None:
        from planner.estimate import estimate as estimate_fn

    scored = score_space(
        model,
        hardware,
        world_size=world,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        space=space,
        score_fn=score_fn,
        objective=objective,
        keep=max(top, refine) + 1,
        software=software,
        progress=progress,
    )
    order = rank(scored, objective)
    if len(order) == 0 and np.any(scored.fits):
        raise non_finite_error(scored, hardware)
    if len(order) == 0:
        raise no_fit_error(
            scored,
            model=model,
            hardware=hardware,
            world_size=world,
            global_batch=global_batch,
            seq=seq,
            precision=precision,
            optimizer=optimizer,
            space=space,
            framework=software.framework.name,
            held=held,
        )

    kw = dict(
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
        framework=software.framework.name,
    )
    leaders = [config_of(scored.arrays, int(i), **kw) for i in order[: max(top, refine) + 1]]
    documents, refined, splits = [], [0], {}

    def document(cfg: ParallelConfig, refine_it: bool) -> dict:
        """estimate()'s plan document of cfg; with refine_it, of its uneven split when that is better, and of
        full recomputation of fewer blocks per chunk when that fits and is better (fewest_recomputed_layers). The
        split does not depend on the placement (stage_problem reads none), so placement twins share one."""
        doc = split_document(cfg, refine_it)
        if refine_it and objective != "memory":
            plan = doc["plan"]
            best = replace(cfg, stages=tuple(plan["stages"]) if plan.get("stages") else cfg.stages)
            n = fewest_recomputed_layers(
                model,
                hardware,
                best,
                software=software,
                capacity=scored.capacity_bytes,
                score_fn=score_fn,
                global_batch=global_batch,
                seq=seq,
                precision=precision,
                optimizer=optimizer,
            )
            if n is not None:
                refined[0] += 1
                fewer = estimate_fn(
                    model, hardware, replace(best, recompute_layers=n), gpus=world, options=options
                ).to_document()
                if fewer["prediction"]["memory"]["fits"] and _objective_value(
                    fewer, objective
                ) < _objective_value(doc, objective):
                    return fewer
        return doc

    def split_document(cfg: ParallelConfig, refine_it: bool) -> dict:
        """estimate()'s plan document of cfg; with refine_it, of its uneven split when that is better."""
        doc = estimate_fn(model, hardware, cfg, gpus=world, options=options).to_document()
        if refine_it and cfg.pp > 1 and software.framework.capabilities.uneven_stages:
            twin = tuple(
                (k, tuple(v) if isinstance(v, list) else v)
                for k, v in cfg.to_dict().items()
                if k != "placement"
            )
            stages = (
                splits[twin]
                if twin in splits
                else splits.setdefault(twin, uneven_stages(model, cfg, software))
            )
            if stages:
                refined[0] += 1
                uneven = estimate_fn(
                    model, hardware, replace(cfg, stages=stages), gpus=world, options=options
                ).to_document()
                if uneven["prediction"]["memory"]["fits"] and _objective_value(
                    uneven, objective
                ) < _objective_value(doc, objective):
                    return uneven
        return doc

    for position, cfg in enumerate(leaders):
        documents.append(document(cfg, position < refine))
    documented = list(zip(order[: len(leaders)], documents))
    documents = [d for d in documents if d["prediction"]["memory"]["fits"]] or documents
    documents = [_with_cost(d, price, spot, tokens, hardware, reliability) for d in documents]
    documents.sort(key=lambda d: _objective_value(d, objective))
    documents = documents[:top]

    versus = _cp_versus(
        scored,
        objective,
        documents[0],
        lambda i: document(config_of(scored.arrays, i, **kw), refine > 0),
    )
    ep_versus = _ep_versus(
        scored,
        objective,
        model,
        hardware,
        software,
        documented,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
    )
    stats = replace(
        scored.stats,
        seconds=time.perf_counter() - t0,
        refined=refined[0],
        held=held_dimensions(software.framework, model),
    )
    best = dict(documents[0])
    best["alternatives"] = [key_numbers(d) for d in documents[1:]]
    best["search"] = {
        "objective": objective,
        "candidates_evaluated": stats.candidates_evaluated,
        "feasible": stats.feasible,
        "seconds": round(stats.seconds, 4),
        "values_tried": {k: list(v) for k, v in stats.values_tried.items()},
        "cp_versus": versus,
        **({"held": dict(stats.held)} if stats.held else {}),
        **({"ep_versus": ep_versus} if ep_versus is not None else {}),
    }
    return Recommendation(
        objective=objective,
        best=best,
        alternatives=tuple(documents[1:]),
        stats=stats,
        scored=scored,
    )
