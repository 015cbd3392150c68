"""The table of option rules (planner.option_rules, issue 31): every pair of run options is either
costed (exit 0, each option's value in the plan it prints) or refused (one line, exit 2, no
traceback); the combinations the adversarial pass found accepted in silence are refused."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError
from planner.option_rules import RULES, check_options

runner = CliRunner()
ESTIMATE = [
    "estimate",
    "llama3-8b",
    "--hardware",
    "dgx-h100",
    "--gpus",
    "8",
    "--dp",
    "8",
    "--seq",
    "2048",
    "--global-batch",
    "64",
    "--json",
]

RUN_OPTIONS = {
    # name: (arguments, where the document records it, the value recorded)
    "precision": (["--precision", "fp8"], ("plan", "precision"), "fp8"),
    "fp8_scaling": (["--fp8-scaling", "delayed"], ("software", "fp8_scaling"), "delayed"),
    "recompute": (["--recompute", "selective"], ("plan", "recompute"), "selective"),
    "recompute_modules": (
        ["--recompute-modules", "mlp"],
        ("software", "recompute_modules"),
        ["mlp"],
    ),
    "framework": (["--framework", "torchtitan"], ("software", "framework"), "torchtitan"),
    "loss": (["--loss", "fused"], ("software", "loss"), "fused"),
    "master_weights": (
        ["--master-weights", "remainder"],
        ("software", "master_weights"),
        "remainder",
    ),
    "kernels": (["--kernels", "eager"], ("software", "kernels"), "eager"),
    "bf16_optimizer": (["--bf16-optimizer"], ("software", "bf16_optimizer"), True),
    "activation_fp8_input": (
        ["--activation-fp8-input"],
        ("software", "activation_fp8_input"),
        True,
    ),
    "moe_dispatcher": (["--moe-dispatcher", "deepep"], ("software", "moe_dispatcher"), "deepep"),
    "attention": (["--attention", "sdpa"], ("software", "attention"), "sdpa"),
    "grad_reduce_dtype": (["--grad-reduce-dtype", "bf16"], ("software", "grad_reduce_bytes"), 2.0),
    "dropout": (["--dropout"], ("software", "dropout"), True),
    "zero": (["--zero", "1"], ("plan", "zero"), 1),
}
"""Run options of estimate, each with a value other than its default, and where the plan
document shows it."""


def _costed_or_refused(names: tuple[str, ...]) -> str:
    args = [a for name in names for a in RUN_OPTIONS[name][0]]
    result = runner.invoke(app, ESTIMATE + args)
    if result.exit_code != 0:
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
            names,
            result.output,
        )
        assert "Traceback" not in result.output and result.stdout == ""
        return "refused"
    doc = json.loads(result.stdout)
    for name in names:
        _, (block, key), value = RUN_OPTIONS[name]
        assert doc[block].get(key) == value, (
            names,
            name,
            doc[block].get(key),
        )  # applied, not dropped
    return "costed"


@pytest.mark.timeout(900)
def test_every_pair_of_run_options_is_costed_or_refused():
    outcomes = {pair: _costed_or_refused(pair) for pair in itertools.combinations(RUN_OPTIONS, 2)}
    # the pairs the rules table refuses (a dense SwiGLU model, megatron by default), whatever else
    # they meet
    assert outcomes[("precision", "fp8_scaling")] == "costed"
    assert outcomes[("recompute", "recompute_modules")] == "costed"
    for other in RUN_OPTIONS:
        if other not in ("precision", "fp8_scaling"):
            assert (
                outcomes[tuple(sorted(("fp8_scaling", other), key=list(RUN_OPTIONS).index))]
                == "refused"
            )
        if other not in ("recompute", "recompute_modules"):
            pair = tuple(sorted(("recompute_modules", other), key=list(RUN_OPTIONS).index))
            assert outcomes[pair] == "refused"


@pytest.mark.parametrize(
    "values,needle",
    [
        (
            dict(precision="amp-bf16", fp8_scaling="rowwise"),
            "--fp8-scaling rowwise, --precision amp-bf16",
        ),
        (
            dict(precision=None, fp8_scaling="tensorwise"),
            "--fp8-scaling tensorwise, --precision (default)",
        ),
        (
            dict(recompute="none", recompute_modules="mlp"),
            "--recompute-modules mlp, --recompute none",
        ),
        (
            dict(recompute="full", recompute_modules=["mlp"]),
            "--recompute-modules mlp, --recompute full",
        ),
        (
            dict(framework=""),
            "--framework '': means nothing; allowed one of deepspeed, fsdp, megatron, torchtitan",
        ),
        (dict(framework="  "), "--framework '  '"),
        (
            dict(objective="cost", price=None, hardware="cpu-local"),
            "cpu-local's profile has no price_usd_per_hour",
        ),
    ],
)
def test_each_rule_is_one_line_naming_the_options_and_what_is_allowed(values, needle):
    with pytest.raises(ConfigError) as err:
        check_options(**values)
    assert needle in str(err.value) and "\n" not in str(err.value) and "allowed" in str(err.value)


@pytest.mark.parametrize(
    "values",
    [
        dict(precision="fp8", fp8_scaling="rowwise"),
        dict(recompute="selective", recompute_modules="mlp"),
        dict(fp8_scaling="rowwise"),  # recommend has no --precision check here: not given
        dict(recompute_modules="mlp"),  # recommend searches recompute: no --recompute
        dict(framework="torchtitan"),
        dict(objective="cost", price=32.8),
        dict(objective="cost", price=None, price_per_hour=2.0),
        dict(objective="throughput", price=None),
    ],
)
def test_what_the_rules_allow(values):
    check_options(**values)


def test_every_rule_names_its_options_as_the_command_line_spells_them():
    for rule in RULES:
        assert all(name.startswith("--") for name in rule.options)
