"""Search logic against a small analytic fake scorer (no dependence on the real cost model):
pruning by memory bounds never changes the answer, objectives rank as documented, and no-fit
errors say how far and what would help."""

import math

import numpy as np
import pytest

from hardware_profiles import HardwareProfile
from planner.candidates import SearchSpace
from planner.errors import ConfigError, NoFitError
from planner.plan import plan_from_document
from planner.search import (
    Admission,
    Workload,
    default_global_batch,
    rank,
    recommend,
    score_space,
)
from planner.spec import TransformerSpec

MODEL = TransformerSpec(name="tiny", layers=8, hidden=256, heads=8, vocab=1000, seq=128)


def hw(memory_bytes=2e9, price=10.0):
    return HardwareProfile(
        name="fake-8",
        device="fake",
        devices_per_node=8,
        memory_bytes=int(memory_bytes),
        memory_bandwidth_GBps=1000.0,
        peak_tflops={"bf16": 100.0},
        intra_node_GBps_per_device=100.0,
        intra_node_latency_us=5.0,
        inter_node_Gbps_per_node=100.0,
        inter_node_latency_us=10.0,
        host_device_GBps=10.0,
        price_usd_per_hour=price,
    )


def _get(c, name):
    return np.asarray(c[name] if isinstance(c, dict) else getattr(c, name))


class FakeScores:
    def __init__(self, step, peak):
        self.step_time_s, self.peak_bytes_per_gpu = step, peak


def fake_score(model, hardware, c, *, global_batch, seq, precision, optimizer, software=None):
    """Monotone toy model: time = work/GPU x recompute + bubble + comm; memory = states + activations."""
    dp, tp, pp, mb, v = (
        _get(c, n).astype(float) for n in ("dp", "tp", "pp", "micro_batch", "virtual_stages")
    )
    zero, rc, off, sp = (_get(c, n) for n in ("zero", "recompute", "offload", "sequence_parallel"))
    sched, place = _get(c, "schedule"), _get(c, "placement")
    m = global_batch / (dp * mb)
    work = _fake_compute(global_batch, seq, dp, tp, pp, mb, rc, sp)
    bubble = work * (pp - 1) / (m * v) * np.where(sched == 3, 0.3, 1.0)
    comm = 0.02 * (tp - 1) * (1 + 0.1 * sp) + 0.01 * (dp > 1) * (1 - 0.1 * zero) + 0.001 * place
    step = work + bubble + comm + 0.05 * (off == 1)
    states = 1.6e9 / (tp * pp) * np.choose(zero, [1.0, 0.6, 0.45, 1.0]) / np.where(zero == 3, dp, 1)
    states = states * np.where(off == 1, 0.25, 1.0)
    act = mb * seq * 2e4 / tp * np.choose(rc, [1.0, 0.6, 0.1]) / np.where(sp, 2.0, 1.0)
    act = act * np.where(off == 2, 0.5, 1.0) * np.where(sched == 0, m, np.minimum(pp, m))
    return FakeScores(step, states + act)


def _fake_compute(global_batch, seq, dp, tp, pp, mb, rc, sp):
    """Work per GPU, slower for small micro-batches and with recompute, faster with SP."""
    return (
        global_batch
        * seq
        * 1e-3
        / (dp * tp * pp)
        * (1 + 1 / mb)
        * np.choose(rc, [1.0, 1.05, 1.33])
        * np.where(sp, 0.95, 1.0)
    )


class FakeEstimate:
    def __init__(self, doc):
        self.doc = doc

    def to_document(self):
        return self.doc


def fake_estimate(model, hardware, cfg, *, gpus, options=None):
    from planner.placement import placement_index
    from planner.parallel import OFFLOAD, RECOMPUTE, SCHEDULES

    arrays = {
        "dp": [cfg.dp],
        "tp": [cfg.tp],
        "pp": [cfg.pp],
        "micro_batch": [cfg.micro_batch],
        "virtual_stages": [cfg.virtual_stages],
        "zero": [cfg.zero],
        "recompute": [RECOMPUTE.index(cfg.recompute)],
        "offload": [OFFLOAD.index(cfg.offload)],
        "sequence_parallel": [cfg.sequence_parallel],
        "schedule": [SCHEDULES.index(cfg.schedule)],
        "placement": [placement_index(cfg.placement)],
    }
    s = fake_score(
        model,
        hardware,
        {k: np.asarray(v) for k, v in arrays.items()},
        global_batch=cfg.global_batch,
        seq=cfg.seq,
        precision=cfg.precision,
        optimizer=cfg.optimizer,
    )
    step = float(s.step_time_s[0]) * (
        0.97 if cfg.stages else 1.0
    )  # uneven stages help a little here
    peak = int(s.peak_bytes_per_gpu[0])
    plan = cfg.to_dict()
    doc = {
        "schema_version": "1",
        "model": {"name": model.name, "params": 1000, "layers": model.layers},
        "hardware": {"name": hardware.name, "gpus": gpus, "nodes": math.ceil(gpus / 8)},
        "plan": plan,
        "prediction": {
            "step_time_s": step,
            "samples_per_s": cfg.global_batch / step,
            "tokens_per_s": cfg.global_batch * cfg.seq / step,
            "tflops_per_gpu": 1.0,
            "mfu": 0.1,
            "memory": {
                "peak_bytes_per_gpu": peak,
                "capacity_bytes": hardware.memory_bytes,
                "fits": peak <= hardware.memory_bytes,
                "params_bytes": peak // 2,
                "grads_bytes": 0,
                "optimizer_bytes": 0,
                "activations_bytes": peak - peak // 2,
                "other_bytes": 0,
            },
            "time_breakdown_s": {
                "compute": step,
                "tp_comm": 0.0,
                "dp_comm": 0.0,
                "pp_p2p": 0.0,
                "bubble": 0.0,
            },
        },
    }
    return FakeEstimate(doc)


def search(**kw):
    kw.setdefault("gpus", 16)
    kw.setdefault("global_batch", 32)
    return recommend(
        MODEL, kw.pop("hardware", hw()), score_fn=fake_score, estimate_fn=fake_estimate, **kw
    )


def test_default_global_batch_is_about_2m_tokens_and_a_multiple_of_the_world():
    assert default_global_batch(960, 2048) == 1920
    assert default_global_batch(16, 128) % 16 == 0
    assert default_global_batch(16, 128) * 128 >= 2**21


def test_pruning_by_memory_bound_keeps_the_same_answer():
    work = Workload(world_size=16, global_batch=32, seq=128, precision="bf16", optimizer="adamw")
    kw = dict(score_fn=fake_score)
    pruned = score_space(MODEL, hw(3e8), work, admission=Admission(time_bound=False), **kw)
    full = score_space(
        MODEL, hw(3e8), work, admission=Admission(prune=False, time_bound=False), **kw
    )
    assert pruned.stats.pruned_by_memory_bound > 0
    assert pruned.stats.space == full.stats.candidates_evaluated
    assert pruned.stats.feasible == full.stats.feasible
    best_p, best_f = rank(pruned, "throughput")[0], rank(full, "throughput")[0]
    assert pruned.step_time_s[best_p] == full.step_time_s[best_f]
    # every pruned candidate really does not fit
    fits_full = {
        tuple(int(full.arrays[k][i]) for k in sorted(full.arrays))
        for i in np.flatnonzero(full.fits)
    }
    fits_pruned = {
        tuple(int(pruned.arrays[k][i]) for k in sorted(pruned.arrays))
        for i in np.flatnonzero(pruned.fits)
    }
    assert fits_full == fits_pruned


def test_throughput_best_is_the_fastest_feasible_and_documents_load():
    rec = search()
    assert rec.stats.candidates_evaluated > 1000
    plan = plan_from_document(rec.plan_document())
    assert plan.config.world_size == 16
    steps = [rec.best["prediction"]["step_time_s"]] + [
        a["prediction"]["step_time_s"] for a in rec.alternatives
    ]
    assert steps == sorted(steps)
    assert len(rec.best["alternatives"]) == len(rec.alternatives) == 4
    doc = rec.to_document()
    assert set(doc) >= {
        "schema_version",
        "model",
        "hardware",
        "objective",
        "search",
        "best",
        "alternatives",
    }
    assert doc["search"]["candidates_evaluated"] == rec.stats.candidates_evaluated


def test_memory_objective_is_leanest_within_5_percent():
    fast, lean = search(), search(objective="memory")
    f, l = fast.best["prediction"], lean.best["prediction"]
    assert l["memory"]["peak_bytes_per_gpu"] <= f["memory"]["peak_bytes_per_gpu"]
    assert l["step_time_s"] <= f["step_time_s"] / 0.97 * 1.05 + 1e-12


def test_cost_objective_reports_dollars_and_time_to_train():
    rec = search(objective="cost", tokens=1e9)
    cost = rec.best["prediction"]["cost"]
    step = rec.best["prediction"]["step_time_s"]
    assert cost["usd_per_hour"] == 20.0  # 2 nodes x $10
    assert cost["usd_per_step"] == pytest.approx(20.0 * step / 3600)
    assert cost["usd_per_1b_tokens"] == pytest.approx(cost["usd_per_step"] / (32 * 128) * 1e9)
    train = rec.best["prediction"]["to_train"]
    assert train["steps"] == math.ceil(1e9 / (32 * 128))


def test_spot_without_a_spot_price_is_a_config_error():
    with pytest.raises(ConfigError, match="price-per-hour"):
        search(spot=True)


def test_the_users_price_per_node_hour_replaces_the_profiles():
    rec = search(objective="cost", spot=True, price_per_hour=4.5)
    cost = rec.best["prediction"]["cost"]
    assert cost["usd_per_hour"] == 9.0 and cost["spot"] is True  # 2 nodes x $4.50
    assert cost["usd_per_step"] == pytest.approx(9.0 * rec.best["prediction"]["step_time_s"] / 3600)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="price-per-hour"):
            search(price_per_hour=bad)


def test_nothing_fits_says_by_how_much_and_what_helps():
    with pytest.raises(NoFitError) as err:
        search(hardware=hw(1e6))
    text = str(err.value)
    assert "GiB" in text and "too much" in text and "more GPUs" in text
    assert err.value.exit_code == 3


def test_nothing_fits_suggests_untried_levers():
    with pytest.raises(NoFitError, match="allow ZeRO-3, full recompute"):
        search(
            hardware=hw(1e6), space=SearchSpace(zero=(0, 1), recompute=("none",), offload=("none",))
        )


def test_gpus_and_nodes():
    assert search(gpus=None, nodes=2).best["hardware"]["gpus"] == 16
    with pytest.raises(ConfigError, match="nodes"):
        search(gpus=12, nodes=2)
    with pytest.raises(ConfigError, match="gpus"):
        search(gpus=None)


def test_bad_objective_and_impossible_space():
    with pytest.raises(ConfigError, match="objective"):
        search(objective="speed")
    with pytest.raises(ConfigError, match="global_batch"):
        search(gpus=16, global_batch=3, space=SearchSpace(max_tp=1, max_cp=1))


@pytest.mark.parametrize("objective", ["throughput", "memory"])
def test_time_bound_keeps_the_leaders(objective):
    work = Workload(world_size=16, global_batch=32, seq=128, precision="bf16", optimizer="adamw")
    kw = dict(score_fn=fake_score_c)
    fast = score_space(MODEL, hw(3e8), work, admission=Admission(objective=objective, keep=6), **kw)
    every = score_space(MODEL, hw(3e8), work, admission=Admission(time_bound=False), **kw)
    assert fast.stats.pruned_by_time_bound > 0 and every.stats.pruned_by_time_bound == 0
    for s in (fast.stats, every.stats):  # every candidate is scored or proven out, once
        assert s.candidates_evaluated + s.pruned_by_memory_bound + s.pruned_by_time_bound == s.space
    assert fast.stats.space == every.stats.space
    assert fast.stats.candidates_evaluated < every.stats.candidates_evaluated / 2
    a, b = rank(fast, objective)[:6], rank(every, objective)[:6]
    assert fast.step_time_s[a].tolist() == every.step_time_s[b].tolist()
    assert fast.peak_bytes_per_gpu[a].tolist() == every.peak_bytes_per_gpu[b].tolist()


def fake_score_c(*args, **kw):
    """The fake scorer also reporting compute (work x recompute factor <= step)."""
    s = fake_score(*args, **kw)
    c = args[2]
    dp, tp, pp, mb = (_get(c, n).astype(float) for n in ("dp", "tp", "pp", "micro_batch"))
    s.compute = _fake_compute(
        kw["global_batch"],
        kw["seq"],
        dp,
        tp,
        pp,
        mb,
        _get(c, "recompute"),
        _get(c, "sequence_parallel"),
    )
    return s
