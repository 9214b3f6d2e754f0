"""The spread of recorded GPU runs: per trace and GPU, kvpolicy's tokens over static's, their mean and standard
error, one run's standard deviation, and static's own spread.

    python3 benchmarks/colocate/spread.py benchmarks/colocate/runs/2026-12-07-h100/allbusy*

Each argument is a directory ``--combine`` wrote (its ``results.json``). One run is one draw: which requests a
full pool admits, preempts or loses to the clients' patience moves a run's ratio by a few per cent, so a code
is judged on the mean over runs, and a goal stated for every run on how far one run strays from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from analysis import mean_and_spread


def spread(results: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (trace, GPU) of the runs' ``results.json`` documents: the token ratios' mean, s.e., s.d. and range,
    and static's totals' s.d. relative to their mean."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["params"], r["machine"]["gpu"]), []).append(r)
    out = {}
    for key, runs in sorted(groups.items()):
        ratios = [r["tokens_ratio"] for r in runs]
        static = mean_and_spread([r["modes"]["static"]["tokens"] for r in runs])
        out[key] = {**mean_and_spread(ratios), "min": min(ratios), "max": max(ratios),
                    "static_sd": None if static["sd"] is None else static["sd"] / static["mean"]}
    return out


def table(rows: dict[tuple[str, str], dict[str, Any]]) -> str:
    def f(v: float | None, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    lines = ["| trace | GPU | runs | kvpolicy × static, mean ± s.e. | s.d. of one run | range | static's own s.d. |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for (trace, gpu), s in rows.items():
        lines.append(f"| {trace} | {gpu} | {s['n']} | {f(s['mean'], '.3f')} ± {f(s['se'], '.3f')} | "
                     f"{f(s['sd'], '.1%')} | {s['min']:.3f}–{s['max']:.3f} | {f(s['static_sd'], '.1%')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, metavar="DIR", help="a directory --combine wrote (results.json)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.runs if not (d / "results.json").is_file()]
    if missing:
        ap.error(f"no results.json in {', '.join(missing)}")
    rows = spread([json.loads((d / "results.json").read_text()) for d in args.runs])
    if args.json:
        print(json.dumps([{"trace": t, "gpu": g, **s} for (t, g), s in rows.items()], indent=2))
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
