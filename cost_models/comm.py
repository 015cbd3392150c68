"""Collective and point-to-point communication times (alpha-beta models), numbers or numpy arrays.

Conventions (nccl-tests, doc/PERFORMANCE.md, "bus bandwidth"): for a collective over n ranks
moving a buffer of S bytes per rank,

    all-reduce      t = 2 (n-1)/n * S / B_bus + 2 (n-1) alpha            (ring)
    reduce-scatter  t =   (n-1)/n * S / B_bus +   (n-1) alpha            (ring, S = full buffer)
    all-gather      t =   (n-1)/n * S / B_bus +   (n-1) alpha            (ring, S = full buffer)

where B_bus is the per-rank link bandwidth times a bus efficiency (Thakur, Rabenseifner & Gropp
2005, "Optimization of Collective Communication Operations in MPICH", Sec. 4; Patarasuk & Yuan
2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations": the ring reaches
the 2 (n-1)/n S / B lower bound). The tree (double binary tree in NCCL) has the same bandwidth term
with a latency of 2 log2(n) alpha instead of 2 (n-1) alpha; NCCL picks the faster, so we take the
minimum.

A group spread over several nodes is costed hierarchically (Megatron/NCCL style): reduce-scatter
inside each node over NVLink, all-reduce of the 1/k shard across nodes over the network (each of
the k local ranks drives its own share of the node's NICs), all-gather inside the node.

`relative_allreduce_cost` is the seed's "Latent Space" relative model, where an all-reduce over n
nodes costs log2(n) steps.
"""
from __future__ import annotations

import numpy as np

from hardware_profiles import HardwareProfile
from hardware_profiles.efficiency import efficiency



def relative_allreduce_cost(nodes, devices_per_node):
    """Relative cost of an all-reduce over `nodes` nodes of `devices_per_node` devices, against a
    one-step reference: half the work stays inside the node (cost 1/2 on the fast links) and half
    crosses the network, where a tree over n nodes needs log2(n) steps, each carrying 1/log2(n) of
    the data at the node's share:  1/2 + 1/2 * 1/log2(n).

    Seed worked example: 16 nodes of 8 GPUs -> 1/2 + 1/2 * 1/4 = 0.625.
    With one node there is nothing to cross: 1.0 (the whole reduction is local).
    """
    nodes = np.asarray(nodes, dtype=float)
    steps = np.log2(np.maximum(nodes, 2.0))
    return np.where(nodes > 1, 0.5 + 0.5 / steps, 1.0)


COLLECTIVE_EFFICIENCY_KEY = {"allreduce": "allreduce_bus_efficiency", "allgather": "allgather_bus_efficiency",
                             "reduce_scatter": "reducescatter_bus_efficiency", "alltoall": "alltoall_bus_efficiency",
                             "p2p": "p2p_bus_efficiency"}
"""Which efficiency key (hardware_profiles.efficiency) gives each collective's bus bandwidth over the
link rate; `planner hardware calibrate` measures each one."""


def bus_efficiency(hw: HardwareProfile, collective: str = "allreduce") -> float:
    """Bus bandwidth of `collective` over the link rate, from the profile (nccl-tests' busbw)."""
    return efficiency(hw, COLLECTIVE_EFFICIENCY_KEY[collective])


def intra_bus_Bps(hw: HardwareProfile, collective: str = "allreduce") -> float:
    """Achievable per-device bus bandwidth of `collective` inside a node, bytes/s."""
    return hw.intra_node_GBps_per_device * 1e9 * bus_efficiency(hw, collective)


def inter_bus_Bps_per_node(hw: HardwareProfile, collective: str = "allreduce") -> float:
    """Achievable network bandwidth of `collective` out of one node, bytes/s."""
    return hw.inter_node_Gbps_per_node / 8.0 * 1e9 * bus_efficiency(hw, collective)


def ring_allreduce_seconds(size_bytes, n, bw_Bps, latency_s):
    """Ring all-reduce of `size_bytes` per rank over n ranks (Patarasuk & Yuan 2009):
    2 (n-1)/n S / B + 2 (n-1) alpha; 0 when n == 1."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, 2 * (n - 1) / n * size_bytes / bw_Bps + 2 * (n - 1) * latency_s, 0.0)


def tree_allreduce_seconds(size_bytes, n, bw_Bps, latency_s):
    """Double-binary-tree all-reduce (NCCL >= 2.4; Sanders, Speck & Traeff 2009): bandwidth term
    as the ring, latency 2 log2(n) alpha."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, 2 * (n - 1) / n * size_bytes / bw_Bps + 2 * np.log2(np.maximum(n, 1)) * latency_s, 0.0)


def allreduce_seconds(size_bytes, n, bw_Bps, latency_s):
    """Flat all-reduce: the faster of ring and tree (what NCCL's tuner does)."""
    return np.minimum(ring_allreduce_seconds(size_bytes, n, bw_Bps, latency_s),
                      tree_allreduce_seconds(size_bytes, n, bw_Bps, latency_s))


def reduce_scatter_seconds(size_bytes, n, bw_Bps, latency_s):
    """Ring reduce-scatter of a `size_bytes` buffer: (n-1)/n S / B + (n-1) alpha."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, (n - 1) / n * size_bytes / bw_Bps + (n - 1) * latency_s, 0.0)


allgather_seconds = reduce_scatter_seconds
"""Ring all-gather of a `size_bytes` result buffer: same cost as the reduce-scatter (nccl-tests)."""


def p2p_seconds(size_bytes, bw_Bps, latency_s):
    """One point-to-point send: alpha + S / B."""
    return latency_s + np.asarray(size_bytes, dtype=float) / bw_Bps


def group_collective_seconds(kind: str, size_bytes, n, local, hw: HardwareProfile):
    """Time of collective `kind` ('allreduce', 'reduce_scatter', 'allgather') over a group of n ranks
    of which `local` share each node (so n / local nodes); arrays broadcast.

    local == n: the group stays inside a node (NVLink/NVSwitch, flat ring or tree).
    local < n: hierarchical: the operation inside the node over `local` ranks on the full buffer,
    then across the n / local nodes on a 1/local shard (NCCL's and Megatron's 2D scheme). Every
    device of a node is busy in its own group at the same time (groups laid side by side), so each
    rank gets 1/devices_per_node of the node's network bandwidth.
    """
    n = np.asarray(n, dtype=float)
    local = np.minimum(np.asarray(local, dtype=float), n)
    size = np.asarray(size_bytes, dtype=float)
    nodes = n / local
    a_in = hw.intra_node_latency_us * 1e-6
    a_out = hw.inter_node_latency_us * 1e-6
    b_in = intra_bus_Bps(hw, kind)
    # Each device drives its share of the node's NICs (all devices communicate at once in
    # data/pipeline-parallel groups laid out side by side).
    b_out = inter_bus_Bps_per_node(hw, kind) / hw.devices_per_node
    flat = {"allreduce": allreduce_seconds, "reduce_scatter": reduce_scatter_seconds,
            "allgather": allgather_seconds}[kind]
    inside = flat(size, local, b_in, a_in)
    across = flat(size / local, nodes, b_out, a_out)
    return np.where(nodes > 1, inside + across, inside)


def tied_embedding_sync_seconds(vocab, hidden, tp, grad_bytes, pair_in_node, hw: HardwareProfile):
    """All-reduce of a tied embedding's two gradient copies between the first and the last pipeline
    stage, once per step after the backward (Megatron-LM's embedding group, Shoeybi et al. 2019):
    vocab x hidden / tp values of `grad_bytes` each over 2 ranks, over NVLink when both stages sit in
    one node (`pair_in_node`), else over the network. Arrays broadcast."""
    local = np.where(pair_in_node, 2.0, 1.0)
    return group_collective_seconds("allreduce", vocab * hidden / np.asarray(tp, dtype=float) * grad_bytes,
                                    2.0, local, hw)

