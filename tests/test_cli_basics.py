"""The CLI shell: user errors become one line and an exit code, never a traceback."""
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError
from planner.parallel import ParallelConfig

import pytest

runner = CliRunner()


def test_help_lists_every_contract_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("profile", "hardware", "estimate", "recommend", "explain", "export", "run", "report"):
        assert command in result.output


def test_degrees_that_do_not_multiply_name_the_equation_and_the_fix():
    cfg = ParallelConfig(dp=3, tp=2, pp=4, global_batch=6)
    with pytest.raises(ConfigError, match=r"tp\(2\)\*pp\(4\)\*dp\(3\)=24 != world_size\(32\); set dp=4"):
        cfg.check_world_size(32)


@pytest.mark.parametrize("field,value", [("schedule", "pipedream"), ("zero", 4), ("placement", "DPX"),
                                         ("recompute", "some"), ("precision", "fp8")])
def test_parallel_config_rejects_each_bad_field_by_name(field, value):
    with pytest.raises(ConfigError) as err:
        ParallelConfig(**{field: value})
    assert err.value.field == field and repr(value) in str(err.value)


def test_tp_must_divide_heads():
    with pytest.raises(ConfigError, match=r"tp=3 .*divisor of heads\(32\)"):
        ParallelConfig(tp=3).check_model(heads=32, kv_heads=32, blocks=16)
