"""Strategy search: every valid candidate scored by the vectorized cost model or proven out by a bound.

Pipeline (docs/style.md's one-way flow): candidates (planner.candidates: dp x tp x pp x cp with cp_comm,
dp_shard, ep, schedule, ZeRO, offload, micro-batch, recompute, sequence parallelism, placement) ->
best-first branch and bound over "shapes" with time and memory lower bounds -> vectorized scores
(planner.score.score, numpy over arrays) -> ranking by the objective -> uneven stages for the leaders
(planner.partition) re-scored with the scalar `estimate()` -> near-miss plans (an even split over the
memory) re-split under a memory cap, joining the ranking when estimate() says they fit -> plan documents.

Bounds (`_BranchAndBound`; the premises are checked on the real scorer in tests/test_search.py). A
row is a skeleton (SKELETON_FIELDS) with a micro-batch; a group is a row with a placement and a
sequence-parallel choice, whose members are the recompute levels; a shape is a group without its
model-state knobs (ZeRO stage, dp_shard, offload) and with placements that lay T and C on the same
ranks merged (`placement_classes`). The step is never shorter than compute + tp, cp comm + bubble,
pipeline p2p and data-parallel bounds + optimizer (TIME_BOUND_TERMS); within a group that sum is
least at the weakest recompute and grows along RECOMPUTE; all of it but the p2p, data-parallel and
optimizer terms (SHAPE_BOUND_TERMS) is the same for every candidate of a shape with the same
sequence-parallel choice. So one scorer call -- each shape's representative at the weakest recompute
with sequence parallelism on, and off too for a shape holding both choices that the first would
prove out (the lesser bounds it) -- bounds every candidate of every shape. Shapes are expanded best
first while their bound is below the admission threshold (the `keep`-th best feasible step known for
throughput, cost and time-to-train, the best plus 5 % for memory; it only falls as candidates are
scored); a group's first is scored only if its shape's terms plus its pipeline p2p (read off the
shape's representative row with the same placement and sequence parallelism) and its skeleton's
optimizer step (scored once per skeleton) are below it, each stronger recompute level only if the
previous level's bound is, and a member with sequence parallelism off is dropped when its twin with
it on (which never needs more memory) does not fit. The best plan with cp = 1 and the best with cp >
1 are each found exactly (the threshold of each class never falls below its best known step), so
that `explain` can say why the chosen cp wins; the expert-parallel time every step runs
(EP_BOUND_TERM) is added to the bound only against the threshold raised to the candidate's
expert-parallel class's best scored step, so that each class keeps the fastest scored plan `explain`
compares (planner.search.documents._ep_versus).

Objectives:
- throughput: least step time among the candidates that fit (default);
- cost: least dollars per 1B tokens at the profile's on-demand (or `spot`) node price; with the world
  size fixed this orders candidates as throughput does, and the plan carries the dollar figures;
- memory: least peak memory per GPU among candidates within 5 % of the best step time;
- time-to-train: least expected wall time of a run of `tokens` tokens under failures, checkpoints and
  restarts (planner.goodput, docs/goodput.md); candidates enter by step time as for throughput and the
  leaders' documents are ranked by their goodput-adjusted time. With `tokens`, cost also ranks the
  leaders by their goodput-adjusted dollars, and every plan document carries its goodput.

Modules (each imports only those above it):
- space: the objectives, the degree rules' view of a model, the values tried and held, the space the
  run options narrow, check_space, Workload (what every candidate shares) and config_of;
- request: SearchRequest (recommend's keywords as one record), prepare() -> Setup (resolved, checked);
- results: SearchStats, ScoredSpace and rank, SearchSummary, Recommendation;
- overlaps: the overlaps left unset that the search chooses per plan (FreeOverlapScorer: on unless
  their buffers make the plan miss the memory; search_scoring, settled, turned_on);
- bounds: Admission, the scorer, the bound terms, the admission thresholds, the placement classes;
- branch_and_bound: score_space (best first over shapes with the bounds);
- no_fit: the errors of a search that ranks nothing;
- documents: cost and goodput of the leaders' documents, their ranking, cp_versus and ep_versus;
- refine: uneven stages and fewer recomputed blocks for the leaders (Refiner);
- near_miss: the plans whose even split misses the memory re-split under a memory cap (near_misses;
  its docstring states the set of plans covered);
- pipeline: recommend(), the orchestration.
"""

from __future__ import annotations

from planner.search.space import (
    MEMORY_OBJECTIVE_SLACK,
    OBJECTIVES,
    SEARCHED_DIMENSIONS,
    Workload,
    check_space,
    config_of,
    ep_costed,
    held_dimensions,
    narrowed,
    values_tried,
)
from planner.search.request import (
    DEFAULT_BATCH_TOKENS,
    REFINE_TOP,
    TINY_MODEL_PARAMS,
    TINY_SEQUENCES_PER_RANK,
    SearchRequest,
    Setup,
    default_global_batch,
    model_params,
    prepare,
)
from planner.search.results import Recommendation, ScoredSpace, SearchStats, SearchSummary, rank
from planner.search.bounds import (
    SCORE_CHUNK,
    SHAPE_BOUND_TERMS,
    SHAPE_FIELDS,
    TIME_BOUND_TERMS,
    Admission,
    placement_classes,
)
from planner.search.branch_and_bound import score_space
from planner.search.no_fit import no_fit_error, non_finite_error, unranked_error
from planner.search.documents import key_numbers, ranked_documents
from planner.search.refine import (
    CPSAT_MAX_CHUNKS,
    CPSAT_TIME_LIMIT_S,
    Refiner,
    fewest_recomputed_layers,
    stage_problem,
    uneven_stages,
)
from planner.search.pipeline import recommend

__all__ = [
    "MEMORY_OBJECTIVE_SLACK",
    "OBJECTIVES",
    "SEARCHED_DIMENSIONS",
    "Workload",
    "check_space",
    "config_of",
    "ep_costed",
    "held_dimensions",
    "narrowed",
    "values_tried",
    "DEFAULT_BATCH_TOKENS",
    "REFINE_TOP",
    "TINY_MODEL_PARAMS",
    "TINY_SEQUENCES_PER_RANK",
    "SearchRequest",
    "Setup",
    "default_global_batch",
    "model_params",
    "prepare",
    "Recommendation",
    "ScoredSpace",
    "SearchStats",
    "SearchSummary",
    "rank",
    "SCORE_CHUNK",
    "SHAPE_BOUND_TERMS",
    "SHAPE_FIELDS",
    "TIME_BOUND_TERMS",
    "Admission",
    "placement_classes",
    "score_space",
    "no_fit_error",
    "non_finite_error",
    "unranked_error",
    "key_numbers",
    "ranked_documents",
    "CPSAT_MAX_CHUNKS",
    "CPSAT_TIME_LIMIT_S",
    "Refiner",
    "fewest_recomputed_layers",
    "stage_problem",
    "uneven_stages",
    "recommend",
]
