"""Where each parallel group's ranks sit, and hence which links its collectives use.

A placement string orders the axes D (data), P (pipeline), T (tensor) from outermost to innermost,
SageMaker model parallelism's convention: the right-most letter gets adjacent ranks. "DPT"
("cluster") keeps tensor-parallel groups inside a node; "TPD" ("spread") puts data-parallel
replicas on adjacent devices.

Rank layout: with sizes n_X and coordinates c_X, rank = sum_X c_X * stride_X, where the right-most
axis has stride 1 and each axis to its left has the product of the sizes to its right (row-major,
what `init_device_mesh` builds from the placement-ordered shape).

Worked example: dp=2, pp=2, tp=4 on nodes of 8 devices.
  "DPT": strides T=1, P=4, D=8. A tp group {0,1,2,3} (stride 1, size 4) fits in a node -> NVLink.
         A pp group {0,4} (stride 4, 4*2 = 8 <= 8) stays in node 0 -> NVLink. A dp group {0,8}
         (stride 8) has one rank per node -> 2 nodes, 1 rank per node: network only.
  "TPD": strides D=1, P=2, T=4. A tp group {0,4,8,12} (stride 4, span 16 > 8): 2 ranks per node on
         2 nodes -> hierarchical (NVLink inside, network across).

A group of size n and stride g occupies ranks r0, r0+g, ..., r0+(n-1)g. It stays in one node when
g*n divides devices_per_node. Otherwise the ranks per node are devices_per_node // g when g divides
the node and the runs align with n, 1 when g is a multiple of the node; a group that straddles a
node boundary (e.g. tp=3 on 8-device nodes: {6,7,8}) is costed at its slowest link, 1 per node.
"""

from __future__ import annotations

import itertools

import numpy as np

PLACEMENTS = tuple("".join(p) for p in itertools.permutations("DPT"))
"""The six placement strings; index i is what `CandidateArrays.placement` holds."""
AXES = ("D", "P", "T")


def placement_index(placement: str) -> int:
    """Index into PLACEMENTS of the D, P, T order of a placement (C and E, when present, do not move
    the relative order of the other three)."""
    return PLACEMENTS.index("".join(letter for letter in placement if letter in AXES))


def strides(placement_idx, dp, pp, tp, cp=1) -> dict[str, np.ndarray]:
    """Stride of each axis for placement indices (arrays), right-most axis stride 1. The context axis C,
    when cp > 1, sits just outside T (Megatron's tp-cp-... order and torchtitan's ..., cp, tp mesh;
    planner.parallel.check_placement requires it there)."""
    placement_idx = np.asarray(placement_idx)
    size = {"D": np.asarray(dp), "P": np.asarray(pp), "T": np.asarray(tp), "C": np.asarray(cp)}
    shape = np.broadcast(placement_idx, size["D"], size["P"], size["T"], size["C"]).shape
    out = {a: np.zeros(shape, dtype=np.int64) for a in AXES + ("C",)}
    for i, text in enumerate(PLACEMENTS):
        mask = placement_idx == i
        stride = np.ones(shape, dtype=np.int64)
        for letter in reversed(with_context(text)):
            out[letter] = np.where(mask, stride, out[letter])
            stride = stride * size[letter]
    return out


def with_context(placement: str) -> str:
    """A D, P, T order with C inserted just outside T: 'DPT' -> 'DPCT', 'TDP' -> 'CTDP'."""
    i = placement.index("T")
    return placement[:i] + "C" + placement[i:]


def ranks_per_node(n, stride, devices_per_node: int):
    """How many members of a group (size n, rank stride `stride`) share one node, for the group
    whose link is the slowest (the collective runs at its pace).

    stride * n divides devices_per_node: all n (every such group sits inside one node).
    devices_per_node divides stride: 1 (every member on its own node). devices_per_node / stride
    members per node when stride divides the node and that count divides n (aligned runs).
    Otherwise some group straddles a node boundary with a single member on one side: 1.
    """
    n = np.asarray(n)
    stride = np.maximum(np.asarray(stride), 1)
    span = stride * n
    run = devices_per_node // stride
    aligned_run = (devices_per_node % stride == 0) & (run >= 1) & (n % np.maximum(run, 1) == 0)
    return np.where(devices_per_node % span == 0, n, np.where(aligned_run, np.minimum(run, n), 1))


def aligned_domain(domain: int, world):
    """The NVLink domain the rank layout aligns to: the whole job when it fits in one domain (a 64-GPU
    job on a 72-GPU GB200 NVL72 rack); the domain when the job fills whole domains (144 GPUs on two
    racks); otherwise the largest power of two within the domain (a 128-GPU job fills 64 of each rack's
    72 GPUs, the other trays stay spare). Arrays broadcast."""
    world = np.asarray(world)
    pow2 = 1 << (int(domain).bit_length() - 1)
    return np.where(
        world <= domain, np.maximum(world, 1), np.where(world % domain == 0, domain, pow2)
    )


def packed_key(columns: list[np.ndarray]) -> np.ndarray:
    """One int64 per row, equal exactly where the rows of the integer columns are equal (each column ranked
    by a lookup table, or np.unique for sparse ones, then packed; re-numbered before it could overflow).
    The packed key is below the product of the columns' distinct counts."""
    packed, size = np.zeros(len(columns[0]), dtype=np.int64), 1
    for col in columns:
        col = np.asarray(col, dtype=np.int64)
        low, span = int(col.min()), int(col.max() - col.min()) + 1
        if span <= 4 * len(col) + 4096:
            present = np.zeros(span, bool)
            present[col - low] = True
            lut = np.cumsum(present) - 1
            rank, values = lut[col - low], int(present.sum())
        else:
            uniq, rank = np.unique(col, return_inverse=True)
            rank, values = rank.ravel(), len(uniq)
        if size * values >= 2**62:
            packed = np.unique(packed, return_inverse=True)[1].ravel()
            size = int(packed.max()) + 1
        packed, size = packed * values + rank, size * values
    return packed


def distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse): the index of one row of each distinct row of the integer columns, and for every
    row which of them it equals (rows == rows[first][inverse]). A lookup table over the packed key
    (`packed_key`) where its range is small, else np.unique (a sort)."""
    key = packed_key(columns)
    n = len(key)
    top = int(key.max()) + 1 if n else 0
    if top > 4 * n + 4096:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first, inverse.ravel()
    one_of = np.full(top, -1, dtype=np.int64)
    one_of[key] = np.arange(n)  # some row of each key present (repeated keys: any one)
    present = one_of >= 0
    return one_of[present], (np.cumsum(present) - 1)[key]


def group_locality(
    placement_idx, dp, pp, tp, devices_per_node: int, cp=1, dp_shard=None, ep=1, expert_tp=1
) -> dict[str, np.ndarray]:
    """Ranks per node of each parallel group (`_group_locality`), computed once per distinct layout: a batch
    of candidates repeats few (placement, dp, pp, tp, cp, dp_shard, ep, expert_tp) tuples, and the layout
    reads nothing else (the search scores ~10^4 rows per call over ~10^2 layouts)."""
    cols = np.broadcast_arrays(
        *(
            np.asarray(v, dtype=np.int64)
            for v in (
                placement_idx,
                dp,
                pp,
                tp,
                cp,
                dp if dp_shard is None else dp_shard,
                ep,
                expert_tp,
            )
        )
    )
    if cols[0].ndim != 1 or len(cols[0]) < 64:
        return _group_locality(
            placement_idx,
            dp,
            pp,
            tp,
            devices_per_node,
            cp=cp,
            dp_shard=dp_shard,
            ep=ep,
            expert_tp=expert_tp,
        )
    first, inverse = distinct_rows(cols)
    place, dp_, pp_, tp_, cp_, shard, ep_, etp = (c[first] for c in cols)
    out = _group_locality(
        place, dp_, pp_, tp_, devices_per_node, cp=cp_, dp_shard=shard, ep=ep_, expert_tp=etp
    )
    return {k: np.broadcast_to(v, first.shape)[inverse] for k, v in out.items()}


def _group_locality(
    placement_idx, dp, pp, tp, devices_per_node: int, cp=1, dp_shard=None, ep=1, expert_tp=1
) -> dict[str, np.ndarray]:
    """Ranks per node (or NVLink domain: `devices_per_node` is the domain the fast links join) of each
    parallel group, for each candidate: 'D', 'P', 'T', 'C' (one axis each); 'DC' the data-parallel
    gradient group over dp x cp (context-parallel ranks hold the same weights); with hybrid sharding
    `dp_shard` (shard group inside D, replicas across: torchtitan's dp_replicate x dp_shard), 'S' the
    shard group over dp_shard x cp and 'R' the replica group over dp / dp_shard. The expert layers'
    groups (stage_group_locality): 'E' the expert-parallel group (ep ranks, expert_tp apart), 'ET' expert
    tensor parallelism, 'ED' the expert data-parallel group (tp cp dp / (ep expert_tp) ranks), 'ES' its
    ZeRO shard group (cut by dp_shard / dp as the dense one) and 'ER' the shard group's replicas;
    'TDC' all the tensor, data and context ranks of one pipeline stage (FP8 amax reductions)."""
    world = np.asarray(dp) * np.asarray(pp) * np.asarray(tp) * np.asarray(cp)
    devices_per_node = aligned_domain(devices_per_node, world)
    st = strides(placement_idx, dp, pp, tp, cp)
    size = {"D": dp, "P": pp, "T": tp, "C": cp}
    out = {a: ranks_per_node(size[a], st[a], devices_per_node) for a in AXES + ("C",)}
    shard = np.asarray(dp if dp_shard is None else dp_shard)
    out["DC"] = _pair(out["C"], cp, ranks_per_node(dp, st["D"], devices_per_node))
    inner = ranks_per_node(shard, st["D"], devices_per_node)
    out["S"] = _pair(out["C"], cp, inner)
    out["R"] = ranks_per_node(
        np.asarray(dp) // np.maximum(shard, 1), st["D"] * shard, devices_per_node
    )
    ep, etp = np.asarray(ep, dtype=np.int64), np.asarray(expert_tp, dtype=np.int64)
    edp = np.maximum(np.asarray(tp) * np.asarray(cp) * np.asarray(dp) // np.maximum(ep * etp, 1), 1)
    stage = lambda n, g: stage_group_locality(
        placement_idx, dp, pp, tp, n, g, devices_per_node, cp=cp
    )  # noqa: E731
    out["E"], out["ET"], out["ED"] = stage(ep, etp), stage(etp, 1), stage(edp, ep * etp)
    expert_shard = np.maximum(edp * shard // np.maximum(np.asarray(dp), 1), 1)
    out["ES"] = stage(expert_shard, ep * etp)
    out["ER"] = stage(np.maximum(edp // expert_shard, 1), ep * etp * expert_shard)
    out["TDC"] = stage(np.asarray(tp) * np.asarray(cp) * np.asarray(dp), 1)
    return out


def stage_group_locality(placement_idx, dp, pp, tp, n, virtual_stride, devices_per_node: int, cp=1):
    """Ranks per node (NVLink domain) of a group of n ranks at positions f, f + g, ..., f + (n-1) g of a
    pipeline stage's ranks, g = `virtual_stride`, where a stage's tp x cp x dp ranks are numbered in the
    placement's order with P taken out (f = c_D w_D + c_C w_C + c_T w_T, w the product of the sizes of
    the non-pipeline axes to the right). This is how Megatron-Core's expert rank generator lays out the
    expert layers (order expert_tp-ep-expert_dp-pp over the same ranks, MoE parallel folding; Liu et al.
    2025, arXiv 2504.14960): the ep group is n = ep at g = expert_tp, the expert data-parallel group
    n = expert_dp at g = expert_tp x ep.

    Physical rank of position f: f when P is outermost; f pp when P is innermost; with P between,
    (f mod A) + (f div A) A pp, A the product of the non-pipeline axes right of P. The group is then a
    run of A/g members at stride g inside one block of A and g n / A such runs at stride A pp (costed
    like `_pair`), or wholly inside a block (g n divides A), or one member per block (A divides g); any
    other shape straddles a node boundary somewhere and counts as 1 per node (ranks_per_node)."""
    placement_idx = np.asarray(placement_idx)
    dp, pp, tp, cp = (np.asarray(v, dtype=np.int64) for v in (dp, pp, tp, cp))
    n = np.asarray(n, dtype=np.int64)
    g = np.maximum(np.asarray(virtual_stride, dtype=np.int64), 1)
    size = {"D": dp, "C": cp, "T": tp}
    shape = np.broadcast(placement_idx, dp, pp, tp, cp, n, g).shape
    out = np.ones(shape, dtype=np.int64)
    present = set(np.unique(placement_idx).tolist())
    for i, text in enumerate(PLACEMENTS):
        if i not in present:  # no candidate has this order: nothing to select
            continue
        order = with_context(text)
        if order[0] == "P":  # stage ranks contiguous
            local = ranks_per_node(n, g, devices_per_node)
        elif order[-1] == "P":  # every stage rank pp apart
            local = ranks_per_node(n, g * pp, devices_per_node)
        else:
            inner = order[order.index("P") + 1 :]
            block = np.ones((), dtype=np.int64)
            for letter in inner:
                block = block * size[letter]
            span = g * n
            inside = (block % np.maximum(span, 1)) == 0
            runs = (span > block) & (block % g == 0) & (span % np.maximum(block, 1) == 0)
            spread = (g % np.maximum(block, 1)) == 0
            run = np.maximum(block // g, 1)
            pair = _pair(
                ranks_per_node(run, g, devices_per_node),
                run,
                ranks_per_node(
                    np.maximum(span // np.maximum(block, 1), 1), block * pp, devices_per_node
                ),
            )
            local = np.where(
                inside,
                ranks_per_node(n, g, devices_per_node),
                np.where(
                    runs, pair, np.where(spread, ranks_per_node(n, g * pp, devices_per_node), 1)
                ),
            )
        out = np.where(placement_idx == i, local, out)
    return np.minimum(out, np.maximum(n, 1))


def _pair(inner_local, inner_size, outer_local):
    """Members per node of a group spanning an inner axis (C, just outside T) and an outer one (D): the
    outer axis adds members on the node only when the inner one is wholly on it."""
    inner_size = np.asarray(inner_size)
    return np.where(inner_local >= inner_size, inner_local * outer_local, inner_local)
