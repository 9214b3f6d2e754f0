"""``spread.py``: the recorded runs' ratios grouped by trace and GPU, with the spread the README quotes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "colocate"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))

from spread import main, spread


def _run(trace: str, gpu: str, ratio: float, static: int) -> dict:
    return {"params": trace, "machine": {"gpu": gpu}, "tokens_ratio": ratio,
            "modes": {"static": {"tokens": static}, "kvpolicy": {"tokens": round(ratio * static)}}}


def test_runs_are_grouped_by_trace_and_gpu_with_mean_error_and_one_runs_spread() -> None:
    rows = spread([_run("allbusy", "H100", 0.97, 1000), _run("allbusy", "H100", 1.01, 1100),
                   _run("allbusy", "H200", 0.99, 1000), _run("bursty", "H100", 1.4, 900)])
    assert list(rows) == [("allbusy", "H100"), ("allbusy", "H200"), ("bursty", "H100")]
    a = rows[("allbusy", "H100")]
    assert (a["n"], a["mean"], a["min"], a["max"]) == (2, pytest.approx(0.99), 0.97, 1.01)
    assert a["sd"] == pytest.approx(0.02 * 2 ** 0.5) and a["se"] == pytest.approx(0.02)
    assert a["static_sd"] == pytest.approx((100 / 2 ** 0.5) / 1050)
    assert rows[("allbusy", "H200")]["se"] is None and rows[("allbusy", "H200")]["mean"] == 0.99  # one run: no spread


def test_the_recorded_runs_without_the_edit_give_the_readmes_figure(capsys) -> None:
    """benchmarks/colocate/README.md: without the edit, five H100 runs, 0.989 ± 0.008, one run's s.d. 1.7%."""
    dirs = sorted((BENCH / "runs" / "2026-12-07-h100").glob("allbusy-noedit*"))
    assert main([str(d) for d in dirs] + ["--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["n"], round(row["mean"], 3), round(row["se"], 3), round(row["sd"], 3)) == (5, 0.989, 0.008, 0.017)
    assert row["gpu"].startswith("NVIDIA H100")


def test_a_directory_without_results_is_a_usage_error(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path)])
    assert exited.value.code == 2 and "no results.json" in capsys.readouterr().err
