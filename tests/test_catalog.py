"""Catalog shapes and parameter counts against published sizes (tests/golden/param_counts.json)."""

import json
from pathlib import Path

import pytest

from cost_models import params as P
from planner import catalog
from planner.errors import ConfigError
from planner.sources import resolve_model

GOLDEN = json.loads((Path(__file__).parent / "golden" / "param_counts.json").read_text())
CONTRACT_NAMES = (
    ["gpt3-175b"]
    + [
        f"megatron-{s}"
        for s in ("1.7b", "3.6b", "7.5b", "18b", "39b", "76b", "145b", "310b", "530b", "1t")
    ]
    + [
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "gpt2",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
        "bert-large",
        "t5-3b",
    ]
)


def test_param_counts_match_published_sizes():
    """Every row of tests/golden/param_counts.json, each failing row named in one message."""
    wrong = [
        (row["model"], P.total_params(catalog.get(row["model"])), row["expected"])
        for row in GOLDEN["rows"]
        if P.total_params(catalog.get(row["model"]))
        != pytest.approx(row["expected"], rel=row["tolerance"])
    ]
    assert GOLDEN["rows"] and wrong == [], "(model, counted, published): " + repr(wrong)


def test_param_counts_equal_released_checkpoints():
    wrong = [
        (row["model"], P.total_params(catalog.get(row["model"])), row["expected"])
        for row in GOLDEN["exact"]
        if P.total_params(catalog.get(row["model"])) != row["expected"]
    ]
    assert GOLDEN["exact"] and wrong == [], "(model, counted, released): " + repr(wrong)


def test_every_contract_name_is_in_the_catalog():
    assert set(CONTRACT_NAMES) <= set(catalog.names())
    assert {n for n in catalog.names() if n.startswith("gpt3-")} == {
        "gpt3-small",
        "gpt3-medium",
        "gpt3-large",
        "gpt3-xl",
        "gpt3-2.7b",
        "gpt3-6.7b",
        "gpt3-13b",
        "gpt3-175b",
    }


def test_gpt3_175b_shape_is_the_contracts():
    spec = catalog.get("gpt3-175b")
    assert (spec.layers, spec.hidden, spec.heads, spec.seq, spec.vocab) == (
        96,
        12288,
        96,
        2048,
        50257,
    )


def test_megatron_entries_follow_narayanan_eq2():
    """Narayanan et al. 2021 eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)); we add the final LayerNorm (2h)."""
    names = [n for n in catalog.names() if n.startswith("megatron-")]
    wrong = []
    for name in names:
        s = catalog.get(name)
        l, h = s.layers, s.hidden
        paper = 12 * l * h * h * (1 + 13 / (12 * h) + (s.vocab + s.seq) / (12 * l * h))
        if P.total_params(s) != pytest.approx(paper + 2 * h, rel=1e-12) or (s.vocab, s.seq) != (
            51200,
            2048,
        ):
            wrong.append((name, P.total_params(s), paper + 2 * h, s.vocab, s.seq))
    assert len(names) >= 10 and wrong == [], "(name, counted, eq. 2, vocab, seq): " + repr(wrong)


def test_matmul_params_give_the_6n_rule_of_narayanan_eq3():
    s = catalog.get("gpt3-175b")
    assert P.matmul_params(s) == 12 * s.layers * s.hidden**2 + s.vocab * s.hidden


def test_unknown_name_is_a_config_error_naming_model():
    with pytest.raises(ConfigError) as err:
        resolve_model("gpt5-1t")
    assert (
        err.value.field == "MODEL"
        and "gpt3-175b" in str(err.value)
        and "package.module:factory" in str(err.value)
    )


def test_seq_override_and_learned_position_bound():
    assert resolve_model("llama3-8b", seq=4096).seq == 4096
    assert resolve_model("gpt3-175b", seq=1024).seq == 1024
    assert P.total_params(resolve_model("gpt3-175b", seq=1024)) == P.total_params(
        catalog.get("gpt3-175b")
    )
    with pytest.raises(ConfigError, match="seq=4096"):
        resolve_model("gpt2", seq=4096)


def test_models_command_lists_every_catalog_model_with_its_parameter_count():
    import json

    from typer.testing import CliRunner

    from cost_models.params import total_params
    from planner.catalog import get, names
    from planner.cli import app

    result = CliRunner().invoke(app, ["models", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)["models"]
    assert [r["name"] for r in rows] == names()
    assert all(r["params"] == total_params(get(r["name"])) for r in rows)
    table = CliRunner().invoke(app, ["models"]).stdout
    assert "deepseek-v3" in table and "671.0B" in table and "256 (top-8)" in table
