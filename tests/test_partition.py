"""Stage partitioning: the DP and CP-SAT reach the same optimum, which beats the even split."""

import itertools
import random

import pytest

from planner.errors import ConfigError
from planner.partition import PartitionProblem, even_split, split, split_cpsat, split_dp
from planner.run_options import RunOptions


def compositions(total, parts):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        edges = (0,) + cuts + (total,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def brute(problem, objective="speed"):
    best = None
    for stages in compositions(problem.blocks, problem.chunks):
        work, mem = problem.stage_costs(stages)
        if problem.capacity_bytes is not None and mem.max() > problem.capacity_bytes:
            continue
        key = (work.max(), mem.max())
        if best is None or key < best[0]:
            best = (key, stages)
    return best


def random_problem(rng, *, L, pp, v=1, cap=False):
    work = tuple(float(rng.randint(1, 9)) for _ in range(L))
    static = tuple(float(rng.randint(1, 5)) for _ in range(L))
    act = tuple(float(rng.randint(1, 3)) for _ in range(L))
    chunks = pp * v
    inflight = tuple(max(1, pp - (c % pp)) for c in range(chunks))
    problem = PartitionProblem(
        block_work=work,
        block_static_bytes=static,
        block_activation_bytes=act,
        pp=pp,
        virtual_stages=v,
        first_work=float(rng.randint(0, 6)),
        first_static_bytes=float(rng.randint(0, 20)),
        last_work=float(rng.randint(0, 20)),
        last_static_bytes=float(rng.randint(0, 20)),
        last_activation_bytes=2.0,
        inflight=inflight,
    )
    if cap:
        _, mem = problem.stage_costs(even_split(L, chunks))
        problem = PartitionProblem(
            **{
                **{f: getattr(problem, f) for f in problem.__slots__},
                "capacity_bytes": float(mem.max()) * 0.9,
            }
        )
    return problem


def test_even_split():
    assert even_split(96, 10) == (10,) * 6 + (9,) * 4
    assert even_split(8, 4) == (2, 2, 2, 2)


def test_uniform_blocks_without_ends_split_evenly():
    p = PartitionProblem(
        block_work=(1.0,) * 12,
        block_static_bytes=(1.0,) * 12,
        block_activation_bytes=(0.0,) * 12,
        pp=4,
    )
    assert split_dp(p).stages == (3, 3, 3, 3)


def test_heavy_head_gets_fewer_blocks_and_beats_the_even_split():
    # head as heavy as 3 blocks, embedding as 1 (a large vocabulary)
    p = PartitionProblem(
        block_work=(1.0,) * 32,
        block_static_bytes=(1.0,) * 32,
        block_activation_bytes=(0.0,) * 32,
        pp=4,
        first_work=1.0,
        last_work=3.0,
    )
    part = split_dp(p)
    assert part.stages[-1] < part.stages[1] and part.stages[0] < part.stages[1]
    even_work, _ = p.stage_costs(even_split(32, 4))
    assert part.max_work < even_work.max()
    assert part.max_work == 9.0  # (32 + 1 + 3) / 4 = 9 exactly: stages 8? -> (8, 9, 9, 6)
    assert part.stages == (8, 9, 9, 6)


@pytest.mark.parametrize("seed", range(12))
def test_dp_matches_brute_force_and_cpsat(seed):
    rng = random.Random(seed)
    problem = random_problem(rng, L=rng.randint(6, 11), pp=rng.randint(2, 4), cap=seed % 2 == 1)
    expected = brute(problem)
    if expected is None:
        with pytest.raises(ConfigError):
            split_dp(problem)
        with pytest.raises(ConfigError):
            split_cpsat(problem)
        return
    dp, sat = split_dp(problem), split_cpsat(problem)
    assert dp.max_work == pytest.approx(expected[0][0])
    assert sat.max_work == pytest.approx(expected[0][0])
    assert dp.max_bytes == pytest.approx(expected[0][1])  # tie-broken on memory
    assert sat.max_bytes == pytest.approx(expected[0][1])


@pytest.mark.parametrize("seed", range(6))
def test_cpsat_interleaved_matches_brute_force(seed):
    rng = random.Random(100 + seed)
    problem = random_problem(rng, L=rng.randint(8, 10), pp=2, v=2, cap=seed % 2 == 1)
    expected = brute(problem)
    if expected is None:
        with pytest.raises(ConfigError):
            split(problem)
        return
    part = split(problem)
    assert part.method == "cp-sat"
    assert part.max_work == pytest.approx(expected[0][0])
    assert part.max_bytes == pytest.approx(expected[0][1])


def test_memory_objective_trades_a_little_speed_for_memory():
    rng = random.Random(7)
    problem = random_problem(rng, L=20, pp=4)
    fast, lean = split_dp(problem), split_dp(problem, objective="memory", slack=0.2)
    assert lean.max_bytes <= fast.max_bytes
    assert lean.max_work <= fast.max_work * 1.2 + 1e-9
    lean_sat = split_cpsat(problem, objective="memory", slack=0.2)
    assert lean_sat.max_bytes == pytest.approx(lean.max_bytes, rel=1e-6)


def test_dp_and_cpsat_agree_on_a_gpt3_sized_problem():
    """96 blocks over 8 stages, head ~1.2 blocks, embedding static memory: same optimum."""
    L = 96
    p = PartitionProblem(
        block_work=(1.0,) * L,
        block_static_bytes=(2.0,) * L,
        block_activation_bytes=(1.0,) * L,
        pp=8,
        first_static_bytes=30.0,
        last_work=1.2,
        inflight=tuple(range(8, 0, -1)),
    )
    dp, sat = split_dp(p), split_cpsat(p)
    assert dp.max_work == pytest.approx(sat.max_work, rel=1e-7)
    assert dp.max_bytes == pytest.approx(sat.max_bytes, rel=1e-7)


def test_impossible_capacity_is_a_config_error():
    p = PartitionProblem(
        block_work=(1.0,) * 4,
        block_static_bytes=(5.0,) * 4,
        block_activation_bytes=(0.0,) * 4,
        pp=2,
        capacity_bytes=4.0,
    )
    with pytest.raises(ConfigError, match="capacity"):
        split_dp(p)
    with pytest.raises(ConfigError, match="capacity"):
        split_cpsat(p)


def test_more_stages_than_blocks_is_rejected():
    with pytest.raises(ConfigError, match="pp"):
        PartitionProblem(
            block_work=(1.0,) * 3,
            block_static_bytes=(1.0,) * 3,
            block_activation_bytes=(1.0,) * 3,
            pp=4,
        )


def test_tied_embedding_sync_is_priced_only_when_split():
    from cost_models.comm import tied_embedding_sync_seconds
    from hardware_profiles import load_profile
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig
    from planner.sources import resolve_model

    hw, gpt3 = load_profile("p4d.24xlarge"), resolve_model("gpt3-175b")
    # dp = 1, so dp_comm holds nothing but the tied embedding's all-reduce
    one = ParallelConfig(dp=1, tp=8, pp=1, global_batch=8)
    assert estimate(gpt3, hw, one, gpus=8).scores.dp_comm[0] == 0.0  # pp=1: co-located
    inside = ParallelConfig(
        dp=1, tp=1, pp=8, global_batch=8, placement="DPT"
    )  # pp stride 1: one node
    across = ParallelConfig(
        dp=1, tp=8, pp=8, global_batch=8, placement="DPT"
    )  # pp stride 8: 8 nodes
    t_in = float(estimate(gpt3, hw, inside, gpus=8).scores.dp_comm[0])
    t_out = float(estimate(gpt3, hw, across, gpus=64).scores.dp_comm[0])
    assert 0 < t_out and 0 < t_in
    # V h bf16 gradients: the megatron profile's reduction dtype (frameworks/megatron.json)
    assert t_in == tied_embedding_sync_seconds(gpt3.vocab, gpt3.hidden, 1, 2.0, True, hw)
    # across nodes: V h / tp bf16 values, each direction over a 1/8 share of 400 Gb/s
    assert t_out > t_in * 2
    llama = resolve_model("llama3-8b")  # untied
    assert estimate(llama, hw, inside, gpus=8).scores.dp_comm[0] == 0.0


@pytest.mark.parametrize(
    "blocks,pp", [(70, 12), (106, 12), (100, 6), (82, 12), (94, 12), (70, 8), (24, 4), (48, 3)]
)
def test_deepspeed_type_partition_counts_the_embedding_and_head_as_blocks(blocks, pp):
    """DeepSpeed's partition_balanced over binary weights (blocks and both embeddings weigh 1): every block
    placed once, the heaviest stage as light as (blocks + 2) / pp allows, the embedding and head stages
    one block lighter when the split comes out even."""
    from math import ceil

    from planner.partition import deepspeed_type_stages

    stages = deepspeed_type_stages(blocks, pp)
    assert len(stages) == pp and sum(stages) == blocks
    units = [n + (k == 0) + (k == pp - 1) for k, n in enumerate(stages)]
    assert max(units) == ceil((blocks + 2) / pp)
    if (blocks + 2) % pp == 0:
        assert units == [(blocks + 2) // pp] * pp


def test_deepspeed_type_partition_of_bloom():
    """BLOOM-176B: 70 blocks + 2 embeddings over 12 stages, 6 units each (its README's choice of 70 layers)."""
    from planner.partition import deepspeed_type_stages

    assert deepspeed_type_stages(70, 12) == [5] + [6] * 10 + [5]


def test_megatron_deepspeeds_default_partition_fills_the_first_stages():
    """'type:transformer' weighs the blocks only: 78 blocks over 12 stages are 7 x 11 and 1 (BigScience's prequel,
    "Re-do": "the last stage has 1 block, while the rest have 7"); an even count splits evenly."""
    from planner.partition import deepspeed_type_stages

    assert deepspeed_type_stages(78, 12, embeddings=False) == [7] * 11 + [1]
    assert deepspeed_type_stages(72, 12, embeddings=False) == [6] * 12


def test_bf16_optimizer_reduces_the_tied_embedding_gradient_in_fp32():
    """DeepSpeed's PipelineEngine all-reduces a tied weight's fp32 gradient (weight._hp_grad) between the first and
    last stage when BF16_Optimizer runs (pipe/engine.py _exec_reduce_tied_grads, v0.6.5), the bf16 .grad otherwise.
    With dp = 1 nothing else is in dp_comm."""
    from cost_models.comm import tied_embedding_sync_seconds
    from hardware_profiles import load_profile
    from planner.estimate import estimate
    from planner.parallel import ParallelConfig
    from planner.sources import resolve_model

    hw, gpt3 = load_profile("dgx-a100-80g"), resolve_model("gpt3-175b")
    cfg = ParallelConfig(
        dp=1,
        tp=8,
        pp=8,
        global_batch=8,
        zero=1,
        precision="amp-bf16",
        framework="deepspeed",
        placement="PDT",
        recompute="full",
    )
    plain = float(estimate(gpt3, hw, cfg, gpus=64).scores.dp_comm[0])
    bf16 = float(
        estimate(gpt3, hw, cfg, gpus=64, options=RunOptions(bf16_optimizer=True)).scores.dp_comm[0]
    )
    assert plain == pytest.approx(
        tied_embedding_sync_seconds(gpt3.vocab, gpt3.hidden, 8, 2.0, False, hw)
    )
    assert bf16 == pytest.approx(
        tied_embedding_sync_seconds(gpt3.vocab, gpt3.hidden, 8, 4.0, False, hw)
    )
