"""docs/calibration.md's table of fitted constants is what benchmarks/fitted_constants.py reads
off the code, the data files and the stored leave-one-source-out results (issue 32: every fitted
constant with its value, rows and held-out error), so the doc cannot drift from them."""

from __future__ import annotations

from pathlib import Path

from benchmarks import fitted_constants as F

DOC = Path(__file__).resolve().parents[1] / "docs" / "calibration.md"


def test_the_documented_table_is_the_scripts_rendering():
    rows = F.collect()
    text = DOC.read_text()
    start = text.index("| # | constant | value |")
    table = text[start : text.index("\n\n", start)]
    assert table == F.markdown(rows), "re-render: benchmarks/fitted_constants.py --markdown"
    assert f"**Count: {len(rows)}**" in text
