"""Refinement of the leaders: pipeline stages re-split unevenly (planner.partition) and full
recomputation of fewer blocks per chunk, each re-scored before estimate() documents it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import planner.estimate as estimate_module  # its estimate is read at call time
from planner.errors import ConfigError
from planner.parallel import ParallelConfig
from planner.search.documents import _objective_value
from planner.search.request import Setup
from planner.software import MEMORY_OVERLAPS, plan_options, software_for
from planner.estimate import candidate_of
from planner.partition import PartitionProblem, even_split, split
from planner.score import CandidateArrays, score
from cost_models import activations as A
from cost_models import flops as F
from cost_models import params as P
from cost_models.memory import state_bytes_per_param
from cost_models.activations import activation_precision


CPSAT_MAX_CHUNKS = 16
"""Interleaved candidates with more chunks than this keep the even split (CP-SAT grows slow there)."""


CPSAT_TIME_LIMIT_S = 1.0


def stage_problem(model, cfg: ParallelConfig, software=None):
    """Per-block work and memory weights of one micro-batch on one tensor-parallel rank, for
    planner.partition: block FLOPs (forward + backward + recompute) from cost_models.flops, weights
    from cost_models.params, activations from cost_models.activations (the block tables the cost
    model reads) and model states from the framework's table (cost_models.memory.state_bytes_per_param,
    sharded as the plan's ZeRO stage shards them). The embedding is on stage 0; final norm, LM head
    and loss on the last stage. Static bytes only break ties between equally fast splits; whether a
    split fits is decided by estimate() afterwards."""

    sw = software or software_for(cfg.framework)
    b, s, tp = cfg.micro_batch, cfg.seq, cfg.tp
    blocks = model.total_blocks
    block_work = (
        F.block_flops_fwd(model, b, s)
        + F.block_flops_bwd(model, b, s)
        + F.block_recompute_flops(
            model, b, s, cfg.recompute, selective=sw.framework.selective_recompute
        )
    ) / tp
    head_work = 3 * F.head_flops_fwd(model, b, s) / tp
    pb, gb, ob = state_bytes_per_param(sw, cfg.precision, cfg.optimizer)
    dp = cfg.shard_group
    shard = (
        (pb / (dp if cfg.zero >= 3 else 1))
        + (gb / (dp if cfg.zero >= 2 else 1))
        + (ob / (dp if cfg.zero >= 1 else 1))
    )
    block_static = P.block_params(model) / tp * shard

    act = dict(
        precision=activation_precision(sw, cfg.precision, cfg.zero), tp=tp, sp=cfg.sequence_parallel
    )
    # the block as the run saves it: the table and selective policy estimate reads (its options included)
    block_act = A.block_bytes_of(
        sw,
        model,
        b,
        s,
        precision=cfg.precision,
        zero=cfg.zero,
        tp=tp,
        sp=cfg.sequence_parallel,
        recompute=cfg.recompute,
    )
    # with pp > 1 a tied output head is a second copy on the last stage, summed with the embedding's
    # gradient once per step (Megatron's embedding group; Shoeybi et al. 2019)
    tied_copy = model.vocab * model.hidden if model.tied_embeddings else 0
    chunks = cfg.pp * cfg.virtual_stages
    inflight = tuple(
        max(1, cfg.pp - (c % cfg.pp)) if cfg.schedule != "gpipe" else cfg.num_microbatches
        for c in range(chunks)
    )
    return PartitionProblem(
        block_work=(float(block_work),) * blocks,
        block_static_bytes=(float(block_static),) * blocks,
        block_activation_bytes=(float(block_act),) * blocks,
        pp=cfg.pp,
        virtual_stages=cfg.virtual_stages,
        first_work=0.0,
        first_static_bytes=P.embedding_params(model) / tp * shard,
        first_activation_bytes=float(A.embedding_bytes(model, b, s, dropout=sw.dropout, **act)),
        last_work=float(head_work),
        last_static_bytes=(P.head_params(model) + P.final_norm_params(model) + tied_copy)
        / tp
        * shard,
        last_activation_bytes=float(A.head_bytes(model, b, s, kernels=sw.framework.kernels, **act)),
        inflight=inflight,
    )


def fewest_recomputed_layers(
    model,
    hardware,
    cfg: ParallelConfig,
    *,
    software,
    capacity: float,
    score_fn=None,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str,
) -> int | None:
    """For a plan with full recomputation, the number of blocks per pipeline chunk to recompute
    (ParallelConfig.recompute_layers) that gives the shortest step and still fits: every count from 1 to the
    largest chunk's blocks less one scored at once by the vectorized cost model (fewer recomputed blocks:
    less time, more memory). None when the framework recomputes every block only
    (capabilities.recompute_layers), the plan does not recompute fully, or no smaller count fits."""
    if (
        cfg.recompute != "full"
        or not software.framework.capabilities.recompute_layers
        or not hasattr(model, "total_blocks")
    ):
        return None

    score_fn = score_fn or score
    counts = np.arange(1, cfg.largest_chunk(model.total_blocks))
    if len(counts) == 0:
        return None
    one = candidate_of(replace(cfg, recompute_layers=None), model.total_blocks)
    arrays = {
        f: (None if getattr(one, f) is None else np.repeat(getattr(one, f), len(counts), axis=0))
        for f in CandidateArrays.__dataclass_fields__
    }
    arrays["recompute_layers"] = counts
    scores = score_fn(
        model,
        hardware,
        CandidateArrays(**arrays),
        software=software,
        global_batch=global_batch,
        seq=seq,
        precision=precision,
        optimizer=optimizer,
    )
    needed = np.asarray(getattr(scores, "needed_bytes", scores.peak_bytes_per_gpu), dtype=float)
    step = np.asarray(scores.step_time_s, dtype=float)
    ok = (needed <= capacity) & np.isfinite(step)
    if not ok.any():
        return None
    return int(counts[ok][np.argmin(step[ok])])


def splittable(cfg: ParallelConfig) -> bool:
    """pp > 1 and few enough chunks for the exact solver's time limit (CPSAT_MAX_CHUNKS)."""
    return cfg.pp > 1 and (
        cfg.virtual_stages == 1 or cfg.pp * cfg.virtual_stages <= CPSAT_MAX_CHUNKS
    )


def uneven_stages(model, cfg: ParallelConfig, software=None) -> tuple[int, ...]:
    """The fastest contiguous split of the blocks for cfg (empty when pp = 1 or the model has no blocks), weighed
    with the run's software (its options change what a block saves; stage_problem)."""
    if not splittable(cfg) or not hasattr(model, "total_blocks"):
        return ()
    try:
        part = split(stage_problem(model, cfg, software), time_limit_s=CPSAT_TIME_LIMIT_S)
    except ConfigError:  # no split within the limits: keep the even one
        return ()
    return (
        ()
        if part.stages == even_split(model.total_blocks, cfg.pp * cfg.virtual_stages)
        else part.stages
    )


class Refiner:
    """estimate()'s plan documents of a search's leaders (`document`), refined where that is better,
    counting the refinements tried (`refined`, SearchStats.refined)."""

    def __init__(self, setup: Setup, capacity: float):
        self.setup, self.capacity = setup, capacity
        self.estimate_fn = setup.request.estimate_fn or estimate_module.estimate
        self.refined = 0
        self.splits: dict = {}

    def _estimate(self, cfg: ParallelConfig) -> dict:
        """estimate()'s document of cfg with its free overlaps on where it can run them
        (planner.software.plan_options), and those that cost memory (MEMORY_OVERLAPS) off where
        on it does not fit (planner.search.overlaps)."""
        s = self.setup
        options = plan_options(s.options, s.free_overlaps, cfg, s.model)
        doc = self._document(cfg, options)
        if doc["prediction"]["memory"]["fits"]:
            return doc
        free = tuple(name for name in s.free_overlaps if name not in MEMORY_OVERLAPS)
        without = plan_options(s.options, free, cfg, s.model)
        return doc if without == options else self._document(cfg, without)

    def plan_document(self, cfg: ParallelConfig) -> dict:
        """estimate()'s plan document of cfg as the leaders' are made (`_estimate`), unrefined."""
        return self._estimate(cfg)

    def _document(self, cfg: ParallelConfig, options) -> dict:
        s = self.setup
        return self.estimate_fn(
            s.model, s.hardware, cfg, gpus=s.workload.world_size, options=options
        ).to_document()

    def document(self, cfg: ParallelConfig, refine_it: bool) -> dict:
        """estimate()'s plan document of cfg; with refine_it, of its uneven split when that is better, and of
        full recomputation of fewer blocks per chunk when that fits and is better (fewest_recomputed_layers). The
        split does not depend on the placement (stage_problem reads none), so placement twins share one."""
        s, objective = self.setup, self.setup.request.objective
        doc = self.split_document(cfg, refine_it)
        if refine_it and objective != "memory":
            plan = doc["plan"]
            best = replace(cfg, stages=tuple(plan["stages"]) if plan.get("stages") else cfg.stages)
            n = fewest_recomputed_layers(
                s.model,
                s.hardware,
                best,
                software=s.software,
                capacity=self.capacity,
                score_fn=s.request.score_fn,
                **s.workload.score_kw(),
            )
            if n is not None:
                self.refined += 1
                fewer = self._estimate(replace(best, recompute_layers=n))
                if _better(fewer, doc, objective):
                    return fewer
        return doc

    def split_document(self, cfg: ParallelConfig, refine_it: bool) -> dict:
        """estimate()'s plan document of cfg; with refine_it, of its uneven split when that is better."""
        s, objective, splits = self.setup, self.setup.request.objective, self.splits
        doc = self._estimate(cfg)
        if refine_it and cfg.pp > 1 and s.software.framework.capabilities.uneven_stages:
            twin = tuple(
                (k, tuple(v) if isinstance(v, list) else v)
                for k, v in cfg.to_dict().items()
                if k != "placement"
            )
            stages = (
                splits[twin]
                if twin in splits
                else splits.setdefault(twin, uneven_stages(s.model, cfg, s.software))
            )
            if stages:
                self.refined += 1
                uneven = self._estimate(replace(cfg, stages=stages))
                if _better(uneven, doc, objective):
                    return uneven
        return doc


def _better(candidate: dict, doc: dict, objective: str) -> bool:
    """A refinement replaces a leader's document when it fits and scores better."""
    return bool(candidate["prediction"]["memory"]["fits"]) and _objective_value(
        candidate, objective
    ) < _objective_value(doc, objective)
