"""Every fitted constant of the cost model: value, files that hold it, meaning, the rows
that set it and its leave-one-source-out error (issue 32: calibrate fewer, physical constants).

The list is read off the code and the data, not typed here:
- benchmarks/calibrate.py: the efficiency keys its GEMM fit (`fit_gemm`) stores in
  benchmarks/results/calibration.json, `H100_TRAIN_KEYS` (the single-H100 training steps) and
  benchmarks/accuracy_published.py's `A100_KEYS` (the published Megatron-LM runs of Korthikanti et
  al. 2022);
- benchmarks/calibrate_frameworks.py: `PARAMS` (the published runs of every stack);
- benchmarks/accuracy_moe.py: `FITTED` (the Megatron-Core MoE rows);
- held fits: a framework key (frameworks/*.json) whose source starts 'fitted' (after its value),
  that no script above refits now, and an `efficiency` key whose typed-table default
  (hardware_profiles/efficiency.py) is a fit of kernel curves rather than a datasheet or literature
  figure and that no profile overrides.

The leave-one-source-out error is what the calibrating script stores: for calibrate_frameworks.py,
the MAPE of the rows of the sources the constant applies to, each source predicted with the
constants refitted without it (benchmarks/results/accuracy_frameworks.json's source groups, from
`accuracy_frameworks.py --loo`, else calibration_frameworks.json's,
weighted by rows; an `_fp8` key counts only the sources of FP8 rows); for calibrate.py, the
leave-one-row-out MAPE of the published runs (A100) and the median |error| of the timed H100 steps
leaving one (model, precision) group out; for accuracy_moe.py, its leave-one-source-out MAPE. A
kernel fit has no held-out figure (its in-sample rms).

Run: .venv/bin/python benchmarks/fitted_constants.py [--markdown]
Writes benchmarks/results/fitted_constants.json.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import stack_predictions as A  # noqa: E402
from benchmarks import accuracy_moe as M  # noqa: E402
from benchmarks import calibrate as CAL  # noqa: E402
from benchmarks import calibrate_frameworks as CF  # noqa: E402
from benchmarks import published_rows as R  # noqa: E402
from frameworks import load_framework  # noqa: E402
from hardware_profiles import load_profile  # noqa: E402
from hardware_profiles.efficiency import EFFICIENCY_KEYS  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"
OUT = RESULTS_DIR / "fitted_constants.json"
FITTED_SOURCE = re.compile(r"([-+\d.e]+[:,]?\s*)?fitted\b", re.I)
"""A framework key's source that says it was fitted: 'fitted ...' or '<value>: fitted ...'."""


def _load(name: str) -> dict:
    path = RESULTS_DIR / name
    return json.loads(path.read_text()) if path.exists() else {}


def holders(key: str, value: float, *, framework: str | None = None) -> list[str]:
    """The shipped files that hold `key` at `value` (hardware profiles, validation clusters)."""
    if framework is not None:
        return [f"frameworks/{framework}.json"]
    out = []
    for folder in ("hardware_profiles", "validation/hardware/clusters"):
        for path in sorted((ROOT / folder).glob("*.json")):
            eff = json.loads(path.read_text()).get("efficiency", {})
            if key in eff and abs(float(eff[key]) - value) <= 5e-4 * max(1.0, abs(value)):
                out.append(path.stem)
    return out


def framework_field_docs() -> dict[str, str]:
    """FrameworkProfile's attribute docstrings (frameworks/profile.py), by field."""
    tree = ast.parse((ROOT / "frameworks" / "profile.py").read_text())
    docs: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            body = node.body
            for a, b in zip(body, body[1:]):
                if (
                    isinstance(a, ast.AnnAssign)
                    and isinstance(a.target, ast.Name)
                    and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant)
                    and isinstance(b.value.value, str)
                ):
                    docs.setdefault(a.target.id, " ".join(b.value.value.split()))
    return docs


def meaning(key: str, *, framework: bool = False) -> str:
    if framework:
        return framework_field_docs().get(key, "")
    return EFFICIENCY_KEYS[key].doc


def calibrate_py() -> list[dict]:
    """benchmarks/calibrate.py: the GEMM fit's keys, H100_TRAIN_KEYS, accuracy_published.A100_KEYS."""
    result = _load("calibration.json")
    h100, a100 = load_profile("dgx-h100"), load_profile("dgx-a100-80g")
    n_steps = len(CAL._h100_rows())
    pub = CAL.PUB.load_rows()
    pub_sources = sorted({r["id"].split("-")[0] for r in pub})
    gemm = result.get("h100_gemm", {})
    out = []
    for key in (k for k in gemm if k in EFFICIENCY_KEYS):
        out.append(
            dict(
                name=f"hopper.{key}",
                key=key,
                value=h100.efficiency[key],
                script="benchmarks/calibrate.py (fit_gemm)",
                rows=f"{gemm.get('gemm_rows_used')} bf16 GEMMs above the host floor "
                "(validation/h100_train_steps.jsonl, kind gemm_bf16)",
                kind="kernel",
                loo=None,
                loo_note=f"in-sample rms log error {100 * gemm.get('gemm_rms_log_error', 0):.1f}%",
            )
        )
    g = result.get("h100_leave_one_group_out", {})
    for key in CAL.H100_TRAIN_KEYS:
        out.append(
            dict(
                name=f"hopper.{key}",
                key=key,
                value=h100.efficiency[key],
                script="benchmarks/calibrate.py (H100_TRAIN_KEYS)",
                rows=f"{n_steps} single-H100 training steps (validation/h100_train_steps.jsonl)",
                kind="training steps",
                loo=g.get("median_abs_time_error_timed"),
                loo_note="median |error| of the timed steps, one (model, precision) group out",
            )
        )
    p = result.get("published_leave_one_out", {})
    for key in CAL.PUB.A100_KEYS:
        out.append(
            dict(
                name=f"ampere.{key}",
                key=key,
                value=a100.efficiency[key],
                script="benchmarks/calibrate.py (A100_KEYS)",
                rows=f"{len(pub)} published Megatron-LM runs (validation/published_runs.json: "
                + ", ".join(pub_sources)
                + ")",
                kind="training steps",
                loo=p.get("mape"),
                loo_note="MAPE, one run out",
            )
        )
    return out


def calibrate_frameworks_py() -> list[dict]:
    """benchmarks/calibrate_frameworks.py: PARAMS, with the sources each applies to."""
    cases = CF.usable(A.unique(R.load(CF.FILES)))
    loo = (
        _load("accuracy_frameworks.json").get("leave_one_source_out")
        or _load("calibration_frameworks.json").get("leave_one_source_out", {})
    ).get("source", {})
    out = []
    for p in CF.PARAMS:
        mine = [c for c in cases if p.applies(c)]
        if p.key.endswith("_fp8"):
            mine = [c for c in mine if c.config.precision == "fp8"]
        srcs: dict[str, int] = {}
        for c in mine:
            srcs[f"{c.framework}/{c.source}"] = srcs.get(f"{c.framework}/{c.source}", 0) + 1
        held = [(loo[s]["mape"], loo[s]["predicted"]) for s in srcs if "mape" in loo.get(s, {})]
        n = sum(w for _, w in held)
        value = p.start()
        out.append(
            dict(
                name=p.name,
                key=p.key,
                value=value,
                script="benchmarks/calibrate_frameworks.py (PARAMS)",
                rows=f"{len(mine)} published runs of {len(srcs)} sources",
                sources=sorted(srcs),
                kind="training steps",
                loo=sum(m * w for m, w in held) / n if n else None,
                loo_note="MAPE of those sources, each left out of the fit",
                framework=p.framework,
            )
        )
    return out


def accuracy_moe_py() -> list[dict]:
    fw, key = M.FITTED
    res = _load("accuracy_moe.json")
    return [
        dict(
            name=f"{fw}.{key}",
            key=key,
            value=float(getattr(load_framework(fw), key)),
            script="benchmarks/accuracy_moe.py (FITTED)",
            rows=f"{len(res.get('rows', []))} Megatron-Core MoE rows of "
            f"{len(res.get('by_source', {}))} sources "
            "(validation/published/moe.json)",
            kind="training steps",
            loo=res.get("loo_mape"),
            loo_note="MAPE, one source out",
            framework=fw,
        )
    ]


def held_fits(known: set[tuple[str | None, str]]) -> list[dict]:
    """Framework keys whose source says 'fitted', kernel-curve defaults: none refitted above."""
    out = []
    for path in sorted((ROOT / "frameworks").glob("*.json")):
        doc = json.loads(path.read_text())
        for key, text in doc.get("sources", {}).items():
            value = doc.get(key)
            if (
                (path.stem, key) in known
                or not isinstance(value, (int, float))
                or not FITTED_SOURCE.match(text)
            ):
                continue
            out.append(
                dict(
                    name=f"{path.stem}.{key}",
                    key=key,
                    value=float(value),
                    script="held at an earlier fit (no script refits it)",
                    rows=text.split(":", 1)[-1].strip(),
                    kind="training steps",
                    loo=None,
                    loo_note="not refitted",
                    framework=path.stem,
                )
            )
    fitted_keys = {k for _, k in known}
    for key, spec in EFFICIENCY_KEYS.items():
        if key in fitted_keys or spec.default is None:
            continue
        if re.match(r"(fit of|fitted)", spec.source, re.I) and not holders(key, spec.default):
            out.append(
                dict(
                    name=f"default.{key}",
                    key=key,
                    value=spec.default,
                    script="hardware_profiles/efficiency.py (typed-table default)",
                    rows=spec.source,
                    kind="kernel",
                    loo=None,
                    loo_note="kernel curves, no held-out figure",
                )
            )
    return out


def collect() -> list[dict]:
    rows = calibrate_py() + calibrate_frameworks_py() + accuracy_moe_py()
    known = {(r.get("framework"), r["key"]) for r in rows}
    rows += held_fits(known)
    for r in rows:
        fw = r.get("framework")
        r["meaning"] = meaning(r["key"], framework=fw is not None)
        r["files"] = (
            holders(r["key"], r["value"], framework=fw) if fw else holders(r["key"], r["value"])
        )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| # | constant | value | fitted by | to (rows) | held-out error | held in | meaning |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        loo = f"{100 * r['loo']:.1f}% ({r['loo_note']})" if r["loo"] is not None else r["loo_note"]
        files = ", ".join(r["files"]) if len(r["files"]) <= 3 else f"{len(r['files'])} files"
        lines.append(
            f"| {i} | `{r['name']}` | {r['value']:.4g} | {r['script']} | {r['rows']} | {loo} | "
            f"{files or '-'} | {r['meaning']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)
    rows = collect()
    if args.markdown:
        print(markdown(rows))
    else:
        for i, r in enumerate(rows, 1):
            loo = f"{100 * r['loo']:5.1f}%" if r["loo"] is not None else "    - "
            print(
                f"{i:2} {r['name']:50} {r['value']:10.4g}  {loo}  {r['script']}: {r['rows'][:70]}"
            )
    by_kind = {}
    for r in rows:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + 1
    print(
        f"\n{len(rows)} fitted constants: "
        + ", ".join(f"{n} to {k}" for k, n in sorted(by_kind.items()))
    )
    OUT.write_text(
        json.dumps({"count": len(rows), "by_kind": by_kind, "constants": rows}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
