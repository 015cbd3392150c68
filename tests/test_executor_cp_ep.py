"""Context parallelism, expert parallelism and hybrid sharding on the embedded executor.

Fast checks of the pieces first (the load-balanced split, the chunked attention's masking and merge,
the expert groups, the expert-parallel MoE forward, token positions), then one `planner run --verify`
launch per layout on tiny models, each verified over 3 AdamW steps in fp32 against one process
(verify.py: every step's loss and gradients against their rounding bounds, the optimizer replayed).
The planted bugs of these layouts (cp_drop_kv_block, ep_wrong_rank, hsdp_skip_replica_reduce) are in
test_executor_verify.py with the others.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from executor_plans import verified_run
from planner.executor.context import _chunk_attention, chunk_ids, cp_positions
from planner.executor.experts import ExpertParallelMoE, expert_groups
from planner.executor.parallelize import mesh_names
from planner.executor.runspec import resolve_transformer
from planner.executor.tiny import gpt_tiny_spec, llama_tiny_spec, mixtral_tiny_spec
from planner.models.transformer import MoEFeedForward, build_model
from planner.parallel import ParallelConfig

GPT = "planner.executor.tiny:gpt_tiny"
LLAMA = "planner.executor.tiny:llama_tiny"
MIXTRAL = "planner.executor.tiny:mixtral_tiny"
DEEPSEEK = "planner.executor.tiny:deepseek_tiny"


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_load_balanced_split_tiles_the_sequence_with_equal_causal_work(cp):
    seq = 8 * cp
    held = [cp_positions(seq, cp, r) for r in range(cp)]
    assert torch.equal(torch.cat(held).sort().values, torch.arange(seq))  # every position once
    # causal work of a rank = sum over its queries of the keys at or before them: equal on every rank
    work = {int((p + 1).sum()) for p in held}
    assert len(work) == 1
    assert chunk_ids(cp, 0) == (0, 2 * cp - 1)


def _qkv(cp, heads=4, kv_heads=2, seq=None, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    seq = seq or 4 * cp
    q = torch.randn(2, heads, seq, d, generator=gen)
    k = torch.randn(2, kv_heads, seq, d, generator=gen)
    v = torch.randn(2, kv_heads, seq, d + 4, generator=gen)  # d_v != d_qk, as in MLA
    return q, k, v


def _rank_output(q, k, v, cp, rank, *, causal, drop_last=False):
    """What cp rank `rank` computes from the blocks of every rank (the ring's data, without processes)."""
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    seq = q.shape[2]
    mine = cp_positions(seq, cp, rank)
    sources = [(rank - step) % cp for step in range(cp)]
    if drop_last:
        sources = sources[:-1]
    blocks = [
        (kk[:, :, cp_positions(seq, cp, s)], vv[:, :, cp_positions(seq, cp, s)], chunk_ids(cp, s))
        for s in sources
    ]
    return mine, _chunk_attention(
        q[:, :, mine], blocks, chunk_ids(cp, rank), causal=causal, scale=q.shape[-1] ** -0.5
    )


@pytest.mark.parametrize("cp", [1, 2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_chunked_attention_over_every_ranks_blocks_equals_full_attention(cp, causal):
    """Each rank's queries against the key/value chunks of all ranks, merged by log-sum-exp, give the
    rows of one full (causal) SDPA at that rank's positions; without the last block they do not."""
    q, k, v = _qkv(cp)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    for rank in range(cp):
        mine, out = _rank_output(q, k, v, cp, rank, causal=causal)
        torch.testing.assert_close(out, full[:, :, mine], rtol=1e-5, atol=1e-6)
        if cp > 1:
            _, missing = _rank_output(q, k, v, cp, rank, causal=causal, drop_last=True)
            assert (missing - full[:, :, mine]).abs().max() > 1e-2


@pytest.mark.parametrize(
    "spec",
    [gpt_tiny_spec(layers=2, seq=16), llama_tiny_spec(layers=2, seq=16)],
    ids=["learned-positions", "rope"],
)
def test_positions_follow_the_tokens_a_rank_holds(spec):
    """Without a causal mask attention is order-free, so the model fed the sequence in the order the
    cp ranks hold it, with the Transformer's `positions` set to that order, gives the full model's
    outputs in that order: learned and rotary position encodings both read `positions`, not 0..s-1."""
    model = build_model(spec.with_(causal=False), seed=0)
    tokens = torch.randint(0, spec.vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    full = model(tokens)
    order = torch.cat([cp_positions(16, 4, r) for r in range(4)])  # 0-1 14-15 2-3 12-13 ...
    assert not torch.allclose(
        model(tokens[:, order]), full[:, order], atol=1e-4
    )  # positions matter
    model.positions = order
    torch.testing.assert_close(model(tokens[:, order]), full[:, order], rtol=1e-4, atol=1e-5)


def test_expert_groups_regroup_a_stages_ranks_with_ep_innermost():
    # placement DPCT, dp 2 x cp 2 (mesh dp, pp, cp, tp): stage ranks in (d, c) order 0 1 2 3
    layout = np.arange(4).reshape(2, 1, 2, 1)
    ep, edp = expert_groups(layout, 1, 2)
    assert ep.tolist() == [[0, 1], [2, 3]] and edp.tolist() == [[0, 2], [1, 3]]
    # dp 2 x pp 2 (mesh dp, pp, cp, tp = 2, 2, 1, 1): stage 0 holds ranks 0, 2 and stage 1 ranks 1, 3
    ep, edp = expert_groups(np.arange(4).reshape(2, 2, 1, 1), 1, 2)
    assert ep.tolist() == [[0, 2], [1, 3]] and edp.tolist() == [[0], [2], [1], [3]]
    # dp 4, ep 2: expert data-parallel pairs of equal ep position
    ep, edp = expert_groups(np.arange(4).reshape(4, 1, 1, 1), 1, 2)
    assert ep.tolist() == [[0, 1], [2, 3]] and edp.tolist() == [[0, 2], [1, 3]]


def _members_per_node(groups, devices_per_node: int) -> int:
    """Fewest members any group has on one of its nodes (the slowest group's link)."""
    return min(
        int(np.unique(np.asarray(g) // devices_per_node, return_counts=True)[1].min())
        for g in groups
    )


@pytest.mark.parametrize("placement", ["PDECT", "DPECT", "DECTP"])
def test_expert_groups_are_the_groups_the_cost_model_costs(placement):
    """The executor's ep and expert data-parallel groups, built from its own mesh, put as many
    members on a node as planner.placement.group_locality says (its 'E' and 'ED' groups)."""
    from planner.placement import group_locality, placement_index

    for dp, cp, pp, ep in [
        (d, c, p, e)
        for d in (1, 2, 4)
        for c in (1, 2)
        for p in (1, 2)
        for e in (1, 2, 4)
        if (d * c) % e == 0
    ]:
        cfg = ParallelConfig(dp=dp, cp=cp, pp=pp, ep=ep, global_batch=dp, placement=placement)
        names, shape = mesh_names(cfg)
        ep_rows, edp_rows = expert_groups(
            np.arange(cfg.world_size).reshape(shape), names.index("pp"), ep
        )
        for devices in (2, 4, 8):
            costed = group_locality(placement_index(placement), dp, pp, 1, devices, cp=cp, ep=ep)
            assert (_members_per_node(ep_rows, devices), _members_per_node(edp_rows, devices)) == (
                int(costed["E"]),
                int(costed["ED"]),
            ), (dp, cp, pp, ep, devices)


def _groups_over(layout: np.ndarray, names: tuple, axes: tuple) -> np.ndarray:
    """One row per group of ranks that differ only along `axes` of the mesh."""
    keep = [i for i, n in enumerate(names) if n in axes]
    other = [i for i in range(len(names)) if i not in keep]
    return np.transpose(layout, other + keep).reshape(
        -1, int(np.prod([layout.shape[i] for i in keep]))
    )


@pytest.mark.parametrize("placement", ["DPCT", "PDCT", "DCTP"])
def test_hybrid_shard_and_replica_groups_are_the_groups_the_cost_model_costs(placement):
    """HSDP's shard groups (dp_shard x cp) and replica groups (dp_replicate) on the executor's mesh
    put as many members on a node as planner.placement.group_locality's 'S' and 'R' (for placements
    with C inside D; with D inside C, e.g. CTDP, the cost model's 'S' counts fewer: a reported gap)."""
    from planner.placement import group_locality, placement_index

    for dp, shard, cp, pp in [(4, 2, 1, 2), (4, 2, 2, 1), (8, 2, 2, 2), (8, 4, 2, 1), (4, 1, 2, 2)]:
        cfg = ParallelConfig(
            dp=dp, cp=cp, pp=pp, dp_shard=shard, zero=3, global_batch=dp, placement=placement
        )
        names, shape = mesh_names(cfg)
        layout = np.arange(cfg.world_size).reshape(shape)
        shards, replicas = (
            _groups_over(layout, names, ("dp_shard", "cp")),
            _groups_over(layout, names, ("dp_replicate",)),
        )
        for devices in (2, 4, 8):
            costed = group_locality(
                placement_index(placement), dp, pp, 1, devices, cp=cp, dp_shard=shard
            )
            assert (_members_per_node(shards, devices), _members_per_node(replicas, devices)) == (
                int(costed["S"]),
                int(costed["R"]),
            ), (dp, shard, cp, pp, devices)


def test_executor_mesh_inserts_context_and_splits_dp_for_hybrid_sharding():
    assert mesh_names(ParallelConfig(dp=2, tp=2, global_batch=2)) == (
        ("dp", "pp", "cp", "tp"),
        (2, 1, 1, 2),
    )
    cfg = ParallelConfig(dp=4, cp=2, dp_shard=2, zero=3, global_batch=4, placement="DPCT")
    assert mesh_names(cfg) == (("dp_replicate", "dp_shard", "pp", "cp", "tp"), (2, 2, 1, 2, 1))
    assert mesh_names(ParallelConfig(dp=4, dp_shard=2, zero=0, global_batch=4))[0] == (
        "dp",
        "pp",
        "cp",
        "tp",
    )


def test_expert_parallel_forward_at_ep1_is_the_reference_moe_and_every_expert_gets_a_gradient():
    spec = mixtral_tiny_spec(experts=8)
    torch.manual_seed(0)
    reference = MoEFeedForward(spec)
    ours = MoEFeedForward(spec)
    ours.load_state_dict(reference.state_dict())
    ours.__class__ = ExpertParallelMoE
    ours.experts = torch.nn.ModuleDict({str(e): m for e, m in enumerate(ours.experts)})
    x = torch.randn(1, 3, spec.hidden)  # 3 tokens x top-2: at most 6 of 8 experts used
    (reference(x) ** 2).sum().backward()
    (ours(x) ** 2).sum().backward()
    for (name, p), (_, q) in zip(reference.named_parameters(), ours.named_parameters()):
        assert q.grad is not None, name  # unused experts too: a zero gradient, not None
        torch.testing.assert_close(
            q.grad, p.grad if p.grad is not None else torch.zeros_like(p), rtol=1e-5, atol=1e-7
        )
    assert (
        sum(p.grad is None for p in reference.parameters()) > 0
    )  # the reference skips unused experts


LAYOUTS = {
    # context parallelism: ring (p2p) under DDP over dp x cp, written as an FP8 plan (runs fp32 here)
    "dp2xcp2-p2p-fp8-plan": (
        GPT,
        dict(dp=2, cp=2, global_batch=4, micro_batch=1, placement="DPCT", precision="fp8"),
    ),
    "cp2xtp2-sp-all_gather": (
        LLAMA,
        dict(
            cp=2,
            tp=2,
            sequence_parallel=True,
            cp_comm="all_gather",
            global_batch=2,
            micro_batch=1,
            placement="DPCT",
        ),
    ),
    "cp2-a2a-full-recompute": (
        LLAMA,
        dict(cp=2, cp_comm="a2a", recompute="full", global_batch=2, placement="DPCT"),
    ),
    # expert parallelism: experts over dp, expert grads all-reduced over the expert data-parallel pairs
    "dp4-ep2-zero2": (
        MIXTRAL,
        dict(dp=4, ep=2, zero=2, global_batch=4, micro_batch=1, placement="DPET"),
    ),
    "dp2-ep2-pp2-1f1b": (
        DEEPSEEK,
        dict(dp=2, ep=2, pp=2, schedule="1f1b", global_batch=4, micro_batch=1, placement="DPET"),
    ),
    "cp2-ep2": (MIXTRAL, dict(cp=2, ep=2, global_batch=2, placement="DPECT")),
    # hybrid sharding: ZeRO-3 shards over dp_shard x cp = 2 ranks, replicated over 2
    "hsdp-dp2xcp2-shard1-zero3": (
        GPT,
        dict(dp=2, cp=2, dp_shard=1, zero=3, global_batch=2, placement="DPCT"),
    ),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_is_single_process_training_for_three_adamw_steps(name, tmp_path):
    model, knobs = LAYOUTS[name]
    cfg = ParallelConfig(seq=32, **{"precision": "fp32", **knobs})
    doc, result = verified_run(tmp_path, cfg, model)
    verify = doc["verify"]
    assert verify["passed"] and verify["steps"] == [0, 1, 2] and verify["problems"] == [], verify
    n_params = len(
        list(build_model(resolve_transformer(model, 32), device="meta", seed=None).parameters())
    )
    assert verify["params_compared"] == n_params  # every tensor, experts of every rank
    assert max(verify["max_ratio"].values()) < 0.05, verify["max_ratio"]
    assert len(doc["ranks"]) == cfg.world_size
    if cfg.cp > 1:
        assert sorted({r["cp"] for r in doc["ranks"]}) == list(range(cfg.cp))
    if cfg.ep > 1:
        assert sorted({r["ep"] for r in doc["ranks"]}) == list(range(cfg.ep))
    if cfg.precision == "fp8":
        assert doc["precision_used"] == "fp32"
        assert result.stderr.strip() == (
            "warning: FP8 GEMMs need an FP8 device; this CPU run uses fp32 instead "
            "(as every CPU run of the executor)"
        )
    if 0 < cfg.dp_shard < cfg.dp:
        assert any("hybrid sharding (FSDP2 HSDP)" in n for n in doc["notes"])
