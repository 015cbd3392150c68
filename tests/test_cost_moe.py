"""Expert parallelism in the cost model (cost_models.moe, planner.parallel's ep rule, planner.placement's
expert groups): the rule of MoE parallel folding, the expert groups' locality against an explicit rank
layout, conservation of the routed work over ep / expert_tp, the exchanges on the topology (flat and
hierarchical, node-limited routing against a simulation, DeepEP's published bandwidth), overlap, imbalance,
grouped GEMMs against DeepGEMM's published throughput, expert parameters and their gradient reduction, the
host-bound dropless MoE layer, and `planner estimate --ep`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cost_models import compute as K
from cost_models import experts as EX
from cost_models import moe as MO
from cost_models import params as P
from hardware_profiles import load_profile
from planner.catalog import get
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate
from planner.software import software_for
from planner.parallel import (
    ParallelConfig,
    expert_data_parallel,
    expert_parallel_degrees,
    expert_parallel_ok,
)
from planner.placement import (
    PLACEMENTS,
    group_locality,
    placement_index,
    stage_group_locality,
    strides,
)
from planner.run_options import RunOptions
from tests.fixtures.steps import step

ROOT = Path(__file__).resolve().parents[1]
H100 = load_profile("dgx-h100")
QWEN = get("qwen3-235b-a22b").with_(seq=4096)
QWEN30 = get("qwen3-30b-a3b").with_(seq=4096)
DSV3 = get("deepseek-v3").with_(seq=4096)


def qwen_cfg(**kw):
    base = dict(
        dp=16,
        tp=2,
        pp=8,
        ep=32,
        micro_batch=1,
        global_batch=2048,
        seq=4096,
        zero=1,
        sequence_parallel=True,
        placement="PDET",
    )
    return ParallelConfig(**(base | kw))


# ------------------------------------------------------------------------------------------ the ep rule


def test_folding_lets_ep_exceed_dp_times_cp_when_expert_tp_is_smaller_than_tp():
    # Megatron-Core MoE parallel folding: the published Qwen3-235B runs use tp 2, dp 16, ep 32, expert_tp 1
    assert expert_parallel_ok(dp=16, tp=2, cp=1, ep=32, expert_tp=1)
    assert not expert_parallel_ok(dp=16, tp=2, cp=1, ep=32, expert_tp=2)  # 64 does not divide 32
    assert not expert_parallel_ok(dp=16, tp=2, cp=1, ep=64)
    assert (
        expert_data_parallel(dp=16, tp=2, ep=32) == 1
        and expert_data_parallel(dp=8, tp=4, ep=8) == 4
    )
    ParallelConfig(dp=16, tp=2, ep=32, global_batch=16, placement="DPET")
    with pytest.raises(
        ConfigError,
        match=r"ep\*expert_tp = 64 must divide tp\*cp\*dp = 32.*allowed ep here: "
        r"1, 2, 4, 8, 16, 32",
    ):
        ParallelConfig(dp=16, tp=2, ep=64, global_batch=16, placement="DPET")


@given(
    dp=st.integers(1, 24),
    tp=st.sampled_from([1, 2, 4, 8]),
    cp=st.sampled_from([1, 2]),
    ep=st.integers(1, 64),
    etp=st.sampled_from([1, 2, 4]),
)
def test_ep_rule_is_divisibility_and_works_on_arrays(dp, tp, cp, ep, etp):
    ok = expert_parallel_ok(dp=dp, tp=tp, cp=cp, ep=ep, expert_tp=etp)
    assert ok == ((tp * cp * dp) % (ep * etp) == 0)
    arr = expert_parallel_ok(
        dp=np.array([dp, dp]), tp=tp, cp=cp, ep=np.array([ep, 1]), expert_tp=etp
    )
    assert list(arr) == [ok, (tp * cp * dp) % etp == 0]


@given(
    dp=st.integers(1, 24),
    tp=st.sampled_from([1, 2, 4, 8]),
    cp=st.sampled_from([1, 2]),
    etp=st.sampled_from([1, 2, 4]),
    experts=st.sampled_from([None, 0, 8, 64, 256]),
)
def test_the_searched_ep_degrees_are_the_ones_the_rule_admits(dp, tp, cp, etp, experts):
    """expert_parallel_degrees (what the search enumerates) lists, ascending, every ep the rule admits: with
    whole experts per rank the divisors of the experts, with experts 0 every degree up to tp cp dp."""
    got = expert_parallel_degrees(dp=dp, tp=tp, cp=cp, expert_tp=etp, experts=experts)
    if experts is None:
        assert got == [1]
        return
    top = experts or tp * cp * dp
    assert got == [
        e
        for e in range(1, top + 1)
        if (tp * cp * dp) % (e * etp) == 0 and (not experts or experts % e == 0)
    ]
    assert all(type(e) is int for e in got)


def test_experts_must_split_evenly_and_dense_models_refuse_ep():
    with pytest.raises(ConfigError, match=r"ep=3 .*divisor of experts\(128\)"):
        ParallelConfig(dp=3, ep=3, global_batch=3, placement="DPET").check_experts(QWEN.moe)
    with pytest.raises(ConfigError, match="expert parallelism needs a mixture-of-experts model"):
        ParallelConfig(dp=2, ep=2, global_batch=2, placement="DPET").check_experts(None)
    ParallelConfig(dp=2, ep=2, global_batch=2, placement="DPET").check_experts(QWEN.moe)


# --------------------------------------------------------------------------------- expert group layout


def _explicit_groups(placement_idx, dp, pp, tp, cp, n, g):
    """Rank sets of a group of n members g apart in a stage's (D, C, T) numbering, from the strides."""
    text = PLACEMENTS[placement_idx]
    st_ = {k: int(v) for k, v in strides(placement_idx, dp, pp, tp, cp).items()}
    order = [a for a in text.replace("T", "CT") if a != "P"]  # non-pipeline axes, outer first
    size = {"D": dp, "C": cp, "T": tp}
    groups = []
    for p in range(pp):
        ranks = []
        for f in range(dp * cp * tp):  # mixed-radix digits of f
            rest, coord = f, {}
            for a in reversed(order):
                coord[a], rest = rest % size[a], rest // size[a]
            ranks.append(p * st_["P"] + sum(coord[a] * st_[a] for a in order))
        for start in range(0, len(ranks), g * n):
            for off in range(g):
                groups.append([ranks[start + off + k * g] for k in range(n)])
    return groups


@settings(max_examples=60, deadline=None)
@given(
    place=st.integers(0, 5),
    dp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    tp=st.sampled_from([1, 2, 4]),
    cp=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_expert_group_locality_matches_an_explicit_layout(place, dp, pp, tp, cp, data):
    """ranks_per_node of stage_group_locality is the fewest members any group has on one node of 8."""
    stage = dp * cp * tp
    n = data.draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32) if stage % d == 0]))
    g = data.draw(st.sampled_from([d for d in (1, 2, 4) if stage % (d * n) == 0]))
    groups = _explicit_groups(place, dp, pp, tp, cp, n, g)
    slowest = min(
        min(sum(1 for r in grp if r // 8 == node) for node in {r // 8 for r in grp})
        for grp in groups
    )
    got = int(stage_group_locality(place, dp, pp, tp, n, g, 8, cp=cp))
    # aligned layouts are exact; a layout that straddles nodes unevenly is costed at one member per node
    assert got == slowest or (got == 1 and slowest >= 1)
    assert got <= slowest


def test_megatron_order_keeps_an_ep8_group_in_one_node_and_dpt_spreads_it():
    pdt, dpt = placement_index("PDT"), placement_index("DPT")
    assert int(stage_group_locality(pdt, 16, 8, 2, 32, 1, 8)) == 8  # 32 ranks over 4 nodes
    assert (
        int(stage_group_locality(dpt, 16, 8, 2, 32, 1, 8)) == 2
    )  # tp pairs, pipeline stages between
    loc = group_locality(np.array([pdt]), 8, 8, 4, 8, ep=8)
    assert int(loc["E"][0]) == 8 and int(loc["ED"][0]) == 1  # expert_dp 4: one per node


# ----------------------------------------------------------------------------------- routed work


@settings(max_examples=30, deadline=None)
@given(
    ep=st.sampled_from([1, 2, 4, 8, 16, 32]),
    etp=st.sampled_from([1, 2]),
    tp=st.sampled_from([1, 2, 4]),
)
def test_expert_gemm_flops_per_rank_do_not_depend_on_the_expert_layout(ep, etp, tp):
    """rows x local experts x width = the rank's share of t k f_e, whatever ep and expert_tp (balanced)."""
    dp = max(ep * etp // tp, 1) * 2
    cfg = ParallelConfig(
        dp=dp,
        tp=tp,
        ep=ep,
        expert_tp=etp,
        global_batch=dp,
        seq=4096,
        sequence_parallel=tp > 1,
        placement="PDET" if ep > 1 else "PDT",
    )
    x = step(QWEN, cfg)
    flops = sum(float(np.asarray(g.flops).reshape(-1)[0]) for g in EX.expert_gemm_shapes(x))
    expected = (
        2 * 3 * 4096 / tp * QWEN.moe.top_k * QWEN.moe.expert_ffn * QWEN.hidden
    )  # gated: W1, W3, W2
    assert flops == pytest.approx(expected, rel=1e-9)


def test_imbalance_slows_the_busiest_rank_only_with_expert_parallelism():
    cfg = qwen_cfg()
    t = lambda imb, c=cfg: (
        estimate(QWEN, H100, c, gpus=256, options=RunOptions(moe_imbalance=imb)).step_time_s
    )  # noqa: E731
    assert t(1.5) > t(1.2) > t(1.0)
    x1, x2 = step(QWEN, cfg), step(QWEN, cfg, moe_imbalance=2.0)
    assert float(EX.expert_rows(x2)[0]) == pytest.approx(2 * float(EX.expert_rows(x1)[0]))
    assert float(MO.exchange_seconds(x2, 2.0)[0]) > 1.9 * float(MO.exchange_seconds(x1, 2.0)[0])
    one = ParallelConfig(dp=256, tp=1, pp=1, ep=1, global_batch=256, seq=4096, placement="PDT")
    assert float(EX.expert_rows(step(QWEN, one, moe_imbalance=2.0))[0]) == float(
        EX.expert_rows(step(QWEN, one))[0]
    )


# ----------------------------------------------------------------------------------------- exchanges


def test_an_intranode_exchange_is_the_nvlink_all_to_all():
    cfg = ParallelConfig(dp=8, ep=8, global_batch=8, seq=4096, placement="PDET")
    x = step(QWEN30, cfg)
    volume = 4096 * QWEN30.moe.top_k * QWEN30.hidden * 2.0
    b_in = H100.intra_node_GBps_per_device * 1e9 * 0.8
    expected = 7 / 8 * volume / b_in + 7 * H100.intra_node_latency_us * 1e-6
    assert float(MO.exchange_seconds(x, 2.0)[0]) == pytest.approx(expected, rel=1e-9)
    assert float(
        MO.exchange_seconds(step(QWEN30, cfg, moe_dispatcher="deepep"), 2.0)[0]
    ) == pytest.approx(7 / 8 * volume / b_in + 7 * H100.intra_node_latency_us * 1e-6, rel=1e-9)


def test_hierarchical_dispatch_crosses_the_network_once_per_node_and_node_limits_help():
    cfg = ParallelConfig(dp=64, ep=64, global_batch=64, seq=4096, placement="PDET")
    flat, deepep = step(DSV3, cfg), step(DSV3, cfg, moe_dispatcher="deepep")
    assert float(MO.exchange_seconds(deepep, 2.0)[0]) < 0.6 * float(
        MO.exchange_seconds(flat, 2.0)[0]
    )
    limited = float(MO.remote_domains_per_token(deepep)[0])
    free = replace(DSV3, moe=replace(DSV3.moe, groups_per_token=0))
    unlimited = float(MO.remote_domains_per_token(step(free, cfg, moe_dispatcher="deepep"))[0])
    assert (
        limited == pytest.approx(4 * 7 / 8) and unlimited > limited
    )  # DeepSeek-V3: at most 4 of 8 nodes


@pytest.mark.parametrize("domains,k", [(2, 8), (4, 8), (8, 8), (8, 2), (16, 6)])
def test_remote_domains_per_token_match_a_simulation_of_uniform_routing(domains, k):
    rng = np.random.default_rng(0)
    hits = rng.integers(0, domains, size=(20000, k))  # domain of each routed copy
    simulated = np.mean([len(set(row) - {0}) for row in hits])  # the token lives on domain 0
    spec = replace(DSV3, moe=replace(DSV3.moe, top_k=k, groups_per_token=0, expert_groups=1))
    cfg = ParallelConfig(
        dp=8 * domains, ep=8 * domains, global_batch=8 * domains, seq=4096, placement="PDET"
    )
    assert float(MO.remote_domains_per_token(step(spec, cfg))[0]) == pytest.approx(
        simulated, rel=0.02
    )


def test_deepep_published_bandwidth_is_reproduced():
    """The hierarchical exchange's bottleneck bandwidth within 25% of DeepEP's normal kernels on H800
    (validation/kernels/moe_dispatch.json). DeepEP's figure is logical: across nodes the bytes a rank sends
    to every destination node, its own included (R G / (G - 1) copies of each token for R remote ones),
    over the kernel time; inside one node the NVLink bytes over the time."""
    from benchmarks.published_rows import hardware

    data = json.loads((ROOT / "validation" / "kernels" / "moe_dispatch.json").read_text())
    h800 = hardware("h800-deepseek")
    for row in data["series"]:
        ep = row["ep"]
        cfg = ParallelConfig(
            dp=ep, ep=ep, global_batch=ep, seq=4096, precision="fp8", placement="PDET"
        )
        x = step(DSV3, cfg, hw=h800, moe_dispatcher="deepep", moe_fp8_dispatch=True)
        for kind, element in (("dispatch", MO.FP8_DISPATCH_BYTES), ("combine", 2.0)):
            t = float(MO.exchange_seconds(x, element)[0])
            if row["link"] == "rdma":
                nodes = ep / 8
                moved = (
                    4096
                    * DSV3.hidden
                    * element
                    * float(MO.remote_domains_per_token(x)[0])
                    * nodes
                    / (nodes - 1)
                )
            else:
                moved = 4096 * DSV3.moe.top_k * DSV3.hidden * element * 7 / 8
            assert moved / t / 1e9 == pytest.approx(row[f"{kind}_GBps"], rel=0.25), (ep, kind)


def test_overlap_hides_at_most_what_runs_beside_it():
    # interleaved: Megatron-Core runs the overlap at pp > 1 only with virtual stages
    # (Step.a2a_overlap, frameworks.rules.a2a_overlap_runs); at pp=8 without them it hides nothing
    flat = qwen_cfg()
    unrun = MO.ep_block_seconds(
        step(QWEN, flat, moe_a2a_overlap=True), K.block_seconds(step(QWEN, flat))
    )
    assert float(unrun.exposed[0]) == pytest.approx(float(unrun.total[0]))
    cfg = qwen_cfg(schedule="interleaved-1f1b", virtual_stages=2)
    x, xo = step(QWEN, cfg), step(QWEN, cfg, moe_a2a_overlap=True)
    block = K.block_seconds(x)
    plain, over = MO.ep_block_seconds(x, block), MO.ep_block_seconds(xo, block)
    assert float(plain.exposed[0]) == pytest.approx(float(plain.total[0]))
    assert 0 < float(over.exposed[0]) < float(over.total[0])
    from dataclasses import fields

    def scaled(v):
        return tuple(g * 1e3 for g in v) if isinstance(v, tuple) else v * 1e3

    huge = replace(block, **{f.name: scaled(getattr(block, f.name)) for f in fields(block)})
    assert float(MO.ep_block_seconds(xo, huge).exposed[0]) == 0.0
    # the cost term alone (check_framework=False: no refusal of the run option)
    t = lambda **kw: (
        estimate(
            QWEN,
            H100,
            cfg,
            gpus=256,
            check_framework=False,  # noqa: E731
            options=RunOptions(**kw),
        ).step_time_s
    )
    assert t(moe_a2a_overlap=True) < t()


def test_dense_models_and_ep1_have_no_exchange():
    dense = get("llama3-8b").with_(seq=4096)
    est = estimate(dense, H100, ParallelConfig(dp=8, global_batch=8, seq=4096), gpus=8)
    assert (
        est.time_breakdown_s()["ep_comm"] == 0.0
        and "expert_parallel" not in est.to_document()["prediction"]
    )
    one = estimate(QWEN30, H100, ParallelConfig(dp=8, global_batch=8, seq=4096), gpus=8)
    assert one.time_breakdown_s()["ep_comm"] == 0.0


# --------------------------------------------------------------------------------- grouped GEMMs


def test_grouped_gemm_throughput_follows_deepgemm_against_rows_per_expert():
    """One kernel per grouped projection (compute.gemm_seconds, its fixed cost and roofline): the fall of
    throughput from 8192 to 256 rows per expert within 20% of DeepGEMM's, every grouped point within 35%."""
    from benchmarks.published_rows import hardware

    h800 = hardware("h800-deepseek")
    data = json.loads((ROOT / "validation" / "kernels" / "grouped_gemm.json").read_text())["series"]
    grouped = [p for p in data if p["layout"] != "dense"]

    def model_tflops(p):
        g, m, n, k = p["groups"], p["m_per_group"], p["n"], p["k"]
        return (
            2
            * g
            * m
            * n
            * k
            / float(K.gemm_seconds(m, n, k, g, hw=h800, precision="fp8", elem_bytes=1.0))
            / 1e12
        )

    for p in grouped:
        assert model_tflops(p) == pytest.approx(p["tflops"], rel=0.35)
    for n, k in {(p["n"], p["k"]) for p in grouped}:
        big = next(p for p in grouped if (p["n"], p["k"], p["m_per_group"]) == (n, k, 8192))
        small = next(p for p in grouped if (p["n"], p["k"], p["m_per_group"]) == (n, k, 256))
        published = small["tflops"] / big["tflops"]
        assert model_tflops(small) / model_tflops(big) == pytest.approx(published, rel=0.2)


# --------------------------------------------------------------------------------- parameters, memory


def test_expert_parameters_are_sharded_over_ep_times_expert_tp():
    a, b = step(QWEN, qwen_cfg()), step(QWEN, qwen_cfg(ep=16))
    pa, pb = MO.rank_params(a, 12.0, False, False), MO.rank_params(b, 12.0, False, False)
    assert float(pb.expert[0]) == pytest.approx(2 * float(pa.expert[0]))
    assert float(pa.dense[0]) == pytest.approx(float(pb.dense[0]))
    routed = 12 * MO.routed_expert_params(QWEN)
    assert float(pa.expert[0]) * 32 == pytest.approx(routed)
    everything = float(P.rank_params(QWEN, 2, 12.0, False, False))  # all of it / tp
    assert float(pa.total[0]) == pytest.approx(everything - routed / 2 + routed / 32)


def test_expert_optimizer_states_shard_over_the_expert_data_parallel_group():
    """ZeRO-1: dense states over dp (16), experts over expert_dp (tp dp / ep): ep 32 -> 1 (unsharded), ep 8 -> 4."""

    def opt(ep):
        est = estimate(QWEN, H100, qwen_cfg(ep=ep, placement="PDET"), gpus=256)
        return est.memory()["optimizer_bytes"]

    x8, x32 = step(QWEN, qwen_cfg(ep=8)), step(QWEN, qwen_cfg(ep=32))
    assert float(x8.expert_shard_group[0]) == 4 and float(x32.expert_shard_group[0]) == 1
    # ep 8 holds 4x the experts of ep 32 but shards their states 4 ways: the same expert optimizer bytes
    p8, p32 = (MO.rank_params(x, x.blocks_first, True, False) for x in (x8, x32))
    dense_delta = 12 * (float(p8.dense[0]) - float(p32.dense[0])) / 16
    assert opt(8) - opt(32) == pytest.approx(dense_delta, abs=1e6)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """With expert_dp = 1 (ep 32 over tp 2 x dp 16) only the dense gradients are reduced; more expert data
    parallelism adds the experts' reduction."""
    from cost_models import comm as C

    x32, x8 = step(QWEN, qwen_cfg(ep=32)), step(QWEN, qwen_cfg(ep=8))
    sw = software_for("megatron", options=RunOptions(overlap_grad_reduce=False))
    x32, x8 = replace(x32, sw=sw), replace(x8, sw=sw)
    p32 = MO.rank_params(x32, 12.0, True, False)
    only_dense = MO.RankParams(dense=p32.dense, expert=0.0 * p32.expert)
    t = lambda x, p: float(C.dp_comm_seconds(x, p, last_backward_s=1.0, compute_s=1.0)[0])  # noqa: E731
    assert t(x32, p32) == pytest.approx(t(x32, only_dense))
    p8 = MO.rank_params(x8, 12.0, True, False)
    assert t(x8, p8) > t(x8, MO.RankParams(dense=p8.dense, expert=0.0 * p8.expert)) * 1.5


# ----------------------------------------------------------------------------------- host, overlap keys


def test_dropless_layers_are_host_bound_when_a_rank_has_little_work_and_capacity_removes_the_sync():
    cfg = ParallelConfig(
        dp=8,
        tp=1,
        pp=2,
        ep=8,
        micro_batch=1,
        global_batch=1024,
        seq=4096,
        zero=1,
        schedule="interleaved-1f1b",
        virtual_stages=12,
        precision="fp8",
        placement="PDET",
    )
    x = step(QWEN30, cfg)
    block = K.block_seconds(x)
    waited = float(MO.host_sync_seconds(x, block.fwd)[0])
    assert waited > 0
    dropping = replace(QWEN30, moe=replace(QWEN30.moe, capacity_factor=1.0))
    assert float(MO.host_sync_seconds(step(dropping, cfg), block.fwd)[0]) == 0.0
    torchtitan = replace(
        x, sw=replace(x.sw, framework=replace(x.sw.framework, moe_host_sync=False))
    )
    assert float(MO.host_sync_seconds(torchtitan, block.fwd)[0]) == 0.0
    # a device forward longer than the host's issue time hides it
    assert float(MO.host_sync_seconds(x, block.fwd * 100)[0]) == 0.0


def test_framework_moe_keys_are_validated_and_sourced():
    from frameworks.loader import framework_from_dict

    data = json.loads((ROOT / "frameworks" / "megatron.json").read_text())
    fw = framework_from_dict(data)
    assert fw.moe_dispatcher == "alltoall" and fw.moe_host_sync and fw.moe_host_ops_per_layer > 0
    with pytest.raises(ConfigError, match="moe_dispatcher"):
        framework_from_dict(data | {"moe_dispatcher": "nccl"})
    with pytest.raises(ConfigError, match="sources.moe_a2a_overlap"):
        framework_from_dict(
            data | {"sources": {k: v for k, v in data["sources"].items() if k != "moe_a2a_overlap"}}
        )


# --------------------------------------------------------------------------------------- estimate, CLI


def test_cli_estimate_with_ep_records_it_and_explains_the_links():
    runner = CliRunner()
    args = [
        "estimate",
        "qwen3-235b-a22b",
        "--hardware",
        "dgx-h100",
        "--gpus",
        "256",
        "--dp",
        "16",
        "--tp",
        "2",
        "--pp",
        "8",
        "--ep",
        "32",
        "--sequence-parallel",
        "--seq",
        "4096",
        "--global-batch",
        "2048",
    ]
    out = runner.invoke(app, args + ["--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert (
        doc["plan"]["ep"] == 32
        and doc["plan"]["expert_tp"] == 1
        and doc["plan"]["placement"] == "PDET"
    )
    ep = doc["prediction"]["expert_parallel"]
    assert (
        ep["ep_ranks_per_nvlink_domain"] == 8
        and ep["ep_nvlink_domains"] == 4
        and ep["links"] == "NVLink + network"
    )
    assert doc["prediction"]["time_breakdown_s"]["ep_comm"] > 0
    text = runner.invoke(app, args)
    assert text.exit_code == 0 and "8 ranks per NVLink domain over 4 domains" in text.stdout
    bad = runner.invoke(
        app,
        [
            "estimate",
            "llama3-8b",
            "--hardware",
            "dgx-h100",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--ep",
            "2",
        ],
    )
    assert bad.exit_code == 2 and "mixture-of-experts" in bad.output and bad.output.count("\n") == 1


def test_published_runs_are_predicted_within_their_documented_error():
    """Three rows of benchmarks/accuracy_moe.py's table (flat all-to-all across nodes, DeepEP across nodes,
    long context with cp): the shipped model stays within 15% of the published step time."""
    from benchmarks.accuracy_moe import measured_s
    from benchmarks.published_rows import load

    cases = {c.id: c for c in load(["moe"])}
    for rid in (
        "mbridge-2509-qwen3-235b-h100-256-tokendrop",
        "modelzoo-qwen3-235b-crossnode-ep32",
        "modelzoo-qwen3-235b-longctx-32k",
    ):
        c = cases[rid]
        est = estimate(c.spec, c.hardware, c.config, gpus=c.row["gpus"], options=c.options)
        assert est.step_time_s == pytest.approx(measured_s(c), rel=0.15), rid
    assert math.isfinite(est.step_time_s)


def test_ep_links_name_where_the_all_to_all_runs():
    """NVLink only when every rank of the ep group sits in one NVLink domain; any spill crosses the network."""
    from cost_models.moe import EP_LINKS, ep_links

    assert [
        EP_LINKS[ep_links(e, loc)] for e, loc in ((1, 1), (8, 8), (8, 4), (8, 16), (16, 8), (2, 1))
    ] == ["none", "NVLink", "NVLink + network", "NVLink", "NVLink + network", "NVLink + network"]
    assert ep_links(np.array([1, 8, 8]), np.array([1, 8, 4])).tolist() == [0, 1, 2]
