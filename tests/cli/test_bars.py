"""GPU bars (``explain``, ``top``): a fixed width whatever the capacity, marks that read, one
legend, lines that fit 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy import gpu_bar
from kvpolicy.cli import main
from kvpolicy.terminal import Style, strip_styles

GiB = 1 << 30


@settings(deadline=None)  # a loaded machine may stall any example: no time limit
@given(
    capacity=st.integers(0, 1 << 80),
    sizes=st.lists(st.integers(-(1 << 70), 1 << 90), min_size=5, max_size=5),
    width=st.integers(1, 120),
)
def test_a_bar_has_its_width_whatever_the_figures(capacity, sizes, width):
    headroom, other, used, free, pool = sizes
    parts = gpu_bar.segments(headroom=headroom, other_used=other, pools={"c4": pool}, used=used, free=free)
    bar = gpu_bar.render_bar(parts, capacity, width)
    assert len(bar) == width
    colored = gpu_bar.render_bar(parts, capacity, width, Style(True))
    assert strip_styles(colored) == bar


def test_every_non_empty_segment_shows_and_the_cells_add_up():
    parts = gpu_bar.segments(headroom=1, other_used=GiB, pools={"swa": 1, "c4": 2, "c128": 3}, used=40 * GiB, free=GiB)
    bar = gpu_bar.render_bar(parts, 80 * GiB, 64)
    assert len(bar) == 64
    for mark in "#=S41u.":
        assert mark in bar, (mark, bar)


def test_pool_marks_read_as_their_names():
    assert gpu_bar.pool_marks(["swa", "c4", "c128", "indexer", "compressor_state"]) == {
        "c128": "1", "c4": "4", "compressor_state": "C", "indexer": "I", "swa": "S",
    }
    # A mark already taken goes to the next character of the name; never one of the fixed marks.
    marks = gpu_bar.pool_marks(["swa", "swb", "full"])
    assert len(set(marks.values())) == 3 and not set(marks.values()) & {"#", "=", "u", "."}


def test_explain_on_a_one_byte_gpu_draws_a_bar_of_the_usual_width(tmp_path: Path, capsys):
    # Bars were once round(size * 64 / capacity) characters: capacity 1 B asked for gigabytes of them.
    (tmp_path / "p.kvp").write_text('version 1\ngpu * { capacity 1 B }\nmodel "m" { min 0 B }\n')
    (tmp_path / "f.json").write_text(json.dumps({
        "schema": 1, "gpus": [{"id": "cuda:0", "capacity": 80 * GiB, "other_used": 40 * GiB}],
        "instances": [{"id": "m/0", "model": "m", "gpu": "cuda:0", "pools": {"swa": {"bytes": 10 * GiB}},
                       "elastic": {"used": GiB, "mapped": GiB}}],
    }))
    assert main(["explain", str(tmp_path / "p.kvp"), "--facts", str(tmp_path / "f.json"), "--color", "never"]) == 0
    out = capsys.readouterr().out
    (bar,) = [line for line in out.splitlines() if line.startswith("  [")]
    assert len(bar) == len("  []") + 64
    (legend,) = [line for line in out.splitlines() if line.startswith("  legend: ")]
    assert legend.split() == ["legend:", "#", "headroom", "=", "other", "use", "S", "swa", "u", "elastic", "in", "use",
                              ".", "elastic", "free"]


def test_explain_and_top_share_one_legend():
    parts = gpu_bar.segments(headroom=GiB, other_used=GiB, pools={"swa": GiB}, used=GiB, free=GiB)
    entries = gpu_bar.legend(parts, sizes=False)
    assert entries == ["# headroom", "= other use", "S swa", "u elastic in use", ". elastic free"]
    lines = gpu_bar.wrap(gpu_bar.legend(parts, sizes=True) * 4, 80, indent="  ")
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines)
