"""A mixture-of-experts run's own choices on the command line: the token dispatcher, the exchange overlap and the
routed-token imbalance reach estimate, recommend, the plan file, explain's fresh search and the exports; each is
refused in one line (exit 2) where the stack or the model cannot take it. FP8 dispatch is costed, but no stack
runs it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from frameworks.rules import a2a_overlap_conflict
from planner.candidates import SearchSpace
from planner.cli import app
from planner.errors import ConfigError
from planner.estimate import estimate as estimate_plan
from planner.explain import _software_options
from planner.parallel import ParallelConfig
from planner.search import recommend
from planner.run_options import RunOptions

runner = CliRunner()
QWEN = [
    "estimate",
    "qwen3-235b-a22b",
    "--hardware",
    "p5.48xlarge",
    "--gpus",
    "256",
    "--dp",
    "64",
    "--pp",
    "4",
    "--ep",
    "32",
    "--global-batch",
    "512",
    "--seq",
    "4096",
]


def estimate(*args):
    res = runner.invoke(app, [*QWEN, *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def step(doc):
    return doc["prediction"]["step_time_s"]


def ep_time(doc):
    return doc["prediction"]["time_breakdown_s"]["ep_comm"]


def one_line_error(args, *needles):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_each_option_is_costed_and_recorded_in_the_plan():
    base = estimate()
    assert (
        base["software"]["moe_dispatcher"] == "alltoall"
        and base["software"]["moe_imbalance"] == 1.0
    )
    skewed = estimate("--moe-imbalance", "1.5")
    assert skewed["software"]["moe_imbalance"] == 1.5
    assert step(skewed) > step(base) and ep_time(skewed) > ep_time(
        base
    )  # the busiest rank waits for more tokens
    # 32-way expert parallelism spans 4 nodes: DeepEP sends each token once per node, not once per expert
    deepep = estimate("--moe-dispatcher", "deepep")
    assert deepep["software"]["moe_dispatcher"] == "deepep" and ep_time(deepep) < ep_time(base)
    overlapped = estimate("--moe-a2a-overlap", "--virtual-stages", "2")
    assert overlapped["software"]["moe_a2a_overlap"] is True
    assert ep_time(overlapped) < ep_time(estimate("--virtual-stages", "2"))


def test_fp8_dispatch_is_costed_but_no_stack_runs_it():
    cfg = ParallelConfig(
        dp=64, pp=4, ep=32, global_batch=512, seq=4096, precision="fp8", placement="PDET"
    )
    kw = dict(gpus=256)
    deepep, fp8_deepep = (
        RunOptions(moe_dispatcher="deepep"),
        RunOptions(moe_dispatcher="deepep", moe_fp8_dispatch=True),
    )
    with pytest.raises(
        ConfigError, match="framework megatron cannot run this plan: moe_fp8_dispatch"
    ):
        estimate_plan("qwen3-235b-a22b", "p5.48xlarge", cfg, options=fp8_deepep, **kw)
    # DeepSeek's own stack did (its published run is costed as megatron with check_framework off): 1 + 4/128
    # bytes a dispatched value, not 2
    fp8 = estimate_plan(
        "qwen3-235b-a22b", "p5.48xlarge", cfg, options=fp8_deepep, check_framework=False, **kw
    )
    bf16 = estimate_plan(
        "qwen3-235b-a22b", "p5.48xlarge", cfg, options=deepep, check_framework=False, **kw
    )
    assert fp8.time_breakdown_s()["ep_comm"] < bf16.time_breakdown_s()["ep_comm"]
    with pytest.raises(ConfigError, match="moe_fp8_dispatch needs precision fp8"):
        estimate_plan(
            "qwen3-235b-a22b",
            "p5.48xlarge",
            ParallelConfig(dp=64, pp=4, ep=32, global_batch=512, seq=4096, placement="PDET"),
            options=fp8_deepep,
            check_framework=False,
            **kw,
        )


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--moe-imbalance", "0.5"], ["moe_imbalance=0.5", "from 1 (balanced) to 64"]),
        (["--moe-imbalance", "nan"], ["moe_imbalance"]),
        (["--moe-dispatcher", "nccl"], ["moe_dispatcher='nccl'", "alltoall, deepep"]),
        (
            ["--framework", "deepspeed", "--moe-dispatcher", "deepep"],
            ["framework deepspeed cannot run this plan", "allowed: alltoall"],
        ),
        (
            ["--framework", "torchtitan", "--moe-a2a-overlap"],
            ["framework torchtitan cannot run this plan", "moe_a2a_overlap"],
        ),
        # Megatron-Core's own conditions for the overlap (frameworks.rules.a2a_overlap_conflict)
        (
            ["--moe-a2a-overlap"],
            ["framework megatron cannot run this plan", "virtual pipeline stages with pp=4"],
        ),
        (
            ["--moe-a2a-overlap", "--virtual-stages", "2", "--recompute", "full"],
            ["full recomputation"],
        ),
        (
            [
                "--moe-a2a-overlap",
                "--virtual-stages",
                "2",
                "--recompute",
                "selective",
                "--recompute-modules",
                "moe",
            ],
            ["'moe'"],
        ),
        (["--moe-a2a-overlap", "--virtual-stages", "2", "--precision", "fp32"], ["bf16 or fp16"]),
    ],
)
def test_bad_choices_are_one_line_and_exit_2(args, needles):
    one_line_error([*QWEN, *args], *needles)


def test_a_dense_model_refuses_expert_options():
    dense = ["estimate", "llama3-8b", "--hardware", "p5.48xlarge", "--gpus", "8", "--dp", "8"]
    for args in (["--moe-imbalance", "2"], ["--moe-dispatcher", "deepep"], ["--moe-a2a-overlap"]):
        one_line_error(
            [*dense, *args], "applies to mixture-of-experts models", "llama3-8b has no experts"
        )
    assert (
        runner.invoke(app, [*dense, "--no-moe-a2a-overlap"]).exit_code == 0
    )  # saying "off" harms nothing
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        recommend("llama3-8b", "p5.48xlarge", gpus=8, top=1, options=RunOptions(moe_imbalance=2.0))


@pytest.fixture(scope="module")
def overlapped_search():
    # without the overlap, this search's five best recompute every block (about 9.7 s a step)
    return recommend(
        "qwen3-235b-a22b",
        "p5.48xlarge",
        gpus=128,
        global_batch=512,
        seq=4096,
        top=5,
        options=RunOptions(moe_dispatcher="deepep", moe_a2a_overlap=True, moe_imbalance=1.2),
    )


def test_recommend_searches_only_what_the_overlap_runs_with(overlapped_search):
    docs = [overlapped_search.best, *overlapped_search.alternatives]
    assert len(docs) == 5
    for doc in docs:
        plan, sw = doc["plan"], doc["software"]
        assert (sw["moe_dispatcher"], sw["moe_a2a_overlap"], sw["moe_imbalance"]) == (
            "deepep",
            True,
            1.2,
        )
        # only plans Megatron-Core runs the overlap on (the one rule estimate and the export apply too)
        assert (
            a2a_overlap_conflict(
                pp=plan["pp"],
                virtual_stages=plan["virtual_stages"],
                recompute=plan["recompute"],
                precision=plan["precision"],
            )
            is None
        ), plan


def test_the_overlap_with_only_full_recomputation_to_try_is_one_clear_error():
    with pytest.raises(ConfigError, match="moe_a2a_overlap cannot run with full recomputation"):
        recommend(
            "qwen3-235b-a22b",
            "p5.48xlarge",
            gpus=128,
            global_batch=512,
            seq=4096,
            top=1,
            space=SearchSpace(recompute=("full",)),
            options=RunOptions(moe_a2a_overlap=True),
        )


def test_explain_searches_again_with_the_plans_moe_choices(overlapped_search):
    options = _software_options(overlapped_search.best)
    assert options.moe_dispatcher == "deepep" and options.moe_a2a_overlap is True
    assert options.moe_imbalance == 1.2


def test_the_megatron_export_runs_the_plans_dispatcher_or_refuses(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            estimate("--moe-dispatcher", "deepep", "--moe-a2a-overlap", "--virtual-stages", "2")
        )
    )
    res = runner.invoke(app, ["export", str(plan), "--format", "megatron"])
    assert res.exit_code == 0, res.output
    assert (
        "--moe-token-dispatcher-type\nflex" in res.stdout
        or "--moe-token-dispatcher-type flex" in res.stdout
    )
    assert (
        "--moe-flex-dispatcher-backend" in res.stdout
        and "--overlap-moe-expert-parallel-comm" in res.stdout
    )
    # a plan file pipelined without virtual stages (edited, or made with the framework check off): Megatron-Core
    # asserts, so the export refuses in one line
    doc = estimate("--moe-a2a-overlap", "--virtual-stages", "2")
    doc["plan"].update(virtual_stages=1, schedule="1f1b", stages=[])
    plan.write_text(json.dumps(doc))
    one_line_error(
        ["export", str(plan), "--format", "megatron"],
        "cannot export to megatron",
        "virtual pipeline stages with pp=4",
    )
    # DeepEP with nothing to exchange (ep x expert_tp = 1): Megatron-Core's flex dispatcher asserts, so alltoall
    res = runner.invoke(
        app,
        [
            "estimate",
            "qwen3-30b-a3b",
            "--hardware",
            "p5.48xlarge",
            "--gpus",
            "8",
            "--dp",
            "8",
            "--moe-dispatcher",
            "deepep",
            "--json",
        ],
    )
    plan.write_text(res.stdout)
    res = runner.invoke(app, ["export", str(plan), "--format", "megatron"])
    assert res.exit_code == 0, res.output
    assert "alltoall" in res.stdout and "--moe-flex-dispatcher-backend" not in res.stdout
    assert "moe_dispatcher=deepep left out" in res.output
    # another stack without DeepEP drops it by name when it re-estimates the plan
    plan.write_text(json.dumps(estimate("--moe-dispatcher", "deepep", "--recompute", "full")))
    res = runner.invoke(app, ["export", str(plan), "--format", "deepspeed"])
    assert res.exit_code == 0, res.output
    assert "moe_dispatcher dropped (framework deepspeed cannot run this plan" in res.output
