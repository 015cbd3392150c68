"""The CLI shell: user errors become one line and an exit code, never a traceback."""

from typer.testing import CliRunner

from planner.cli import app
from planner.errors import ConfigError
from planner.parallel import ParallelConfig

import pytest

runner = CliRunner()


def planner_main(argv, monkeypatch, capsys) -> tuple[int, str, str]:
    """`planner ARGV` through planner.cli.main, the function `python -m planner` calls, in this
    process: (exit code, stdout, stderr). Each subprocess launch costs a Python start and the CLI's
    imports (~1 s of CPU); test_estimate_refuses_bf16_on_v100_in_one_line keeps the real process."""
    import sys

    from planner.cli import main

    monkeypatch.setattr(sys, "argv", ["planner", *argv])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_every_contract_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in (
        "profile",
        "hardware",
        "estimate",
        "recommend",
        "explain",
        "export",
        "run",
        "report",
    ):
        assert command in result.output


def test_root_help_lists_each_command_by_its_own_help_and_imports_none():
    """The root --help lists COMMANDS' summaries without importing the command modules; each
    summary is the first paragraph of the command's own help, so the two cannot drift."""
    import subprocess
    import sys

    from planner.cli import COMMANDS, load_command

    for name, (_, summary) in COMMANDS.items():
        own = load_command(name).help.split("\n\n")[0]
        assert " ".join(own.split()) == summary, name
    probe = (
        "import sys; from typer.testing import CliRunner; from planner.cli import app; "
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m.startswith('planner.commands.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_degrees_that_do_not_multiply_name_the_equation_and_the_fix():
    cfg = ParallelConfig(dp=3, tp=2, pp=4, global_batch=6)
    with pytest.raises(
        ConfigError, match=r"tp\(2\)\*pp\(4\)\*dp\(3\)=24 != world_size\(32\); set dp=4"
    ):
        cfg.check_world_size(32)


@pytest.mark.parametrize(
    "field,value",
    [
        ("schedule", "pipedream"),
        ("zero", 4),
        ("placement", "DPX"),
        ("placement", "DPTT"),
        ("recompute", "some"),
        ("precision", "fp4"),
        ("framework", "jax"),
        ("cp", 0),
        ("cp_comm", "ring"),
        ("dp_shard", 3),
    ],
)
def test_parallel_config_rejects_each_bad_field_by_name(field, value):
    with pytest.raises(ConfigError) as err:
        ParallelConfig(**{field: value})
    assert err.value.field == field and repr(value) in str(err.value)


def test_placement_needs_c_and_e_when_cp_and_ep_are_used():
    ParallelConfig(dp=2, cp=2, ep=4, placement="DPECT", global_batch=2)
    ParallelConfig(placement="DPCT")  # C allowed (degree 1) when cp = 1
    with pytest.raises(ConfigError, match="plus C"):
        ParallelConfig(cp=2, placement="DPT")
    with pytest.raises(ConfigError, match="must divide tp\\*cp\\*dp = 4"):
        ParallelConfig(dp=2, cp=2, ep=3, placement="DPCET", global_batch=2)
    ParallelConfig(
        dp=2, tp=2, ep=4, placement="DPET", global_batch=2
    )  # MoE parallel folding: ep > dp x cp


def test_tp_must_divide_heads():
    with pytest.raises(ConfigError, match=r"tp=3 .*divisor of heads\(32\)"):
        ParallelConfig(tp=3).check_model(heads=32, kv_heads=32, blocks=16)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["recommend", "gpt2", "--hardware", "p4d.24xlarge", "--gpus", "0"], "--gpus"),
        (["profile", "gpt2", "--micro-batch", "abc"], "--micro-batch"),
        (["recommend"], "Missing argument"),
        (["estimate", "gpt2", "--no-such-option"], "--no-such-option"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_usage_errors_are_one_line_naming_the_option_and_exit_2(argv, needle, monkeypatch, capsys):
    code, _, err = planner_main(argv, monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert "Traceback" not in err and "╭" not in err


def test_tp_must_divide_kv_heads_too():
    with pytest.raises(
        ConfigError, match=r"tp=16 .*divisor of heads\(64\) and kv_heads\(8\): 1, 2, 4, 8$"
    ):
        ParallelConfig(tp=16).check_model(heads=64, kv_heads=8, blocks=80)


def test_looped_schedules_need_whole_rounds_of_micro_batches():
    # torch.distributed.pipelining: m % max(1, m // pp) == 0 (m=128, pp=20: rounds of 6 -> 126 or 132)
    with pytest.raises(
        ConfigError, match=r"m // pp\)=6 .*nearest allowed m: 126, 132 \(global_batch 1512, 1584\)"
    ):
        ParallelConfig(dp=12, tp=4, pp=20, global_batch=1536, schedule="zero-bubble")
    ParallelConfig(dp=12, tp=4, pp=20, global_batch=1536, schedule="1f1b")  # 1F1B takes any m
    ParallelConfig(dp=12, tp=4, pp=20, global_batch=1584, schedule="zero-bubble")  # m=132
    ParallelConfig(
        dp=1, pp=8, global_batch=6, schedule="interleaved-1f1b", virtual_stages=2
    )  # m < pp: one round


def test_precision_follows_the_devices_math():
    from hardware_profiles import load_profile
    from cost_models.compute import resolve_precision

    v100, a100 = load_profile("p3dn.24xlarge"), load_profile("p4d.24xlarge")
    assert resolve_precision(a100, None) == "amp-bf16"
    assert resolve_precision(v100, None) == "amp-fp16"  # Volta has fp16 tensor cores, no bf16
    assert resolve_precision(v100, "fp32") == "fp32"
    with pytest.raises(
        ConfigError,
        match=r"precision='amp-bf16' needs bf16 math.*V100.*allowed here: fp32, amp-fp16",
    ):
        resolve_precision(v100, "amp-bf16")


def test_estimate_refuses_bf16_on_v100_in_one_line():
    import subprocess
    import sys

    argv = [
        "estimate",
        "gpt2",
        "--hardware",
        "p3dn.24xlarge",
        "--gpus",
        "8",
        "--dp",
        "8",
        "--global-batch",
        "64",
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "planner", *argv, "--precision", "bf16"],
        capture_output=True,
        text=True,
    )
    assert (
        bad.returncode == 2
        and len(bad.stderr.strip().splitlines()) == 1
        and "--precision" not in bad.stdout
    )
    good = subprocess.run([sys.executable, "-m", "planner", *argv], capture_output=True, text=True)
    assert good.returncode == 0 and "amp-fp16" in good.stdout + good.stderr


def test_a_global_batch_coprime_with_the_gpus_is_pointed_out():
    from planner.commands.recommend import batch_note

    note = batch_note(1537, 8, 8)
    assert note and "factor 1" in note and "1536 or 1544" in note
    assert batch_note(1536, 8, 8) is None and batch_note(1536, 960, 8) is None  # dp up to 8 and 192
    assert "factor 4" in batch_note(1540, 8, 8)


def test_default_precision_is_fp32_where_16_bit_math_is_slower():
    from hardware_profiles import load_profile
    from cost_models.compute import resolve_precision

    cpu = load_profile("cpu-local")  # bf16 0.0011 vs fp32 0.016 TFLOP/s measured
    assert (
        cpu.peak_tflops["bf16"] < cpu.peak_tflops["fp32"] and resolve_precision(cpu, None) == "fp32"
    )


@pytest.mark.parametrize(
    "argv_of",
    [
        lambda f: ["profile", f],  # a config.json
        lambda f: ["export", f, "--format", "megatron"],  # a plan file
        lambda f: [
            "estimate",
            "gpt2",
            "--hardware",
            f,
            "--gpus",
            "8",
            "--dp",
            "8",
        ],  # a hardware profile
        lambda f: ["report", f, "--out", f + ".out"],  # plan or config.json
    ],
)
def test_a_file_that_is_not_utf8_is_named_in_one_line(argv_of, tmp_path, monkeypatch, capsys):
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = planner_main(argv_of(str(path)), monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert str(path) in lines[0] and ("UTF-8" in lines[0]) and "Traceback" not in err
