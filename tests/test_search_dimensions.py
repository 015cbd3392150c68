"""The search over the new dimensions (cp with its exchange, dp_shard, ep, precision): cost-model properties
it relies on, agreement with estimate(), the 405B long-context acceptance, the recommend flags that pin or
limit the new knobs, and what the plan and `explain` say about them."""

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from cost_models import moe as MO
from cost_models import params as P
from frameworks import load_framework
from hardware_profiles import load_profile
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate, even_stages, rank_blocks
from planner.software import software_for
from planner.parallel import CP_COMMS, ParallelConfig
from planner.run_options import RunOptions
from planner.score import CandidateArrays, score
from planner.search import Workload, config_of, ep_costed, rank, recommend, score_space
from planner.sources import resolve_model

runner = CliRunner()
H100 = load_profile("p5.48xlarge")
MODELS = {
    name: resolve_model(name, seq=seq)
    for name, seq in (
        ("llama3-8b", 65536),
        ("llama3-70b", 32768),
        ("mixtral-8x7b", 32768),
        ("gpt2-medium", 1024),
    )
}

configs = st.fixed_dictionaries(
    {
        "model": st.sampled_from(sorted(MODELS)),
        "framework": st.sampled_from(["megatron", "torchtitan", "deepspeed"]),
        "dp": st.sampled_from([1, 2, 4]),
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.sampled_from([1, 2, 4]),
        "cp": st.sampled_from([1, 2, 4]),
        "cp_comm": st.integers(0, 2),
        "mb": st.sampled_from([1, 2]),
        "schedule": st.sampled_from([0, 1, 3]),
        "zero": st.integers(0, 3),
        "recompute": st.integers(0, 2),
        "offload": st.integers(0, 2),
        "sp": st.booleans(),
        "placement": st.integers(0, 5),
        "dp_shard": st.sampled_from([0, 1, 2]),
    }
)


def _arrays(c, n=1, **over):
    c = dict(c, **over)
    one = lambda v: np.full(n, v)  # noqa: E731
    return CandidateArrays(
        dp=one(c["dp"]),
        tp=one(c["tp"]),
        pp=one(c["pp"]),
        micro_batch=one(c["mb"]),
        virtual_stages=one(1),
        zero=one(c["zero"]),
        recompute=one(c["recompute"]),
        offload=one(c["offload"]),
        sequence_parallel=one(c["sp"]),
        schedule=one(c["schedule"]),
        placement=one(c["placement"]),
        cp=one(c["cp"]),
        cp_comm=one(c["cp_comm"]),
        dp_shard=one(c["dp_shard"] if c["dp"] % max(c["dp_shard"], 1) == 0 else 0),
    )


def _score(c, precision="amp-bf16", **over):
    model = MODELS[c["model"]]
    return score(
        model,
        H100,
        _arrays(c, **over),
        global_batch=16,
        seq=model.seq,
        precision=precision,
        software=software_for(c["framework"]),
    )


@settings(max_examples=150, deadline=None)
@given(configs)
def test_more_context_parallelism_never_raises_activation_memory_per_gpu(c):
    """Doubling cp (everything else equal) splits each sequence over twice the ranks: the activations a GPU
    holds (Scores.saved_activations_bytes: what its in-flight micro-batches keep, whatever moment is the peak)
    shrink, by the scorer's own numbers. One pipeline stage, so that the GPU is the same one: with pp > 1 the
    scores report the rank with the highest peak, which can move from the last rank (the head's logits) to the
    first (most micro-batches in flight) as cp shrinks the logits, although every rank's activations shrink.
    (Scores.activations_bytes is the activation share of the peak moment: it can grow with cp when the peak
    moves, e.g. to where DDP's bucket copy, present once dp x cp > 1, meets the activations.)"""
    c = dict(c, pp=1)
    a, b = _score(c), _score(c, cp=2 * c["cp"])
    assert float(b.saved_activations_bytes[0]) < float(a.saved_activations_bytes[0])


@settings(max_examples=150, deadline=None)
@given(configs.filter(lambda c: c["framework"] != "deepspeed"))
def test_fp8_never_holds_more_weights_than_bf16_plus_its_documented_copies(c):
    """FP8 recipes keep fp32 master weights like bf16 mixed precision; the only extra weight memory is the
    framework's FP8 copies of the GEMM weights a rank stores (frameworks/*.json fp8_weight_cache_bytes per
    weight: Transformer Engine's row- and column-major FP8 copies under megatron, none under torchtitan's
    dynamic scaling; cost_models/memory.py). One pipeline stage, so that the GPU is the same one: with pp > 1 the
    scores report the rank with the highest peak, and FP8's copies can move it from the first rank to the last,
    which also holds the final norm's weights (hypothesis found llama3-8b at pp 4: 8192 bytes more)."""
    c = dict(c, pp=1)
    model, fw = MODELS[c["model"]], load_framework(c["framework"])
    fp8, bf16 = _score(c, precision="fp8"), _score(c, precision="amp-bf16")
    blocks = max(rank_blocks(even_stages(model.total_blocks, c["pp"]), c["pp"]))
    # without expert parallelism (ep = expert_tp = 1) a rank stores every routed expert whole
    routed = MO.routed_expert_weights(model) if model.moe is not None else 0.0
    stored = (P.block_stored_matmul_weights(model) - routed) / c["tp"] + routed
    copies = blocks * stored * fw.fp8_weight_cache_bytes
    assert float(fp8.params_bytes[0]) <= float(bf16.params_bytes[0]) + copies + 1.0
    if fw.fp8_weight_cache_bytes == 0:
        assert float(fp8.params_bytes[0]) == float(bf16.params_bytes[0])


LONG = dict(model="llama3-8b", hardware="p5.48xlarge", gpus=64, seq=32768, global_batch=32)


@pytest.fixture(scope="module")
def long_context():
    return recommend(
        LONG["model"],
        LONG["hardware"],
        gpus=LONG["gpus"],
        seq=LONG["seq"],
        global_batch=LONG["global_batch"],
        top=5,
    )


def _as_recommended(model, cfg, gpus=LONG["gpus"]):
    """estimate() of cfg as recommend chooses megatron's tp_comm_overlap, left unset, per plan: on
    where the plan runs it (tp > 1 with sequence parallelism) unless it then does not fit; and its
    moe_a2a_overlap: on where Megatron-Core's TransformerConfig asserts let it run (ep > 1, virtual
    stages when pp > 1, no full recompute, bf16 or fp16)."""
    a2a = model.moe is not None and cfg.ep > 1 and (cfg.pp == 1 or cfg.virtual_stages > 1)
    a2a = a2a and cfg.recompute != "full" and cfg.precision != "fp32"
    off = RunOptions(moe_a2a_overlap=True) if a2a else RunOptions()
    choices = [estimate(model, H100, cfg, gpus=gpus, options=off)]
    if cfg.tp > 1 and cfg.sequence_parallel:
        on = off.with_(tp_comm_overlap=True)
        choices.insert(0, estimate(model, H100, cfg, gpus=gpus, options=on))
    return next((e for e in choices if e.fits), choices[-1])


def test_top_plans_equal_estimates_numbers(long_context):
    """The scores the search ranked by are estimate()'s for the same configurations (one scorer, one fits
    owner), for the leaders of a space where context parallelism and hybrid sharding compete."""
    scored = long_context.scored
    model = resolve_model(LONG["model"], seq=LONG["seq"])
    order = rank(scored, "throughput")[:12]
    assert (scored.arrays["cp"][order] > 1).any()
    for i in order:
        cfg = config_of(
            scored.arrays,
            int(i),
            global_batch=LONG["global_batch"],
            seq=LONG["seq"],
            precision="amp-bf16",
            optimizer="adamw",
        )
        est = _as_recommended(model, cfg)
        # the search ranks by the closed form; estimate() reports it beside the timeline's step
        closed = float(est.scores.closed_form_step_s[0])
        assert closed == pytest.approx(float(scored.step_time_s[i]), rel=1e-9)
        assert est.needed_bytes == pytest.approx(float(scored.needed_bytes[i]), rel=1e-9)
        assert est.fits == bool(scored.fits[i])


def test_plan_search_block_says_what_was_tried_and_why_the_cp(long_context):
    best = long_context.best
    search = best["search"]
    assert search["values_tried"]["cp"] == [1, 2, 4, 8, 16, 32, 64]
    assert search["values_tried"]["cp_comm"] == list(CP_COMMS) and search["values_tried"]["ep"] == [
        1
    ]
    assert 0 in search["values_tried"]["dp_shard"] and len(search["values_tried"]["dp_shard"]) > 1
    versus = search["cp_versus"]
    assert (versus["plan"]["cp"] > 1) != (best["plan"]["cp"] > 1)
    plans = [best, *long_context.alternatives]
    fastest = plans[search["near_ties"]["fastest"]]["prediction"]["step_time_s"]
    assert versus["step_time_s"] >= fastest  # the other class's best is no faster than the fastest
    # its numbers are estimate()'s for its plan (even or uneven split, as the leaders are documented)
    cfg = ParallelConfig(
        **{
            k: (tuple(v) if k == "stages" else v)
            for k, v in versus["plan"].items()
            if k != "num_microbatches"
        }
    )
    est = _as_recommended(resolve_model(LONG["model"], seq=LONG["seq"]), cfg)
    assert est.step_time_s == pytest.approx(versus["step_time_s"], rel=1e-9)
    assert est.peak_bytes_per_gpu == versus["peak_bytes_per_gpu"]


def test_explain_compares_the_chosen_cp_with_the_other_class(long_context, tmp_path):
    from planner.explain import explain_document

    text = "\n".join(explain_document(long_context.best).versus_lines)
    assert "tried cp 1, 2, 4, 8, 16, 32, 64 (7 values)" in text
    cp = long_context.best["plan"]["cp"]
    other = "best plan at cp=1" if cp > 1 else "best plan with cp > 1"
    versus = long_context.best["search"]["cp_versus"]
    assert f"why cp={cp}" in text and other in text
    assert f"{versus['step_time_s']:.3f} s per step" in text
    assert f"{versus['peak_bytes_per_gpu'] / 2**30:.2f} GiB" in text


def test_explain_says_when_the_other_class_does_not_fit():
    from planner.explain import search_lines

    doc = {
        "plan": {"cp": 8, "cp_comm": "p2p"},
        "search": {
            "cp_versus": {
                "fits": False,
                "cp": 1,
                "needed_bytes": 3 * 2**30,
                "capacity_bytes": 2**30,
            }
        },
    }
    assert "no plan with cp = 1 fits: the leanest needs 3.00 GiB of 1.00 GiB" in "\n".join(
        search_lines(doc)
    )


@pytest.mark.speed
def test_405b_long_context_acceptance_picks_cp_within_the_budget(machine_slowdown):
    """Llama 3 405B, 131,072-token sequences, 16,384 H100s, global batch 128, FP8 (the issue's acceptance):
    the whole dp x tp x pp x cp space is searched and a plan with cp > 1 wins. Budget 2 s on 2 cores of the
    reference machine (times machine_slowdown on a slower one, conftest.py); measured ~0.1 s of CPU there
    (benchmarks/results/search_speed.json). The wall limit is generous for a loaded machine."""
    recommend("llama3-8b", "p5.48xlarge", gpus=8)  # imports and caches paid here
    t0 = time.process_time()
    rec = recommend(
        "llama3-405b", "p5.48xlarge", gpus=16384, seq=131072, global_batch=128, precision="fp8"
    )
    cpu_s = time.process_time() - t0
    s = rec.stats
    assert rec.best["plan"]["cp"] > 1 and rec.best["prediction"]["memory"]["fits"]
    assert rec.best["plan"]["precision"] == "fp8"
    assert (
        s.space
        == s.candidates_evaluated + s.pruned_by_memory_bound + s.pruned_by_time_bound
        > 300_000
    )
    assert s.values_tried["cp"] == [2**k for k in range(15)]  # every cp of 16,384 = 2^14
    assert cpu_s < 2.4 * machine_slowdown, (cpu_s, machine_slowdown)
    assert s.seconds < 20.0
    versus = rec.best["search"]["cp_versus"]
    assert (
        versus["plan"]["cp"] == 1
        and versus["step_time_s"] > 2 * rec.best["prediction"]["step_time_s"]
    )


def test_fp8_is_searched_only_where_the_device_has_it():
    with pytest.raises(ConfigError, match="precision"):
        recommend("gpt2", "p4d.24xlarge", gpus=8, precision="fp8")
    with pytest.raises(ConfigError, match="precision"):
        recommend("gpt2", "p5.48xlarge", gpus=8, precision="fp8", framework="deepspeed")
    rec = recommend("gpt2", "p5.48xlarge", gpus=8, precision="fp8", global_batch=64)
    assert all(d["plan"]["precision"] == "fp8" for d in (rec.best, *rec.alternatives))


def test_moe_models_enumerate_ep_and_score_it_once_costed():
    """Mixtral 8x7B: ep takes every divisor of dp x cp that divides the 8 experts; until the cost model prices
    expert parallelism (ep_costed) the ep > 1 candidates are counted and left unscored (they would score as
    ep = 1, and estimate refuses them), so the search still returns runnable ep = 1 plans."""
    rec = recommend("mixtral-8x7b", "p5.48xlarge", gpus=64, seq=8192, global_batch=128, top=3)
    assert rec.stats.values_tried["ep"] == [1, 2, 4, 8]
    if not ep_costed():
        assert (
            rec.stats.rejected["ep > 1 not costed by this build (scores as ep = 1; skeletons)"] > 0
        )
        assert set(np.unique(rec.scored.arrays["ep"])) == {1}
    else:
        assert (rec.scored.arrays["ep"] > 1).any()


REC = [
    "recommend",
    "llama3-8b",
    "--hardware",
    "p5.48xlarge",
    "--gpus",
    "64",
    "--seq",
    "16384",
    "--global-batch",
    "64",
    "--top",
    "2",
]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--cp", "3"], "cp=3"),  # not a divisor of 64
        (["--cp", "128"], "cp=128"),
        (["--cp", "16", "--max-cp", "8"], "--max-cp 8"),
        (["--cp", "4", "--framework", "fsdp"], "fsdp has no context parallelism"),
        (["--cp", "4", "--seq", "4100"], "divisible by 2*cp"),
        (["--cp-comm", "ring"], "p2p, all_gather, a2a"),
        (["--cp-comm", "p2p,p2p"], "each once"),
        (["--cp-comm", "a2a", "--framework", "torchtitan"], "torchtitan runs: p2p, all_gather"),
        (["--dp-shard", "3"], "dp-shard=3"),
        (["--ep", "2"], "dense"),
        (["--max-cp", "0"], "--max-cp"),
        (["--dp-shard", "-1"], "--dp-shard"),
    ],
)
def test_bad_pins_are_one_line_and_exit_2(args, needle):
    result = runner.invoke(app, REC + args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.output


def test_bad_ep_pins_on_a_moe_model():
    base = [
        "recommend",
        "mixtral-8x7b",
        "--hardware",
        "p5.48xlarge",
        "--gpus",
        "64",
        "--seq",
        "4096",
    ]
    result = runner.invoke(app, base + ["--ep", "3"])
    assert result.exit_code == 2 and "a divisor of the 8 experts: 1, 2, 4, 8" in result.stderr
    result = runner.invoke(app, base + ["--ep", "2", "--max-ep", "1"])
    assert result.exit_code == 2 and "--max-ep 1" in result.stderr
    if not ep_costed():
        result = runner.invoke(app, base + ["--ep", "2"])
        assert result.exit_code == 2 and "until expert parallelism is costed" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,rule,seen",
    [
        (["--cp", "4"], lambda f: f["cp"] == 4, {4}),
        (["--max-cp", "2"], lambda f: f["cp"] <= 2, {1, 2}),
        (
            ["--cp-comm", "all_gather"],
            lambda f: (f["cp"] == 1) | (f["cp_comm"] == "all_gather"),
            None,
        ),
        (
            ["--cp-comm", "p2p,a2a"],
            lambda f: (f["cp"] == 1) | f["cp_comm"].isin(["p2p", "a2a"]),
            None,
        ),
        (["--dp-shard", "0"], lambda f: f["dp_shard"] == 0, None),
        (["--dp-shard", "2"], lambda f: (f["dp_shard"] == 2) & (f["zero"] >= 1), None),
    ],
)
def test_pins_and_limits_shape_the_scored_candidates(tmp_path, args, rule, seen):
    """Every scored candidate, and the plan written, keeps to the pin or limit."""
    import pandas as pd

    out, csv = tmp_path / "plan.json", tmp_path / "all.csv"
    result = runner.invoke(app, REC + args + ["--out", str(out), "--csv", str(csv)])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(csv)
    assert len(frame) > 0 and rule(frame).all()
    assert seen is None or set(frame["cp"]) == seen
    assert rule(pd.DataFrame([json.loads(out.read_text())["plan"]])).all()
    assert not rule(unpinned_frame()).all()  # the pin did narrow the space


_UNPINNED = []


def unpinned_frame():
    if not _UNPINNED:
        _UNPINNED.append(
            recommend(
                "llama3-8b", "p5.48xlarge", gpus=64, seq=16384, global_batch=64, top=2
            ).to_pandas()
        )
    return _UNPINNED[0]


def test_recommend_table_shows_the_new_columns():
    result = runner.invoke(app, REC)
    assert result.exit_code == 0, result.output
    assert "tried cp 1, 2, 4, 8, 16, 32, 64" in result.stdout
    best = recommend("llama3-8b", "p5.48xlarge", gpus=64, seq=16384, global_batch=64, top=2).best[
        "plan"
    ]
    if best["cp"] > 1:
        assert f"{best['cp']} {best['cp_comm']}" in result.stdout


def test_no_candidate_of_the_other_cp_class_fits():
    """A million-token sequence on 64 H100s: without cp the last stage's logits alone (s x V / tp) overflow, so
    cp_versus reports the cp = 1 class's leanest miss."""
    rec = recommend("llama3-8b", "p5.48xlarge", gpus=64, seq=2**20, global_batch=8, top=1)
    versus = rec.best["search"]["cp_versus"]
    assert rec.best["plan"]["cp"] > 1
    assert (
        versus["fits"] is False
        and versus["cp"] == 1
        and versus["needed_bytes"] > versus["capacity_bytes"]
    )


def test_score_space_counts_each_candidate_once_with_the_new_dimensions():
    model = resolve_model("llama3-8b", seq=16384)
    s = score_space(
        model,
        H100,
        Workload(
            world_size=32, global_batch=32, seq=16384, precision="amp-bf16", optimizer="adamw"
        ),
        software=software_for("megatron"),
        space=__import__("planner.candidates", fromlist=["SearchSpace"])
        .SearchSpace()
        .for_framework(load_framework("megatron")),
    )
    st_ = s.stats
    assert (
        st_.space
        == st_.candidates_evaluated + st_.pruned_by_memory_bound + st_.pruned_by_time_bound
    )
    keys = np.stack([np.asarray(s.arrays[k]).astype(np.int64) for k in s.arrays], axis=1)
    assert len(np.unique(keys, axis=0)) == len(keys) == st_.candidates_evaluated


def test_memory_objective_compares_with_the_other_classes_fastest_plan():
    rec = recommend(
        "llama3-8b", "p5.48xlarge", gpus=64, seq=16384, global_batch=64, objective="memory", top=2
    )
    versus = rec.best["search"]["cp_versus"]
    assert versus["fits"] and (versus["plan"]["cp"] > 1) != (rec.best["plan"]["cp"] > 1)
    # the other class's fastest plan, as estimate() documents it (the step off the timeline)
    plan = {k: (tuple(v) if k == "stages" else v) for k, v in versus["plan"].items()}
    plan.pop("num_microbatches", None)
    again = estimate("llama3-8b", "p5.48xlarge", ParallelConfig(**plan), gpus=64)
    assert versus["step_time_s"] == pytest.approx(again.step_time_s, rel=1e-9)


def test_explain_search_compares_a_given_plan_with_the_other_cp_class(tmp_path):
    """`explain --search` on a plan from estimate (cp = 1): the comparison is with the best plan the search
    found with cp > 1, seen from the given plan."""
    path = tmp_path / "plan.json"
    result = runner.invoke(
        app,
        [
            "estimate",
            "llama3-8b",
            "--hardware",
            "p5.48xlarge",
            "--gpus",
            "64",
            "--dp",
            "8",
            "--tp",
            "8",
            "--seq",
            "16384",
            "--global-batch",
            "64",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    path.write_text(result.stdout)
    result = runner.invoke(app, ["explain", str(path), "--search"])
    assert result.exit_code == 0, result.output
    assert "cp=1 loses to the best plan with cp > 1" in result.stdout
    line = next(x for x in result.stdout.splitlines() if "best plan with cp > 1:" in x)
    assert " cp=" in line


# ------------------------------------------------------------------------------- why this ep (ep_versus)


@pytest.fixture(scope="module")
def mixtral():
    # the search's own order: the ep classes are compared with the fastest plan (ep_versus)
    return recommend(
        "mixtral-8x7b", "p5.48xlarge", gpus=64, seq=8192, global_batch=128, top=3, prefer="fastest"
    )


def _ep_class(plan, ep):
    return plan["ep"], ep["links"]


def test_ep_versus_holds_the_best_plan_of_each_expert_parallel_class(mixtral):
    """One entry per (ep degree, where the all-to-all runs), best first; the winner's class is the winner itself,
    and no class beats it; a class's entry is the fastest fitting plan of that class the search scored
    (by the closed form) as estimate() documents it off the timeline, or a leader of that class at
    least as fast."""
    from cost_models.moe import EP_LINKS, ep_links
    from planner.placement import group_locality

    best = mixtral.best
    classes = best["search"]["ep_versus"]["classes"]
    keys = [_ep_class(c["plan"], c["expert_parallel"]) for c in classes]
    assert len(set(keys)) == len(keys) >= 3 and {k[0] for k in keys} == {1, 2, 4, 8}
    assert keys[0] == _ep_class(best["plan"], best["prediction"]["expert_parallel"])
    assert (
        classes[0]["plan"] == best["plan"]
        and classes[0]["step_time_s"] == best["prediction"]["step_time_s"]
    )
    assert [c["step_time_s"] for c in classes] == sorted(c["step_time_s"] for c in classes)
    s = mixtral.scored
    a = s.arrays
    local = group_locality(
        a["placement"],
        a["dp"],
        a["pp"],
        a["tp"],
        H100.nvlink_domain_devices,
        cp=a["cp"],
        dp_shard=np.where(a["dp_shard"] > 0, a["dp_shard"], a["dp"]),
        ep=a["ep"],
    )["E"]
    links = np.asarray(EP_LINKS)[ep_links(a["ep"], local)]
    ok = s.fits & np.isfinite(s.step_time_s)
    model = resolve_model("mixtral-8x7b", seq=8192)
    for c in classes:
        mine = ok & (a["ep"] == c["plan"]["ep"]) & (links == c["expert_parallel"]["links"])
        i = int(np.flatnonzero(mine)[np.argmin(s.step_time_s[mine])])
        fastest = float(s.step_time_s[i])
        cfg = config_of(a, i, global_batch=128, seq=8192, precision="amp-bf16", optimizer="adamw")
        # the class's fastest as the search scored it (the closed form), documented by estimate()
        # off the step timeline, as every class's numbers are
        simulated = _as_recommended(model, cfg, gpus=64)
        assert float(simulated.scores.closed_form_step_s[0]) == pytest.approx(fastest, rel=1e-9)
        if c["as_scored"]:
            assert c["step_time_s"] == pytest.approx(simulated.step_time_s, rel=1e-9)
        else:  # a leader's document: the class's best leader, refined where that helped
            assert c["step_time_s"] <= simulated.step_time_s * (1 + 1e-9)
        assert c["exact"] == (fastest <= min(s.unscored_at_least_s))


def test_ep_versus_numbers_are_estimates_of_their_plans(mixtral):
    """The classes' numbers come from the one scorer: estimate() of the plan (even stages where as scored)
    gives the same step, memory and expert layout."""
    model = resolve_model("mixtral-8x7b", seq=8192)
    for c in mixtral.best["search"]["ep_versus"]["classes"]:
        cfg = ParallelConfig(
            **{
                k: (tuple(v) if k == "stages" else v)
                for k, v in c["plan"].items()
                if k != "num_microbatches"
            }
        )
        doc = _as_recommended(model, cfg, gpus=64).to_document()
        assert doc["prediction"]["step_time_s"] == pytest.approx(c["step_time_s"], rel=1e-9)
        assert doc["prediction"]["memory"]["peak_bytes_per_gpu"] == c["peak_bytes_per_gpu"]
        assert doc["prediction"]["time_breakdown_s"] == pytest.approx(
            c["time_breakdown_s"], rel=1e-9
        )
        ep = doc["prediction"]["expert_parallel"]
        assert ep.keys() == c["expert_parallel"].keys()
        for k, v in ep.items():
            assert (
                v == pytest.approx(c["expert_parallel"][k], rel=1e-9)
                if isinstance(v, float)
                else v == c["expert_parallel"][k]
            ), k


def test_explain_says_why_the_ep_degree_and_placement_won(mixtral):
    from planner.explain import explain_document

    best = mixtral.best
    text = "\n".join(explain_document(best).versus_lines)
    ep = best["prediction"]["expert_parallel"]
    assert (
        f"why ep={best['plan']['ep']} with all-to-all inside one NVLink domain ({ep['ep']} ranks)"
        in text
    )
    for c in best["search"]["ep_versus"]["classes"][1:]:
        assert f"ep={c['plan']['ep']}" in text and f"{c['step_time_s']:.3f} s" in text
    assert (
        "all-to-all over NVLink + EFAv2" in text
        and "no all-to-all (every GPU holds every expert)" in text
    )
    ep_section = text[
        text.index(f"why ep={best['plan']['ep']}") :
    ]  # the classes (other sections may name it too)
    assert ep_section.count("ep_comm") == len(best["search"]["ep_versus"]["classes"]) - 1
    assert "routed-expert parameters" in text


def test_explain_of_a_plan_from_another_ep_class_says_it_loses(mixtral):
    """explain on a plan whose ep class is not the winner's: the winner's class is listed, and the line says
    the plan loses to it."""
    from planner.explain import ep_lines

    other = next(c for c in mixtral.best["search"]["ep_versus"]["classes"][1:] if c["fits"])
    cfg = ParallelConfig(
        **{
            k: (tuple(v) if k == "stages" else v)
            for k, v in other["plan"].items()
            if k != "num_microbatches"
        }
    )
    doc = estimate(resolve_model("mixtral-8x7b", seq=8192), H100, cfg, gpus=64).to_document()
    doc["search"] = mixtral.best["search"]
    text = "\n".join(ep_lines(doc))
    assert f"ep={other['plan']['ep']} with" in text and "-- loses to" in text
    assert f"{mixtral.best['prediction']['step_time_s']:.3f} s" in text


def test_dense_plans_have_no_ep_versus():
    rec = recommend("gpt2", "p5.48xlarge", gpus=8, global_batch=64)
    assert "ep_versus" not in rec.best["search"]


@pytest.mark.speed
@pytest.mark.slow  # benchmarks/search_speed.py times the same searches
@pytest.mark.parametrize(
    "hardware,gpus",
    [
        ("p5.48xlarge", 2048),
        ("p6e-gb200.36xlarge", 2016),
    ],
)
def test_deepseek_v3_acceptance_picks_ep_and_says_why_within_the_budget(hardware, gpus):
    """DeepSeek-V3 on 2,048 H100s (p5: 8-GPU NVLink nodes over EFA) and on 2,016 GB200s (28 NVL72 racks), the
    issue's acceptance: a plan with ep > 1 wins, the whole space is searched, and explain compares it with the
    best plan of every other expert-parallel degree and placement. Budget 2.4 s on 2 cores of the reference machine
    (CPU time of the search; the CLI adds ~0.4 s of start-up), times the machine's slowdown on a slower one, the
    yardstick run in turn with the search (conftest.interleaved_cpu_s: a load that came and went between a
    yardstick measured before and the search failed it once at 2.9 s against 2.6); about 8.6 and 5.5 yardsticks
    (1.6 and 1.0 reference seconds; the per-block terms scored once per distinct row, planner.score.block_terms, took
    ~18% off); 1.5 x those 1.6 s since the search also tries hybrid shard groups across nodes (issue 32: the
    search may slow by 1.5 x, no more; about 1.2 x measured). Timed warm, as the yardstick is: the first search of a model also fills its per-model caches (~1 s
    more here). The wall limit is generous for a loaded machine."""
    from planner.explain import explain_document
    from tests.conftest import interleaved_cpu_s

    found = []
    cpu_s, machine_slowdown = interleaved_cpu_s(
        # the search's own order: the ep classes are compared with the fastest plan
        lambda: found.append(recommend("deepseek-v3", hardware, gpus=gpus, prefer="fastest"))
    )
    rec = found[-1]
    best, s = rec.best, rec.stats
    assert best["plan"]["ep"] > 1 and best["prediction"]["memory"]["fits"]
    assert (
        s.space
        == s.candidates_evaluated + s.pruned_by_memory_bound + s.pruned_by_time_bound
        > 5_000_000
    )
    assert s.values_tried["ep"][0] == 1 and s.values_tried["ep"][-1] >= 32
    classes = best["search"]["ep_versus"]["classes"]
    assert {c["plan"]["ep"] for c in classes} >= {1, 2, 4, 8, 16, 32}
    assert all(c["step_time_s"] >= best["prediction"]["step_time_s"] for c in classes if c["fits"])
    text = "\n".join(explain_document(best).versus_lines)
    # with moe_a2a_overlap free (on where Megatron-Core runs it) the exchange hides behind the
    # other micro-batch's compute, so an ep that crosses NVLink domains can win (p5: ep=16 over
    # 2 nodes, pp=16 interleaved): the header names the pick's own placement
    ep = best["prediction"]["expert_parallel"]
    assert ep["overlap"]
    where = "inside one NVLink domain" if ep["links"] == "NVLink" else "over NVLink + EFA"
    assert f"why ep={best['plan']['ep']} with all-to-all {where}" in text
    assert (
        "no all-to-all (every GPU holds every expert)" in text
        and "all-to-all over NVLink + EFA" in text
    )
    assert cpu_s < 2.4 * machine_slowdown, (cpu_s, machine_slowdown)
    assert s.seconds < 20.0
