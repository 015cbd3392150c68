"""`planner report`: figures and every checklist rule in both renderings, numbers equal to
recommend/estimate for the same plan, the BatchNorm rule, and the error paths."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hardware_profiles import load_profile
from planner.cli import app
from planner.estimate import estimate
from planner.parallel import ParallelConfig
from planner.report import checklist
from planner.report.backend import batchnorm_count, config_from_document
from planner.run_options import RunOptions
from planner.search import recommend
from planner.sources import resolve_model

runner = CliRunner()
TESTS = Path(__file__).parent
SMALL = [
    "gpt2",
    "--hardware",
    "p4d.24xlarge",
    "--gpus",
    "16",
    "--global-batch",
    "64",
    "--scaling-nodes",
    "1,2",
]


def _report(tmp_path, *args, name="r"):
    out = tmp_path / name
    result = runner.invoke(app, ["report", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    return _report(tmp_path_factory.mktemp("report"), *SMALL)


def test_html_and_markdown_hold_every_figure_and_every_rule(small_report):
    html = (small_report / "report.html").read_text()
    md = (small_report / "report.md").read_text()
    n_fig_html = html.count('class="report-figure"')
    assert n_fig_html >= 4
    assert html.count('src="data:image/png;base64,') == n_fig_html  # embedded: opens offline
    images = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)
    assert len(images) == n_fig_html
    assert all(
        (small_report / p).stat().st_size > 1000 for p in images
    )  # referenced relatively, present
    rule_ids = [rule.__name__ for rule in checklist.RULES]
    rows = re.findall(
        r'<tr class="rule" data-rule="([^"]+)" data-status="(pass|advice|warn)"', html
    )
    assert len(rows) == len(rule_ids) == 14 and len({r for r, _ in rows}) == 14
    md_rows = re.findall(r"^\| (PASS|ADVICE|WARN) \| ", md, flags=re.M)
    assert len(md_rows) == len(rule_ids)
    # every rule names the source of its practice in both renderings
    assert md.count(" Source: ") == html.count(" Source: ") == len(rule_ids)
    for heading in (
        "Scenario",
        "Recommended plan and runners-up",
        "Time and memory breakdown",
        "Pipeline timeline",
        "Pareto front",
        "Scaling across node counts",
        "Log-n all-reduce model vs pipelining",
        "Best-practice checklist",
    ):
        assert heading in html and heading in md


def test_report_numbers_equal_recommend_and_estimate_for_the_same_plan(small_report):
    data = json.loads((small_report / "report.json").read_text())
    model, hw = resolve_model("gpt2"), load_profile("p4d.24xlarge")
    rec = recommend(model, hw, gpus=16, global_batch=64, top=4, tokens=300e9)
    assert data["best"]["plan"] == rec.best["plan"]
    assert data["best"]["prediction"]["step_time_s"] == rec.best["prediction"]["step_time_s"]
    assert [a["plan"] for a in data["alternatives"]] == [a["plan"] for a in rec.alternatives]
    direct = estimate(model, hw, config_from_document(data["best"]), gpus=16).to_document()
    for key in (
        "step_time_s",
        "tokens_per_s",
        "tflops_per_gpu",
        "mfu",
        "memory",
        "time_breakdown_s",
    ):
        assert data["best"]["prediction"][key] == pytest.approx(
            direct["prediction"][key], rel=1e-12
        )
    md = (small_report / "report.md").read_text()
    pred = direct["prediction"]
    assert f"{pred['tokens_per_s']:,.0f} tokens/s" in md
    assert f"{pred['step_time_s']:.4g} s" in md
    assert (
        f"peak {pred['memory']['peak_bytes_per_gpu'] / 2**30:.2f} GiB" in md
    )  # GiB, as the CLI prints
    # the scaling row at the scenario's node count is the same plan
    row = next(r for r in data["scaling"] if r["gpus"] == 16)
    assert row["tokens_per_s"] == pytest.approx(pred["tokens_per_s"], rel=1e-12)


def test_a_plan_file_reports_its_own_configuration(tmp_path, small_report):
    best = json.loads((small_report / "report.json").read_text())["best"]
    doc = dict(best)
    plan = dict(doc["plan"])
    plan.update(zero=0, offload="none")  # a different, valid plan than the winner
    doc["plan"] = plan
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    out = _report(tmp_path, str(path), "--scaling-nodes", "2")
    data = json.loads((out / "report.json").read_text())
    assert data["best"]["plan"]["zero"] == 0 and data["best"]["plan"]["offload"] == "none"
    direct = estimate(
        resolve_model("gpt2"), load_profile("p4d.24xlarge"), config_from_document(doc), gpus=16
    )
    assert data["best"]["prediction"]["step_time_s"] == pytest.approx(direct.step_time_s, rel=1e-12)
    assert "plan file" in (out / "report.md").read_text()
    # the scaling row at the plan's own node count is that plan, and says so
    own = next(r for r in data["scaling"] if r["gpus"] == 16)
    assert (
        own["plan"].endswith("(the given plan)")
        and "the given plan at its own node count" in (out / "report.md").read_text()
    )
    # a plan whose model name does not resolve: exit 2 naming MODEL, or re-evaluate it with --model
    doc["model"] = dict(doc["model"], name="renamed-model")
    path.write_text(json.dumps(doc))
    bad = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "MODEL" in bad.output
    again = _report(tmp_path, str(path), "--model", "gpt2", "--scaling-nodes", "2", name="again")
    assert json.loads((again / "report.json").read_text())["best"]["prediction"][
        "step_time_s"
    ] == pytest.approx(direct.step_time_s, rel=1e-12)


def test_a_plan_file_is_reported_with_its_own_run_options(tmp_path):
    """The plan file's software block is part of the plan: a plan that runs Megatron's TP
    communication overlap (off by default) is reported at the step its file predicts."""
    cfg = ParallelConfig(dp=2, tp=8, sequence_parallel=True, global_batch=16, zero=1)
    model, hw = resolve_model("gpt3-2.7b"), load_profile("p4d.24xlarge")
    overlap = estimate(model, hw, cfg, gpus=16, options=RunOptions(tp_comm_overlap=True))
    assert overlap.step_time_s < estimate(model, hw, cfg, gpus=16).step_time_s
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(overlap.to_document()))
    out = _report(tmp_path, str(path), "--scaling-nodes", "2")
    data = json.loads((out / "report.json").read_text())
    best = data["best"]
    assert best["software"]["tp_comm_overlap"] is True
    assert best["prediction"]["step_time_s"] == pytest.approx(overlap.step_time_s, rel=1e-12)
    # the alternatives it is ranked against run as the plan does, not at the stack's defaults
    assert data["alternatives"] and all(
        a["software"]["tp_comm_overlap"] is True
        for a in data["alternatives"]
        if a["plan"]["tp"] > 1 and a["plan"]["sequence_parallel"]
    )


def test_a_plan_files_alternatives_pay_its_train_metrics(tmp_path):
    """A Composer plan's runners-up are searched with its two train metrics, as it was."""
    cfg = ParallelConfig(dp=8, global_batch=64, seq=1024, zero=3, framework="fsdp")
    model, hw = resolve_model("gpt2"), load_profile("p4d.24xlarge")
    plan = estimate(model, hw, cfg, gpus=8, options=RunOptions(train_metrics=2))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_document()))
    data = json.loads(
        (_report(tmp_path, str(path), "--scaling-nodes", "1") / "report.json").read_text()
    )
    assert data["alternatives"]
    assert all(a["software"]["train_metrics"] == 2 for a in data["alternatives"])


@pytest.mark.parametrize(
    "factory,status", [("tiny_transformer_with_batchnorm", "warn"), ("tiny_transformer", "pass")]
)
def test_batchnorm_rule_warns_only_for_a_module_with_batchnorm(
    tmp_path, monkeypatch, factory, status
):
    monkeypatch.syspath_prepend(str(TESTS))
    out = _report(
        tmp_path,
        f"fixtures.bn_factories:{factory}",
        "--hardware",
        "p4d.24xlarge",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--scaling-nodes",
        "1",
    )
    html = (out / "report.html").read_text()
    assert f'data-rule="batchnorm" data-status="{status}"' in html
    md = (out / "report.md").read_text()
    line = next(l for l in md.splitlines() if "Synchronise BatchNorm" in l)
    assert line.startswith(f"| {status.upper()} |")
    assert ("1 BatchNorm modules" in line) == (status == "warn")


def test_batchnorm_count_scans_the_factory_on_meta(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    assert batchnorm_count("fixtures.bn_factories:small_cnn_with_batchnorm") == 2
    assert (
        batchnorm_count("fixtures.bn_factories:small_mlp_with_batchnorm1d") == 2
    )  # SyncBatchNorm counts
    assert batchnorm_count("fixtures.bn_factories:small_cnn_with_groupnorm") == 0
    assert batchnorm_count("gpt2") == 0


@pytest.mark.parametrize(
    "args,needle",
    [
        (["gpt2", "--gpus", "8"], "--hardware"),
        (["gpt2", "--hardware", "p4d.24xlarge"], "--gpus"),
        (
            ["gpt2", "--hardware", "p4d.24xlarge", "--gpus", "8", "--scaling-nodes", "1,x"],
            "--scaling-nodes",
        ),
        (["no-such-model", "--hardware", "p4d.24xlarge", "--gpus", "8"], "MODEL"),
        (["gpt2", "--hardware", "no-such-box", "--gpus", "8"], "hardware"),
        (
            ["gpt2", "--hardware", "p4d.24xlarge", "--gpus", "8", "--nodes", "2"],
            "nodes(2) x devices_per_node(8) = 16",
        ),
        (
            ["gpt2", "--hardware", "p4d.24xlarge", "--gpus", "8", "--objective", "fastest"],
            "objective",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    result = runner.invoke(app, ["report", *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_a_module_the_cost_model_cannot_score_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    result = runner.invoke(
        app,
        [
            "report",
            "fixtures.bn_factories:small_cnn_with_batchnorm",
            "--hardware",
            "p4d.24xlarge",
            "--gpus",
            "8",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    # the profiler needs token inputs (or example_inputs); either way one line, exit 2
    assert result.exit_code == 2 and "MODEL" in result.output and "Traceback" not in result.output


EXAMPLES = ("gpt3-175b-120xp4d", "gpt3-6.7b-16xp4d", "llama3-8b-1xp5")


@pytest.mark.parametrize("name", EXAMPLES)
def test_committed_examples_have_figures_every_rule_and_a_screenshot(name):
    folder = TESTS.parent / "reports" / name
    html = (folder / "report.html").read_text()
    md = (folder / "report.md").read_text()
    assert html.count('class="report-figure"') >= 4
    assert len(re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)) >= 4
    assert len(
        re.findall(r'<tr class="rule" data-rule="[^"]+" data-status="(?:pass|advice|warn)"', html)
    ) == len(checklist.RULES)
    assert len(re.findall(r"^\| (?:PASS|ADVICE|WARN) \| ", md, flags=re.M)) == len(checklist.RULES)
    assert (
        folder / "screenshot.png"
    ).stat().st_size > 10_000  # scripts/render_reports.py (Chromium)
    # every committed figure is one the report shows (no leftovers of an earlier render)
    shown = set(re.findall(r"\]\((figures/[^)]+\.png)\)", md))
    assert {f"figures/{p.name}" for p in (folder / "figures").glob("*.png")} == shown


def test_a_pipelined_plan_draws_one_memory_bar_per_stage(tmp_path):
    # Uneven stages move memory between ranks; the report's memory table has one row per pipeline
    # stage and its numbers are estimate()'s memory_per_rank, the largest being the plan's peak.
    from planner.parallel import ParallelConfig

    model, hw = resolve_model("gpt2"), load_profile("p4d.24xlarge")
    cfg = ParallelConfig(
        dp=4, tp=1, pp=4, micro_batch=2, global_batch=64, seq=1024, stages=(2, 4, 4, 2)
    )
    doc = estimate(model, hw, cfg, gpus=16).to_document()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    out = _report(tmp_path, str(path), "--scaling-nodes", "2")
    ranks = json.loads((out / "report.json").read_text())["best"]["prediction"]["memory_per_rank"]
    assert ranks == doc["prediction"]["memory_per_rank"] and len(ranks) == 4
    md = (out / "report.md").read_text()
    for r in ranks:
        total = sum(
            r[k]
            for k in (
                "params_bytes",
                "grads_bytes",
                "optimizer_bytes",
                "activations_bytes",
                "other_bytes",
            )
        )
        assert re.search(
            rf"^\| stage {r['rank']} \|.*\| {round(total / 2**30, 3)} \|$", md, flags=re.M
        ), r  # GiB
    assert (
        max(r["peak_bytes_per_gpu"] for r in ranks)
        == doc["prediction"]["memory"]["peak_bytes_per_gpu"]
    )


def test_recorded_candidates_are_plans_the_search_could_return(monkeypatch):
    # GPT-3 175B on 960 GPUs: the search's memory probes include zero-bubble rows whose micro-batch
    # count torch's looped schedules cannot run (m=256, pp=20); the report must not draw or pick them.
    import numpy as np

    import planner.score
    from planner.catalog import get
    from planner.parallel import SCHEDULES
    from planner.report import backend
    from planner.report.build import Scenario

    seen = []  # every batch the search scored, as the report's recorder saw it
    real_score = planner.score.score

    def spy(model, hw, cands, **kw):
        scores = real_score(model, hw, cands, **kw)
        seen.append(
            {
                "dp": np.asarray(cands.dp),
                "mb": np.asarray(cands.micro_batch),
                "pp": np.asarray(cands.pp),
                "schedule": np.asarray(cands.schedule),
                "global_batch": kw["global_batch"],
                "step": np.asarray(scores.step_time_s, float),
                "peak": np.asarray(scores.peak_bytes_per_gpu, float),
            }
        )
        return scores

    monkeypatch.setattr(planner.score, "score", spy)
    monkeypatch.setattr(backend, "score", spy)  # the name backend imported
    hw = load_profile("p4d.24xlarge")
    scenario = Scenario(model="gpt3-175b", hardware="p4d.24xlarge", gpus=960, global_batch=1536)
    result = backend.search(get("gpt3-175b"), hw, scenario, top=1)

    # torch.distributed.pipelining's looped schedules run m micro-batches in rounds of m // pp: m % max(1, m // pp) == 0
    looped_ids = [SCHEDULES.index("interleaved-1f1b"), SCHEDULES.index("zero-bubble")]
    for batch in seen:
        m = batch["global_batch"] // (batch["dp"] * batch["mb"])
        batch["ok"] = ~np.isin(batch["schedule"], looped_ids) | (
            m % np.maximum(1, m // batch["pp"]) == 0
        )
    # the search scores only candidates it could return (its bounds are runnable candidates too), so the
    # backend's filter of unrunnable probes keeps every batch whole
    assert sum(int((~b["ok"]).sum()) for b in seen) == 0
    kept = np.concatenate([b["step"][b["ok"]] for b in seen])
    assert len(result.step_time_s) == len(result.pp) == len(kept) > 10_000
    assert np.array_equal(np.sort(result.step_time_s), np.sort(kept))
    piped = result.best_pipelined
    fastest = min(
        float(b["step"][i])
        for b in seen
        for i in np.flatnonzero(b["ok"] & (b["pp"] > 1) & (b["peak"] <= hw.memory_bytes))
    )
    assert piped is not None and piped.pp > 1
    assert fastest == min(
        float(b["step"][i])
        for b in seen
        for i in np.flatnonzero(
            b["ok"]
            & (b["pp"] == piped.pp)
            & (b["dp"] == piped.dp)
            & (b["mb"] == piped.micro_batch)
            & (b["schedule"] == SCHEDULES.index(piped.schedule))
            & (b["peak"] <= hw.memory_bytes)
        )
    )


def test_the_goodput_section_shows_the_plans_reliability_figures(small_report):
    """Expected interruptions, interval, lost hours and the cost of reliability are the plan's own
    prediction.reliability (planner.goodput, recommend with the run's tokens), and the figure is there."""
    data = json.loads((small_report / "report.json").read_text())
    rel = data["best"]["prediction"]["reliability"]
    md = (small_report / "report.md").read_text()
    section = md.split("## Goodput under failures")[1].split("\n## ")[0]
    assert f"interrupted {rel['expected_interruptions']:.1f} times" in section
    assert f"{rel['checkpoint_interval_s'] / 60:.1f} min" in section
    assert f"{rel['lost_hours']:.1f} h of redone work" in section
    assert f"${rel['usd_reliability']:,.0f} on top of" in section
    assert (
        "figures/goodput_by_size.png" in section
        and (small_report / "figures" / "goodput_by_size.png").is_file()
    )
    assert data["best"]["plan"]["checkpoint_interval_s"] == rel["checkpoint_interval_s"]
    rule = next(r for r in data["checklist"] if r["rule"] == "plan-for-failures")
    assert f"goodput {100 * rel['goodput']:.1f}%" in rule["number"]
    row = next(r for r in data["scaling"] if r["gpus"] == 16)
    assert row["goodput"] == rel["goodput"]


def test_a_plan_file_report_gets_its_goodput_too(tmp_path, small_report):
    best = json.loads((small_report / "report.json").read_text())["best"]
    doc = {k: v for k, v in best.items() if k not in ("goodput", "checkpoint_interval_s")}
    doc["prediction"] = {
        k: v for k, v in best["prediction"].items() if k not in ("goodput", "reliability")
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    data = json.loads(
        (_report(tmp_path, str(path), "--scaling-nodes", "2") / "report.json").read_text()
    )
    assert data["best"]["prediction"]["reliability"]["goodput"] == pytest.approx(
        best["prediction"]["goodput"]
    )


def test_report_ranks_by_every_objective_recommend_has_from_one_definition(tmp_path):
    from planner.commands.common import OBJECTIVE_PHRASES
    from planner.search import OBJECTIVES

    assert (
        tuple(OBJECTIVE_PHRASES) == OBJECTIVES
    )  # the help describes exactly the set the search ranks by
    for command, tokens in (("report", "--tokens"), ("recommend", "--tokens")):
        text = " ".join(
            runner.invoke(app, [command, "--help"]).output.replace("│", " ").split()
        )  # rich's box unwrapped
        for name in OBJECTIVES:
            assert f"{name} (" in text, (command, name)
        assert f"least expected time for {tokens} including failures" in text
    out = _report(tmp_path, *SMALL[:-1], "1", "--objective", "time-to-train")
    data = json.loads((out / "report.json").read_text())
    rec = recommend(
        resolve_model("gpt2"),
        load_profile("p4d.24xlarge"),
        gpus=16,
        global_batch=64,
        top=4,
        tokens=300e9,
        objective="time-to-train",
    )
    assert (
        data["scenario"]["objective"] == "time-to-train"
        and data["best"]["plan"] == rec.best["plan"]
    )


def test_an_unknown_objective_is_refused_before_anything_is_written(tmp_path):
    result = runner.invoke(
        app, ["report", *SMALL, "--objective", "goodput", "--out", str(tmp_path / "x")]
    )
    assert (
        result.exit_code == 2
        and "time-to-train" in result.output
        and "Traceback" not in result.output
    )
    assert not (tmp_path / "x").exists()


def test_the_rules_advice_renders_as_advice_with_its_numbers_and_source():
    from planner.report.checklist import RuleResult
    from planner.report.render import ReportContent, to_html, to_markdown

    rule = RuleResult(
        rule="fp8",
        title="Use FP8 GEMMs",
        status="advice",
        number="step 1.5 s vs 1.2 s",
        detail="Train the GEMMs in FP8.",
        source="Micikevicius et al. 2022",
    )
    content = ReportContent(title="t", sections=(), checklist=(rule,))
    assert (
        "| ADVICE | Use FP8 GEMMs | step 1.5 s vs 1.2 s | Train the GEMMs in FP8. Source: Micikevicius et al. "
        "2022. |" in to_markdown(content)
    )
    html = to_html(content)
    assert (
        'data-status="advice"><td class="advice">ADVICE</td>' in html
        and "Source: Micikevicius" in html
    )


def test_a_context_parallel_plan_shows_cp_in_every_plan_table_and_memory_in_gib(tmp_path):
    """A cp=2 plan file: the plans table has cp, ep and shard-group columns with the plan's values,
    the scaling
    table names every axis of each plan, memory is in GiB, and no section uses an internal name."""
    from planner.parallel import ParallelConfig

    cfg = ParallelConfig(
        dp=4, tp=2, cp=2, micro_batch=1, global_batch=64, zero=1, seq=1024, placement="DPCT"
    )
    doc = estimate(resolve_model("gpt2"), load_profile("p4d.24xlarge"), cfg, gpus=16).to_document()
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    out = _report(tmp_path, str(path), "--scaling-nodes", "2")
    md = (out / "report.md").read_text()
    headers = [line for line in md.splitlines() if line.startswith("|") and "| dp |" in line]
    assert headers and all("| cp | ep | shard group |" in h for h in headers)
    row = next(line for line in md.splitlines() if line.startswith(("| given ", "| plan file")))
    cells = [c.strip() for c in row.strip("|").split("|")]
    columns = [c.strip() for c in headers[0].strip("|").split("|")]
    assert cells[columns.index("cp")] == "2 p2p" and cells[columns.index("shard group")] == "all"
    data = json.loads((out / "report.json").read_text())
    planned = [r["plan"] for r in data["scaling"] if "tokens_per_s" in r]
    assert planned and all(" cp" in label and " ep" in label for label in planned)
    own = next(r for r in data["scaling"] if r["gpus"] == 16)
    assert own["plan"].startswith("dp4 tp2 pp1 cp2 ep1 shard all")
    peak = doc["prediction"]["memory"]["peak_bytes_per_gpu"]
    assert f"peak {peak / 2**30:.2f} GiB" in md and " GB per GPU" not in md
    assert "the seed" not in md.lower() and "seed's" not in md.lower()


def test_the_report_draws_the_chosen_plans_simulated_step(small_report):
    """The chosen plan's step as the timeline simulates it (issue 32 item 4): the figure is there
    and the data-parallel time its caption reads off the simulation (exposed after the compute plus
    the slowdown of the compute the hidden part shares the GPU with) is the plan document's dp_comm
    term."""
    md = (small_report / "report.md").read_text()
    assert "figures/simulated_step.png" in md
    assert (small_report / "figures" / "simulated_step.png").stat().st_size > 1000
    best = json.loads((small_report / "report.json").read_text())["best"]
    exposed_ms = float(best["prediction"]["time_breakdown_s"]["dp_comm"]) * 1e3
    shown = re.search(r"([0-9.e+-]+) ms of the step in all", md)
    assert shown and float(shown.group(1)) == pytest.approx(exposed_ms, rel=1e-3, abs=1e-6)


def test_on_another_stack_a_plan_files_alternatives_run_that_stacks_defaults(tmp_path):
    """report --framework megatron on a Composer plan: Megatron computes no train metrics, as an
    export to it drops them (planner.exports.retarget)."""
    cfg = ParallelConfig(dp=8, global_batch=64, seq=1024, zero=3, framework="fsdp")
    model, hw = resolve_model("gpt2"), load_profile("p4d.24xlarge")
    plan = estimate(model, hw, cfg, gpus=8, options=RunOptions(train_metrics=2))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_document()))
    out = _report(tmp_path, str(path), "--framework", "megatron", "--scaling-nodes", "1")
    data = json.loads((out / "report.json").read_text())
    assert data["alternatives"]
    assert all(a["software"]["train_metrics"] == 0 for a in data["alternatives"])


def test_every_search_of_a_plan_files_report_runs_the_plans_options(tmp_path, monkeypatch):
    """The runners-up and each scaling row's search (other node counts) take the plan's options."""
    from planner.report import backend

    seen = []
    search = backend.search

    def recording(*args, options=None, **kwargs):
        seen.append(options)
        return search(*args, options=options, **kwargs)

    monkeypatch.setattr(backend, "search", recording)
    cfg = ParallelConfig(dp=8, global_batch=64, seq=1024, zero=3, framework="fsdp")
    model, hw = resolve_model("gpt2"), load_profile("p4d.24xlarge")
    plan = estimate(model, hw, cfg, gpus=8, options=RunOptions(train_metrics=2))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_document()))
    _report(tmp_path, str(path), "--scaling-nodes", "1,2")
    assert len(seen) >= 2 and all(o is not None and o.train_metrics == 2 for o in seen)
