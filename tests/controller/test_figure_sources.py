"""Where the controller's GPU figures come from, and what it says when they do not fit: a facts file
whose other use exceeds the capacity is refused at start; a GPU in the ledger that the source of
figures does not know is decided on the ledger's own figures, and the status says so."""

from __future__ import annotations

import json
import subprocess
import sys

from kvpolicy.facts import Facts, GpuFacts
from kvpolicy.runtime.gpus import FactsSampler
from kvpolicy.runtime.status import read_status
from tests.controller.site import GiB, wait_for


def test_a_facts_file_with_more_other_use_than_capacity_is_refused_at_start(site, tmp_path):
    facts = tmp_path / "node.facts.json"
    facts.write_text(json.dumps({"schema": 1, "gpus": [{"id": "cuda:0", "capacity": "4 GiB", "other_used": "10 GiB"}],
                                 "instances": []}))
    done = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "run", str(site.policy), "--ledger-dir",
                           str(site.ledger_dir), "--facts", str(facts), "--once"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "GPU 'cuda:0''s other_used (10 GiB) is more than its capacity (4 GiB)" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_facts_file_with_problems_is_refused_at_start_with_each_problem_at_its_place(site, tmp_path):
    facts = tmp_path / "node.facts.json"
    facts.write_text('{"schema": 1,\n "gpus": [{"id": "cuda:0", "capacity": "80"},\n          {"id": "cuda:1", "capasity": 1}]}\n')
    done = subprocess.run([sys.executable, "-m", "kvpolicy.cli", "run", str(site.policy), "--ledger-dir",
                           str(site.ledger_dir), "--facts", str(facts), "--once"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    capacity = "capacity: Bytes of memory the GPU has (cuMemGetInfo's total, or the policy's capacity)."
    assert done.stderr.splitlines()[-6:] == [
        f"{facts}:2:40: KVD008 error: gpus.0.capacity: '80': a size needs a unit, e.g. 80 GiB (units: B, KiB, MiB, "
        "GiB, TiB, KB, MB, GB, TB)",
        f"  hint: {capacity}",
        f"{facts}:3:11: KVD009 error: gpus.1.capacity: required, not given",
        f"  hint: {capacity}",
        f"{facts}:3:28: KVD010 error: gpus.1.capasity: unknown field 'capasity'",
        "  hint: did you mean 'capacity'?",
    ]
    rows = facts.read_text().split("\n")
    assert (rows[1][39:43], rows[2][10], rows[2][27:37]) == ('"80"', "{", '"capasity"')  # the places named
    assert not (site.ledger_dir / "status.json").exists(), "not started: nothing written beside the ledger"


def test_a_gpu_the_facts_file_does_not_name_is_decided_on_the_ledgers_figures_with_a_note(site):
    site.controller()  # --gpu-capacity 80 GiB: publishes figures for cuda:0
    site.engine("chat")
    assert wait_for(lambda: (s := site.slot("chat/0")) and s.limit > 0)
    site.stop_controllers()
    other_gpu = FactsSampler(Facts(gpus=(GpuFacts(id="cuda:7", capacity=40 * GiB),), instances=()))
    site.controller(sampler=other_gpu)
    status = wait_for(lambda: (s := read_status(site.ledger_dir)) and s.problems and s)
    assert any(p.startswith("cuda:0: the source of GPU figures does not know it: using the figures the ledger holds")
               for p in status.problems), status.problems
    assert [g.capacity for g in status.gpus] == [80 * GiB], "decided on the figures the ledger holds"
