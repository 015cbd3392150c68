"""`planner run --demo`: a built-in plan of the tiny GPT on 4 CPU ranks runs and verifies, with no
plan file."""

import json

from typer.testing import CliRunner

from executor_plans import run_planner
from planner.cli import app


def test_demo_runs_and_verifies_its_own_plan(tmp_path):
    result = run_planner(
        ["run", "--demo", "--verify", "--json", "--steps", "2", "--workdir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verify"]["passed"] is True
    (written,) = tmp_path.glob("demo-plan-*.json")  # a new file, never one of the user's
    plan = json.loads(written.read_text())  # an estimate document of the demo plan
    assert (
        plan["model"]["name"] == "planner.executor.tiny:gpt_tiny"
        and plan["hardware"]["name"] == "cpu-local"
    )
    assert (plan["plan"]["dp"], plan["plan"]["pp"]) == (2, 2) and plan["prediction"][
        "step_time_s"
    ] > 0


def test_run_needs_a_plan_or_demo_not_both(tmp_path):
    runner = CliRunner()
    for args in (["run"], ["run", str(tmp_path / "plan.json"), "--demo"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
        assert "a plan file, or --demo" in result.stderr


def test_the_tiny_moe_factories_profile_estimate_and_recommend():
    """mixtral_tiny and deepseek_tiny crashed `profile` / `estimate` on the meta device
    (torch.nonzero in the
    routing): a factory returning the planner's own MoE Transformer is costed from its spec."""
    from planner.estimate import estimate
    from planner.executor import tiny
    from planner.parallel import ParallelConfig
    from planner.profiler import profile_model
    from planner.search import recommend
    from planner.sources import resolve_model

    for name, spec in (
        ("mixtral_tiny", tiny.mixtral_tiny_spec()),
        ("deepseek_tiny", tiny.deepseek_tiny_spec()),
    ):
        arg = f"planner.executor.tiny:{name}"
        assert resolve_model(arg) == spec
        assert profile_model(arg).params == profile_model(spec).params
        cfg = ParallelConfig(dp=2, micro_batch=1, global_batch=8, seq=32, framework="fsdp")
        assert estimate(resolve_model(arg), "cpu-local", cfg, gpus=2).step_time_s > 0
        assert recommend(
            resolve_model(arg), "cpu-local", gpus=2, global_batch=8, framework="megatron"
        ).best


def test_tiny_models_default_to_a_few_sequences_per_rank_and_catalog_models_keep_2m_tokens():
    """The tiny models defaulted to a 65,536-sequence global batch (2M tokens of 32); a model under
    10M
    parameters now gets 4 sequences per rank. Catalog models (GPT-2's 124M is the smallest) keep ~2M
    tokens."""
    from planner.search import DEFAULT_BATCH_TOKENS, recommend
    from planner.sources import resolve_model

    rec = recommend(
        resolve_model("planner.executor.tiny:mixtral_tiny"), "cpu-local", gpus=4, framework="fsdp"
    )
    assert rec.best["plan"]["global_batch"] == 16
    gpt2 = recommend("gpt2", "p4d.24xlarge", gpus=8, top=1)
    assert gpt2.best["plan"]["global_batch"] * gpt2.best["plan"]["seq"] >= DEFAULT_BATCH_TOKENS
