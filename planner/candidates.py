"""The candidate space: every valid way to split one training step over the world size, as arrays.

Generators of valid values per knob (divisors of the world size that also divide the heads, pipeline
depths no deeper than the blocks, context-parallel degrees that split the sequence, micro-batches that
divide each replica's share of the global batch) are combined per degree tuple with numpy (Calculon's
search, minus its twelve nested loops). The result is one numpy array per knob, the layout
`planner.score.score` takes.

Validity rules (each rejected combination is counted under its reason):
- world = dp x tp x pp x cp;
- tp must divide the heads, and the key/value heads must divide tp or be divided by it
  (Megatron splits whole heads and whole K/V groups: heads % tp == 0 and kv_heads % tp == 0,
  as megatron.core asserts for num_query_groups; replicating K/V heads is not costed);
- cp > 1 and cp_comm follow `ParallelConfig.check_sequence` (called, not restated): the load-balanced
  causal split needs seq % (2 cp) == 0, and Ulysses (a2a) also splits each tp rank's heads over cp;
  cp_comm takes the values the framework runs (SearchSpace.for_framework) and only p2p when cp = 1;
- ep follows `planner.parallel.ep_allowed` through `expert_parallel_degrees` (the one rule: ep | dp x cp
  and ep | experts today), and is 1 for dense models;
- dp_shard (hybrid sharding, ZeRO >= 1 only): see `shard_groups`;
- pp * virtual_stages <= blocks (every stage holds at least one block);
- dp * micro_batch must divide the global batch;
- looped schedules (interleaved-1f1b, zero-bubble) need num_microbatches to be a multiple of
  max(1, num_microbatches // pp) (torch.distributed.pipelining's flexible interleaving rule,
  ScheduleInterleaved1F1B; Megatron's stricter num_microbatches % pp == 0 is a special case);
- memory: candidates that do not fit are scored but not ranked (planner.search prunes by a lower bound).

Equivalences removed (not errors, just duplicates): with pp = 1 every schedule is the same
gradient-accumulation loop (kept as 1f1b); with dp x cp = 1 ZeRO shards nothing (kept as 0; with cp > 1
ZeRO shards over the cp ranks, which hold the same weights, even at dp = 1); with cp = 1 the exchange is
unused (kept as p2p); with tp = 1 sequence parallelism does nothing (kept off); placements that only
move a degree-1 axis give the same rank layout (the first permutation of each layout is kept; C rides
just left of T, so the T slot has degree tp x cp, and E has no layout of its own: it is written just
left of C or T as planner.parallel.default_placement does).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping

import numpy as np

from planner.errors import ConfigError
from planner.parallel import (
    CP_COMMS,
    LOOPED_SCHEDULES,
    OFFLOAD,
    RECOMPUTE,
    SCHEDULES,
    ParallelConfig,
    default_placement,
    expert_parallel_degrees,
    looped_rounds_ok,
    offload_indices,
    offloads,
)
from planner.placement import PLACEMENTS, ranks_per_node, with_context
from frameworks.rules import mtp_without_pp_or_cp, placement_allowed

FIELDS = (
    "dp",
    "tp",
    "pp",
    "micro_batch",
    "virtual_stages",
    "zero",
    "recompute",
    "offload",
    "sequence_parallel",
    "schedule",
    "placement",
    "cp",
    "cp_comm",
    "dp_shard",
    "ep",
)
"""Array names of a candidate batch (the CandidateArrays fields of planner.score)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """Which values the search may try for each knob (defaults: all of them)."""

    schedules: tuple[str, ...] = SCHEDULES
    """Pipeline schedules to try when pp > 1."""
    max_virtual_stages: int = 8
    """Largest interleaving degree v tried for interleaved-1f1b (2..max)."""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    offload: tuple[str, ...] = OFFLOAD
    sequence_parallel: tuple[bool, ...] = (False, True)
    placements: tuple[str, ...] = PLACEMENTS
    max_micro_batch: int = 64
    """Largest micro-batch tried (sequences)."""
    max_tp: int | None = None
    """Largest tensor-parallel degree tried; None means any divisor of the heads."""
    max_pp: int | None = None
    """Largest pipeline degree tried; None means up to the blocks."""
    zero_with_pp: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages tried together with pp > 1."""
    cp: tuple[int, ...] | None = None
    """Context-parallel degrees tried; None means every degree the rules allow (`degree_tuples`)."""
    max_cp: int | None = None
    """Largest context-parallel degree tried; None means no limit beyond the rules."""
    cp_comm: tuple[str, ...] = CP_COMMS
    """Key/value exchanges tried when cp > 1 (planner.parallel.CP_COMMS)."""
    dp_shard: int | None = None
    """Hybrid sharding: None tries every group `shard_groups` proposes; 0 only shard groups of all dp
    ranks (no hybrid sharding); N only groups of N ranks (ZeRO >= 1, dp a multiple of N)."""
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees tried; None means every degree planner.parallel.ep_allowed admits."""
    max_ep: int | None = None
    """Largest expert-parallel degree tried; None means no limit beyond the rule."""
    cp_with_sequence_parallel: bool = True
    """Whether cp > 1 rows also try sequence parallelism (frameworks.Capabilities.cp_with_sequence_parallel)."""
    optimizer_offload_min_zero: int = 0
    """Lowest ZeRO stage that may offload the optimizer (the framework's capability)."""

    def for_framework(self, framework, model=None) -> "SearchSpace":
        """This space narrowed to what `framework` can run (frameworks.FrameworkProfile.capabilities;
        the same capabilities frameworks.rules.violations and check_model_runnable check for estimate and
        export): with `model`, a stack that runs multi-token-prediction modules without pipeline or context
        parallelism gets pp = cp = 1 for a model that has them."""
        from dataclasses import replace

        caps = framework.capabilities
        single_stage = mtp_without_pp_or_cp(framework, model)
        sp = {"optional": self.sequence_parallel, "always": (True,), "never": (False,)}[
            caps.sequence_parallel
        ]
        cp_comm = tuple(c for c in self.cp_comm if c in caps.cp_comm)
        return replace(
            self,
            schedules=tuple(s for s in self.schedules if s in caps.schedules),
            max_virtual_stages=min(self.max_virtual_stages, caps.max_virtual_stages),
            zero=tuple(z for z in self.zero if z in caps.zero) or (0,),
            zero_with_pp=tuple(z for z in self.zero_with_pp if z in caps.zero_with_pp),
            recompute=tuple(r for r in self.recompute if r in caps.recompute),
            # activation offload that excludes pipelining and recompute (Megatron-Core) is left to estimate:
            # the search crosses offload with every pipeline depth and recompute level
            offload=tuple(
                o
                for o in self.offload
                if o in caps.offload
                and (not offloads(o, "activations") or caps.activation_offload == "any")
            ),
            sequence_parallel=sp,
            placements=tuple(p for p in self.placements if placement_allowed(framework, p)),
            max_tp=self.max_tp if caps.tp else 1,
            max_pp=self.max_pp if caps.schedules and not single_stage else 1,
            cp_comm=cp_comm,
            max_cp=self.max_cp if cp_comm and not single_stage else 1,
            max_ep=self.max_ep if caps.ep else 1,
            dp_shard=self.dp_shard if caps.hsdp else 0,
            cp_with_sequence_parallel=caps.cp_with_sequence_parallel,
            optimizer_offload_min_zero=caps.optimizer_offload_min_zero,
        )

    def allows_cp(self, cp: int) -> bool:
        """cp is among the degrees this space tries (cp = 1 always is, unless pinned away)."""
        return (self.cp is None or cp in self.cp) and (self.max_cp is None or cp <= self.max_cp)

    def allows_ep(self, ep: int) -> bool:
        return (self.ep is None or ep in self.ep) and (self.max_ep is None or ep <= self.max_ep)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidates:
    """A batch of candidates, one entry per configuration in each array (see FIELDS)."""

    arrays: Mapping[str, np.ndarray]
    """dp, tp, pp, micro_batch, virtual_stages, zero, cp, dp_shard, ep (ints); recompute, offload,
    schedule, placement, cp_comm (indices into RECOMPUTE, OFFLOAD, SCHEDULES, PLACEMENTS, CP_COMMS);
    sequence_parallel (bool)."""
    global_batch: int
    rejected: Mapping[str, int] = field(default_factory=dict)
    """Combinations left out, by reason."""

    def __len__(self) -> int:
        return int(self.arrays["dp"].shape[0])

    def take(self, index) -> "Candidates":
        return Candidates(
            arrays={k: v[index] for k, v in self.arrays.items()},
            global_batch=self.global_batch,
            rejected=self.rejected,
        )

    def config(
        self,
        i: int,
        *,
        seq: int,
        precision: str,
        optimizer: str = "adamw",
        stages: tuple[int, ...] = (),
        framework: str = "megatron",
    ) -> ParallelConfig:
        """Candidate i as a ParallelConfig."""
        return config_of_row(
            self.arrays,
            i,
            global_batch=self.global_batch,
            seq=seq,
            precision=precision,
            optimizer=optimizer,
            stages=stages,
            framework=framework,
        )


def placement_text(index: int, *, cp: int = 1, ep: int = 1) -> str:
    """The placement string of PLACEMENTS[index] for these degrees: C just left of T when cp > 1 (the
    layout the cost model prices, planner.placement.with_context) and E just left of C or T when ep > 1
    (where planner.parallel.default_placement writes it; the dense mesh has no E axis to lay out)."""
    text = PLACEMENTS[index]
    if cp > 1:
        text = with_context(text)
    if ep > 1:
        i = text.index("C" if cp > 1 else "T")
        text = text[:i] + "E" + text[i:]
    return text


def config_of_row(
    arrays: Mapping[str, np.ndarray],
    i: int,
    *,
    global_batch: int,
    seq: int,
    precision: str,
    optimizer: str = "adamw",
    stages: tuple[int, ...] = (),
    framework: str = "megatron",
) -> ParallelConfig:
    """Row i of candidate arrays as a ParallelConfig (knobs absent from `arrays` take their defaults)."""
    a = {k: np.asarray(arrays[k])[i].item() for k in FIELDS if k in arrays}
    cp, ep = a.get("cp", 1), a.get("ep", 1)
    return ParallelConfig(
        dp=a["dp"],
        tp=a["tp"],
        pp=a["pp"],
        micro_batch=a["micro_batch"],
        global_batch=global_batch,
        schedule=SCHEDULES[a["schedule"]],
        virtual_stages=a["virtual_stages"],
        zero=a["zero"],
        recompute=RECOMPUTE[a["recompute"]],
        offload=OFFLOAD[a["offload"]],
        sequence_parallel=bool(a["sequence_parallel"]),
        placement=placement_text(a["placement"], cp=cp, ep=ep),
        precision=precision,
        optimizer=optimizer,
        seq=seq,
        stages=stages,
        framework=framework,
        cp=cp,
        cp_comm=CP_COMMS[a.get("cp_comm", 0)],
        dp_shard=a.get("dp_shard", 0),
        ep=ep,
    )


def divisors(n: int) -> list[int]:
    """Positive divisors of n in increasing order."""
    return list(_divisors(n))


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def tp_allowed(tp: int, heads: int, kv_heads: int) -> bool:
    """Megatron splits whole heads and whole K/V groups: tp divides heads and kv_heads."""
    return heads % tp == 0 and kv_heads % tp == 0


@lru_cache(maxsize=4096)
def cp_comm_allowed(cp_comm: str, *, cp: int, tp: int, seq: int, heads: int, kv_heads: int) -> bool:
    """Whether `ParallelConfig.check_sequence` (the one owner of context parallelism's rules) accepts
    this degree and exchange for the sequence and the heads."""
    cfg = ParallelConfig(tp=tp, cp=cp, cp_comm=cp_comm, placement=default_placement(cp), seq=seq)
    try:
        cfg.check_sequence(seq, heads=heads, kv_heads=kv_heads)
    except ConfigError:
        return False
    return True


def degree_tuples(
    world_size: int,
    global_batch: int,
    *,
    heads: int,
    kv_heads: int,
    blocks: int,
    seq: int | None = None,
    space: "SearchSpace | None" = None,
    max_tp: int | None = None,
    max_pp: int | None = None,
    rejected: Counter | None = None,
) -> list[tuple[int, int, int, int]]:
    """(dp, tp, pp, cp) with dp*tp*pp*cp = world_size that the model shape, the sequence (cp splits it:
    `cp_comm_allowed` with p2p, i.e. seq % (2 cp) == 0), the global batch and `space` allow. Without
    `seq`, cp = 1 only."""
    rejected = rejected if rejected is not None else Counter()
    space = space or SearchSpace()
    max_tp = space.max_tp if max_tp is None else max_tp
    max_pp = space.max_pp if max_pp is None else max_pp
    out = []
    divs = divisors(world_size)
    splits = [
        (tp, pp, cp)
        for tp in divs
        for pp in divs
        if world_size % (tp * pp) == 0
        for cp in (divisors(world_size // (tp * pp)) if seq is not None else [1])
    ]
    for tp, pp, cp in splits:
        dp = world_size // (tp * pp * cp)
        if not tp_allowed(tp, heads, kv_heads) or (max_tp is not None and tp > max_tp):
            rejected["tp does not divide the heads (degrees)"] += 1
        elif pp > blocks:
            rejected["pp exceeds the blocks (degrees)"] += 1
        elif max_pp is not None and pp > max_pp:
            rejected["pp above what the framework runs (degrees)"] += 1
        elif not space.allows_cp(cp):
            rejected["cp outside the degrees searched (degrees)"] += 1
        elif cp > 1 and not cp_comm_allowed(
            "p2p", cp=cp, tp=tp, seq=seq, heads=heads, kv_heads=kv_heads
        ):
            rejected["seq not divisible by 2 cp (degrees)"] += 1
        elif global_batch % dp:
            rejected["dp does not divide the global batch (degrees)"] += 1
        else:
            out.append((dp, tp, pp, cp))
    return out


def degree_triples(
    world_size: int,
    global_batch: int,
    *,
    heads: int,
    kv_heads: int,
    blocks: int,
    max_tp: int | None = None,
    max_pp: int | None = None,
    rejected: Counter | None = None,
) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) with dp*tp*pp = world_size (degree_tuples at cp = 1)."""
    return [
        (dp, tp, pp)
        for dp, tp, pp, _ in degree_tuples(
            world_size,
            global_batch,
            heads=heads,
            kv_heads=kv_heads,
            blocks=blocks,
            max_tp=max_tp,
            max_pp=max_pp,
            rejected=rejected,
        )
    ]


def shard_groups(
    dp: int, *, tp: int, cp: int, fast_domain: int | None, pinned: int | None = None
) -> list[int]:
    """dp_shard values tried for a sharded (ZeRO >= 1) candidate: 0 (all dp ranks, plain ZeRO/FSDP), the
    largest divisor d < dp of dp whose shard group -- d data-parallel ranks times the cp ranks that hold the
    same weights, D laid just left of C and T -- stays inside one fast (NVLink) domain of `fast_domain`
    devices (planner.placement.ranks_per_node decides, the cost model's own locality rule), and every
    divisor d < dp whose group spans more than one domain.

    Why these. HSDP shards inside a group and replicates across groups (torchtitan's
    data_parallel_shard_degree x data_parallel_replicate_degree; Megatron-FSDP's and DeepSpeed hpZ/MiCS
    hybrid groups). Inside one domain a larger group costs the same per byte and holds less (states / d)
    and sends less across (1/d), so the largest in-domain d dominates the smaller ones in this cost model,
    which sees one fast domain (HardwareProfile.nvlink_domain_devices: a node, or 72 GPUs of a GB200
    NVL72): a node-sized group inside a larger domain is therefore not tried. A group that spans domains
    trades the other way: its gathers and reduce-scatters cross the network, but it holds less than an
    in-domain group and all-reduces a smaller slice between fewer replicas, so no size dominates another
    (a 32-rank group of 4 nodes can beat both a node and all 64 ranks). Two are tried, both whole domains
    and the in-domain group doubled (the sizes the stacks' hybrid groups are set to): the smallest (two
    domains) and the largest below dp, the ends of that trade, which keeps the search within 1.5x of its
    cost without them (benchmarks/search_speed.py). A group of one
    rank (d = 1, cp = 1) shards nothing and is left out. `pinned` (SearchSpace.dp_shard) replaces the
    choice: 0 gives [0], N gives [N] where N divides dp, else []."""
    if pinned is not None:
        return [pinned] if pinned == 0 or dp % pinned == 0 else []
    return list(_hybrid_groups(dp, tp, cp, fast_domain))


@lru_cache(maxsize=65536)
def _hybrid_groups(dp: int, tp: int, cp: int, fast_domain: int | None) -> tuple[int, ...]:
    """shard_groups without a pin: 0, the largest in-domain group and the groups across domains (cached
    per degrees)."""
    sizes = np.array([d for d in _divisors(dp) if d < dp and d * cp > 1], dtype=np.int64)
    if not fast_domain or not len(sizes):
        return (0,)
    in_domain = ranks_per_node(sizes * cp, tp, fast_domain) == sizes * cp
    largest_inside = (int(sizes[in_domain][-1]),) if in_domain.any() else ()
    base = largest_inside[0] if largest_inside else 1
    doubling = (sizes % base == 0) & _is_power_of_two(sizes // base)
    whole_domains = (sizes * cp * tp) % fast_domain == 0
    across = sizes[~in_domain & whole_domains & doubling]
    return (0, *largest_inside, *sorted({int(across[0]), int(across[-1])} if len(across) else ()))


def _is_power_of_two(values: np.ndarray) -> np.ndarray:
    return (values > 0) & ((values & (values - 1)) == 0)


SKELETON_FIELDS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "cp_comm",
    "dp_shard",
    "ep",
    "schedule",
    "virtual_stages",
    "zero",
    "offload",
)
"""Knobs that set the static memory (weights, gradients, optimizer states: sharded by ZeRO over dp_shard x
cp, experts over ep), the sequence each rank holds (cp, and the exchange's buffers) and the pipeline's
in-flight count; the others (micro-batch, recompute, sequence parallelism, placement) only add activations
or time, which is what makes a skeleton's leanest candidate a memory lower bound for all of its expansions."""


def generate(
    world_size: int,
    global_batch: int,
    *,
    heads: int,
    kv_heads: int | None = None,
    blocks: int,
    seq: int | None = None,
    experts: int | None = None,
    fast_domain: int | None = None,
    space: SearchSpace = SearchSpace(),
) -> Candidates:
    """All valid candidates for a world size and global batch, as arrays (module docstring)."""
    rejected: Counter = Counter()
    rows = skeleton_rows(
        world_size,
        global_batch,
        heads=heads,
        kv_heads=kv_heads,
        blocks=blocks,
        seq=seq,
        experts=experts,
        fast_domain=fast_domain,
        space=space,
        rejected=rejected,
    )
    rows = with_micro_batches(rows, global_batch, space=space, rejected=rejected)
    return Candidates(
        arrays=with_free_knobs(rows, space=space),
        global_batch=global_batch,
        rejected=dict(rejected),
    )


def skeleton_rows(
    world_size: int,
    global_batch: int,
    *,
    heads: int,
    kv_heads: int | None,
    blocks: int,
    space: SearchSpace,
    rejected: Counter,
    seq: int | None = None,
    experts: int | None = None,
    fast_domain: int | None = None,
) -> dict[str, np.ndarray]:
    """One row per (dp, tp, pp, cp, cp_comm, dp_shard, ep, schedule, virtual stages, zero, offload) the
    rules allow. `seq` None searches cp = 1 only; `experts` (routed experts of a mixture-of-experts model)
    None means dense (ep = 1); `fast_domain` (devices of one NVLink domain) None tries no hybrid sharding.
    The options of each knob are listed once per degree tuple, then combined with numpy (`_ragged_product`)."""
    kv_heads = kv_heads or heads
    comms = [CP_COMMS.index(c) for c in space.cp_comm]
    tuples, options = [], {"cp_comm": [], "ep": [], "sched": [], "zero": [], "shard": []}
    for dp, tp, pp, cp in degree_tuples(
        world_size,
        global_batch,
        heads=heads,
        kv_heads=kv_heads,
        blocks=blocks,
        seq=seq,
        space=space,
        rejected=rejected,
    ):
        grad_group = dp * cp
        zero = [
            z
            for z in space.zero
            if (grad_group > 1 or z == 0)
            and (pp == 1 or grad_group == 1 or z in space.zero_with_pp)
        ]
        pinned = [
            z for z in zero if z >= 1 or space.dp_shard in (None, 0)
        ]  # a pinned group needs sharding
        exchanges = (
            [0]
            if cp == 1
            else [
                c
                for c in comms
                if cp_comm_allowed(
                    CP_COMMS[c], cp=cp, tp=tp, seq=seq, heads=heads, kv_heads=kv_heads
                )
            ]
        )
        eps = [
            e
            for e in expert_parallel_degrees(dp=dp, cp=cp, tp=tp, experts=experts)
            if space.allows_ep(e)
        ]
        shards = shard_groups(dp, tp=tp, cp=cp, fast_domain=fast_domain, pinned=space.dp_shard)
        if not zero:
            rejected["no ZeRO stage the framework runs with pipelining (skeletons)"] += 1
        elif not (pinned and (shards or 0 in pinned)):
            rejected["no shard group of the pinned size (skeletons)"] += 1
        elif not exchanges:
            rejected["no cp exchange the framework runs splits the heads (skeletons)"] += 1
        elif not eps:
            rejected["no ep degree searched divides dp x cp and the experts (skeletons)"] += 1
        else:
            zero = pinned
            tuples.append((dp, tp, pp, cp))
            options["cp_comm"].append([(c,) for c in exchanges])
            options["ep"].append([(e,) for e in eps])
            options["sched"].append(_schedule_options(pp, blocks, space))
            options["zero"].append([(z,) for z in zero])
            options["shard"].append(
                ([(0,)] if space.dp_shard in (None, 0) else [], [(d,) for d in shards])
            )
    table = np.array(tuples, dtype=np.int64).reshape(-1, 4)
    rows = {name: table[:, i] for i, name in enumerate(("dp", "tp", "pp", "cp"))}
    rows["tuple"] = np.arange(len(table))
    rows = _ragged_product(rows, rows["tuple"], options["cp_comm"], ("cp_comm",))
    rows = _ragged_product(rows, rows["tuple"], options["ep"], ("ep",))
    rows = _ragged_product(rows, rows["tuple"], options["sched"], ("schedule", "virtual_stages"))
    rows = _ragged_product(rows, rows["tuple"], options["zero"], ("zero",))
    shard_options = [
        group for pair in options["shard"] for group in pair
    ]  # key: 2 x tuple + (zero >= 1)
    rows = _ragged_product(
        rows, 2 * rows["tuple"] + (rows["zero"] >= 1), shard_options, ("dp_shard",)
    )
    rows = _ragged_product(
        rows,
        np.zeros(_size(rows), dtype=np.int64),
        [[(OFFLOAD.index(o),) for o in space.offload]],
        ("offload",),
    )
    if (
        space.optimizer_offload_min_zero
    ):  # the framework offloads the optimizer only with ZeRO (frameworks.rules)
        keep = (rows["zero"] >= space.optimizer_offload_min_zero) | ~np.isin(
            rows["offload"], offload_indices("optimizer")
        )
        rows = {name: values[keep] for name, values in rows.items()}
    return {name: rows[name] for name in SKELETON_FIELDS}


def _ragged_product(
    rows: Mapping[str, np.ndarray],
    key: np.ndarray,
    options: list[list[tuple]],
    names: tuple[str, ...],
) -> dict[str, np.ndarray]:
    """Each row combined with every option tuple of its key (options[key[i]], values for `names`), rows
    outer and options inner; a row whose list is empty is dropped."""
    counts, chosen = _ragged_options(key, options, len(names))
    out = {name: np.repeat(np.asarray(col), counts) for name, col in rows.items()}
    for i, name in enumerate(names):
        out[name] = chosen[:, i]
    return out


def _ragged_options(
    key: np.ndarray, options: list[list[tuple]], width: int
) -> tuple[np.ndarray, np.ndarray]:
    """For `_ragged_product`: how many options each row gets (counts) and the option tuples, row by row
    (chosen, shape (counts.sum(), width))."""
    most = max((len(o) for o in options), default=0)
    values = np.zeros((len(options), max(most, 1), width), dtype=np.int64)
    valid = np.zeros((len(options), max(most, 1)), dtype=bool)
    for k, opts in enumerate(options):
        if opts:
            values[k, : len(opts)] = opts
            valid[k, : len(opts)] = True
    key = np.asarray(key, dtype=np.int64)
    pick = valid[key]
    return pick.sum(axis=1), values[key][pick]


def _size(rows: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(rows.values())).shape[0])


def _product(
    rows: Mapping[str, np.ndarray], name: str, values: np.ndarray
) -> dict[str, np.ndarray]:
    """Every row combined with every value of a new knob (rows outer, values inner)."""
    n, k = _size(rows), len(values)
    out = {key: np.repeat(col, k) for key, col in rows.items()}
    out[name] = np.tile(np.asarray(values, dtype=np.int64), n)
    return out


def _concat(parts: list[dict[str, np.ndarray]], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    if not parts:
        return {name: np.zeros(0, dtype=np.int64) for name in names}
    return {name: np.concatenate([p[name] for p in parts]) for name in names}


def with_micro_batches(
    rows: Mapping[str, np.ndarray],
    global_batch: int,
    *,
    space: SearchSpace,
    rejected: Counter | None = None,
) -> dict[str, np.ndarray]:
    """Each row combined with every micro-batch that divides its replica's share of the global batch;
    looped schedules keep only micro-batch counts torch's interleaving accepts."""
    rejected = rejected if rejected is not None else Counter()
    if not _size(rows):
        return {
            **{k: np.asarray(v) for k, v in rows.items()},
            "micro_batch": np.zeros(0, dtype=np.int64),
        }
    dps, key = np.unique(rows["dp"], return_inverse=True)
    options = [
        [(b,) for b in divisors(global_batch // int(dp)) if b <= space.max_micro_batch]
        for dp in dps
    ]
    # _ragged_product's rows, but the kept ones only are materialized (each column copied once, not twice:
    # ~10^6 rows x 13 columns for a large MoE search)
    counts, chosen = _ragged_options(key.ravel(), options, 1)
    source = np.repeat(np.arange(len(counts)), counts)
    micro_batch = chosen[:, 0]
    m = global_batch // (np.asarray(rows["dp"])[source] * micro_batch)
    looped = np.isin(
        np.asarray(rows["schedule"])[source], [SCHEDULES.index(n) for n in LOOPED_SCHEDULES]
    )
    ok = ~looped | looped_rounds_ok(m, np.asarray(rows["pp"])[source])
    if (~ok).any():
        rejected[
            "num_microbatches not a multiple of the schedule's rounds (micro-batch choices)"
        ] += int((~ok).sum())
        source, micro_batch = source[ok], micro_batch[ok]
    out = {k: np.asarray(v)[source] for k, v in rows.items()}
    out["micro_batch"] = micro_batch
    return out


def distinct_placements(
    dp: int, tp: int, pp: int, allowed: tuple[str, ...] = PLACEMENTS
) -> list[int]:
    """Indices into PLACEMENTS of the placements with distinct rank layouts for these degrees (pass
    tp x cp as `tp`: C sits just left of T, so the two move together)."""
    degree = {"D": dp, "P": pp, "T": tp}
    seen, keep = set(), []
    for index, placement in enumerate(PLACEMENTS):
        if placement not in allowed:
            continue
        reduced = "".join(letter for letter in placement if degree[letter] > 1)
        if reduced not in seen:
            seen.add(reduced)
            keep.append(index)
    return keep


def _pattern_groups(rows: Mapping[str, np.ndarray], space: SearchSpace):
    """Rows grouped by which degrees exceed 1 (what placements and sequence parallelism depend on), with
    the group's sequence-parallel choices and distinct placements."""
    cp = rows["cp"] if "cp" in rows else np.ones_like(rows["dp"])
    ep = rows["ep"] if "ep" in rows else np.ones_like(rows["dp"])
    # expert parallelism does not change the placements, but it separates the groups (the expert layers'
    # groups depend on the whole D/P/T order: search.placement_classes)
    key = (
        (ep > 1) * 16
        + (rows["dp"] > 1) * 8
        + (rows["tp"] > 1) * 4
        + (rows["pp"] > 1) * 2
        + (cp > 1)
    )
    for pattern in np.unique(key):
        has_dp, has_tp, has_pp, has_cp = (bool(pattern & bit) for bit in (8, 4, 2, 1))
        sp = [
            s
            for s in space.sequence_parallel
            if not s or (has_tp and (space.cp_with_sequence_parallel or not has_cp))
        ] or [False]
        place = distinct_placements(
            1 + has_dp, 1 + (has_tp or has_cp), 1 + has_pp, space.placements
        ) or [0]
        yield sp, place, key == pattern


def with_free_knobs(rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> dict[str, np.ndarray]:
    """Complete candidates: each row combined with every recompute, sequence-parallel and placement choice."""
    recompute = np.array([RECOMPUTE.index(r) for r in space.recompute], dtype=np.int64)
    rows = _with_defaults(rows)
    parts = []
    for sp, place, mask in _pattern_groups(rows, space):
        mine = {k: v[mask] for k, v in rows.items()}
        parts.append(
            _product(
                _product(
                    _product(mine, "recompute", recompute),
                    "sequence_parallel",
                    np.array(sp, dtype=np.int64),
                ),
                "placement",
                np.array(place),
            )
        )
    out = _concat(parts, tuple(rows) + ("recompute", "sequence_parallel", "placement"))
    out["sequence_parallel"] = out["sequence_parallel"].astype(bool)
    return {name: out[name] for name in FIELDS}


def with_placements(rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> dict[str, np.ndarray]:
    """Each row once per distinct placement (`distinct_placements`), every column of `rows` kept: the
    (row, placement) groups whose recompute and sequence-parallel choices the search bounds together."""
    rows = _with_defaults(rows)
    parts = [
        _product({k: v[mask] for k, v in rows.items()}, "placement", np.array(place))
        for _, place, mask in _pattern_groups(rows, space)
    ]
    return _concat(parts, tuple(rows) + ("placement",))


def group_sizes(groups: Mapping[str, np.ndarray], *, space: SearchSpace) -> np.ndarray:
    """Complete candidates per (row, placement) group: recompute levels x sequence-parallel choices."""
    return len(space.recompute) * np.where(
        np.asarray(groups["tp"]) > 1, len(set(space.sequence_parallel)) or 1, 1
    )


def _with_defaults(rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows with cp, cp_comm, dp_shard, ep filled in (1, p2p, 0, 1) where a caller's rows lack them."""
    out = dict(rows)
    n = _size(rows)
    for name, value in (("cp", 1), ("cp_comm", 0), ("dp_shard", 0), ("ep", 1)):
        if name not in out:
            out[name] = np.full(n, value, dtype=np.int64)
    return out


def leanest(rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> dict[str, np.ndarray]:
    """Complete each row with the values that hold the least memory, once per recompute level:
    micro-batch 1 (when absent), sequence parallelism where tp > 1, any placement (placement moves
    no memory). Row i's completions are entries i*k .. i*k+k-1 (k recompute levels); the least of
    their peaks bounds from below the peak of every candidate that shares the row. Every recompute
    level is tried because the strongest is not always the leanest (with activation offload, full
    recompute's working set can exceed what selective keeps); tests/test_search.py checks the bound
    on the real scorer."""
    n = _size(rows)
    out = _with_defaults({k: np.asarray(v) for k, v in rows.items()})
    if "micro_batch" not in out:
        out["micro_batch"] = np.ones(n, dtype=np.int64)
    out["sequence_parallel"] = (out["tp"] > 1) & (True in space.sequence_parallel)
    first = np.zeros(n, dtype=np.int64)
    for _, place, mask in _pattern_groups(out, space):
        first[mask] = place[0]
    out["placement"] = first
    out.pop("recompute", None)
    out = _product(out, "recompute", np.array([RECOMPUTE.index(r) for r in space.recompute]))
    return {name: out[name] for name in FIELDS}


def leanest_peak(
    peaks: np.ndarray, rows: Mapping[str, np.ndarray], *, space: SearchSpace
) -> np.ndarray:
    """Per row, the least peak over its `leanest` completions."""
    return np.asarray(peaks, dtype=float).reshape(_size(rows), len(space.recompute)).min(axis=1)


def free_knob_count(rows: Mapping[str, np.ndarray], *, space: SearchSpace) -> np.ndarray:
    """Per row (with micro_batch), how many complete candidates `with_free_knobs` makes of it."""
    count = np.zeros(_size(rows), dtype=np.int64)
    for sp, place, mask in _pattern_groups(_with_defaults(rows), space):
        count[mask] = len(space.recompute) * len(sp) * len(place)
    return count


def _schedule_options(pp: int, blocks: int, space: SearchSpace) -> list[tuple[int, int]]:
    """(schedule index, virtual stages) pairs for a pipeline depth."""
    if pp == 1:
        return [(SCHEDULES.index("1f1b"), 1)]
    options = []
    for name in space.schedules:
        if name == "interleaved-1f1b":
            options += [
                (SCHEDULES.index(name), v)
                for v in range(2, space.max_virtual_stages + 1)
                if pp * v <= blocks
            ]
        else:
            options.append((SCHEDULES.index(name), 1))
    return options
