"""GPU identity (issue 18): the ledger is keyed by the GPU's UUID, read through NVML.

NVML's answers come from a stand-in pynvml (tests/support/fake_nvml.py: this machine has
no GPU); the ledgers are real files, and the engines of the container tests real processes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvpolicy.policy.resolve import gpu_settings
from kvpolicy.runtime import gpu_identity as G
from kvpolicy.runtime.directory import LedgerDir
from kvpolicy.runtime.gpus import NvmlSampler, mixed_ids_note
from kvpolicy.runtime.layout import GPU_ID_WIDTH
from kvpolicy.runtime.segment import check_gpu_id
from tests.support import fake_nvml
from tests.support.fake_nvml import FakeGpu, FakeMig
from tests.support.processes import read_line

GiB = 1 << 30
U = [
    "GPU-5a0e4f2c-1b3d-4e5f-8a9b-0c1d2e3f4a5b",
    "GPU-9c7d1e2f-3a4b-4c5d-9e6f-7a8b9c0d1e2f",
    "GPU-1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9",
    "GPU-c0ffee00-1234-4abc-9def-0123456789ab",
]
MIG_A = "MIG-7e0b5d1a-2c3f-5e4d-8b6a-1f0e9d8c7b6a"
MIG_B = "MIG-3b2a1c0d-9e8f-5a7b-8c6d-5e4f3a2b1c0d"


def machine(mig_on_gpu0: int = 0) -> list[FakeGpu]:
    """Four GPUs; GPU 0 in MIG mode with ``mig_on_gpu0`` instances when that is not 0."""
    gpus = [FakeGpu(u, memory=(80 + i) * GiB, used=i * GiB, mig=False if i else None) for i, u in enumerate(U)]
    if mig_on_gpu0:
        gpus[0].mig = True
        gpus[0].migs = [FakeMig(MIG_A, 35 * GiB, gi=1, ci=0, place=0), FakeMig(MIG_B, 35 * GiB, gi=2, ci=0, place=1)][
            :mig_on_gpu0
        ]
    return gpus


def resolve(visible: str | None, local: int, gpus: list[FakeGpu]) -> G.GpuIdentity:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return G.local_gpu(local, env, fake_nvml.module(gpus))


# --- CUDA_VISIBLE_DEVICES: indices, UUIDs, MIG UUIDs, reordered ---------------------------------------


@pytest.mark.parametrize(
    ("visible", "local", "want"),
    [(None, 1, 1), ("", 3, 3), ("2,3", 0, 2), ("2,3", 1, 3), ("3,1", 0, 3), ("3,1", 1, 1), (" 1 , 2", 1, 2)],
)
def test_indices_name_the_gpu_by_its_uuid(visible: str | None, local: int, want: int) -> None:
    got = resolve(visible, local, machine())
    assert got == G.GpuIdentity(id=U[want], name=f"cuda:{want}", index_id=f"cuda:{want}")


@pytest.mark.parametrize(
    ("visible", "local", "want"),
    [(f"{U[2]},{U[1]}", 0, 2), (f"{U[2]},{U[1]}", 1, 1), ("GPU-c0ffee", 0, 3), (f"2,{U[0]}", 1, 0)],
)
def test_uuids_full_prefixes_mixed_and_reordered(visible: str, local: int, want: int) -> None:
    got = resolve(visible, local, machine())
    assert (got.id, got.name) == (U[want], f"cuda:{want}")


def test_mig_instances_are_gpus_of_their_own() -> None:
    gpus = machine(mig_on_gpu0=2)
    a, b = resolve(f"{MIG_B},{MIG_A}", 0, gpus), resolve(f"{MIG_B},{MIG_A}", 1, gpus)
    assert (a.id, a.name, a.index_id) == (MIG_B, "cuda:0/mig:1", "cuda:0")
    assert (b.id, b.name) == (MIG_A, "cuda:0/mig:0")
    assert resolve(f"MIG-GPU-{U[0][4:]}/2/0", 0, gpus).id == MIG_B  # the pre-R470 form
    assert resolve(MIG_A[:12], 0, gpus).id == MIG_A
    for entry in ("0", U[0]):  # the parent, by index or UUID: which instance is meant is not known
        with pytest.raises(ValueError, match=r"in MIG mode with 2 MIG instances visible here; name the instance by its MIG- UUID"):
            resolve(entry, 0, gpus)
    # a container that sees one instance of a GPU in MIG mode: its index names that instance
    assert resolve(None, 0, machine(mig_on_gpu0=1)).id == MIG_A
    assert len(MIG_A.encode()) == 40 <= GPU_ID_WIDTH and check_gpu_id(MIG_A) == MIG_A.encode()


@pytest.mark.parametrize(
    ("visible", "local", "error"),
    [
        ("4", 0, r"entry '4': NVML lists 4 GPU\(s\) here, so there is no GPU 4"),
        ("GPU-deadbeef", 0, r"entry 'GPU-deadbeef': NVML lists no GPU\(s\) with that UUID"),
        ("GPU-", 0, r"NVML lists 4 GPU\(s\) with that UUID"),
        ("MIG-7e0b", 0, r"NVML lists no MIG instance\(s\)"),
        ("1,2", 2, r"CUDA device 2 is not among CUDA_VISIBLE_DEVICES='1,2'"),
        ("nvidia0", 0, r"entry 'nvidia0' is neither an index nor a GPU-/MIG- UUID"),
    ],
)
def test_entries_that_name_no_gpu_are_refused(visible: str, local: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        resolve(visible, local, machine())


def test_every_uuid_fits_the_layouts_gpu_id_and_is_a_file_name() -> None:
    for u in [*U, MIG_A]:
        assert G.is_uuid(u) and len(u) == 40 and check_gpu_id(u) == u.encode()
    assert not G.is_uuid("cuda:0") and not G.is_uuid("GPU-5a0e")


# --- without NVML ---------------------------------------------------------------------------------------


def test_without_nvml_ids_fall_back_to_the_index_loudly(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails, as without nvidia-ml-py
    monkeypatch.setattr(G, "_warned", False)
    assert G.load_nvml() is None
    with caplog.at_level(logging.WARNING, logger="kvpolicy.gpus"):
        assert G.local_gpu(1, {"CUDA_VISIBLE_DEVICES": "4,6"}) == G.GpuIdentity("cuda:6", "cuda:6", "cuda:6")
        assert G.local_gpu(2, {}).id == "cuda:2"
    assert "NVML is not available" in caplog.text and "fall back to cuda:N" in caplog.text
    assert G.local_gpu(0, {"CUDA_VISIBLE_DEVICES": U[1]}).id == U[1]  # a full UUID is still the key
    with pytest.raises(ValueError, match="is not an index or a full GPU-/MIG- UUID; without NVML"):
        G.local_gpu(0, {"CUDA_VISIBLE_DEVICES": "GPU-5a0e"})
    assert G.display_name(U[1]) is None and G.index_id_of(U[1]) is None


def test_an_nvml_that_cannot_start_is_no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = fake_nvml.module(machine())

    def no_driver() -> None:
        raise fake_nvml.NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert G.load_nvml() is None and G.local_gpu(0, {"CUDA_VISIBLE_DEVICES": "3"}).id == "cuda:3"


# --- the controller's side --------------------------------------------------------------------------------


def test_the_sampler_finds_gpus_and_mig_instances_by_uuid_and_names_them() -> None:
    nv = fake_nvml.module(machine(mig_on_gpu0=2))
    sampler = NvmlSampler(nv)
    got = sampler.sample([U[2], MIG_B, "cuda:1", "cuda:0", U[0], "GPU-00000000-0000-0000-0000-000000000000"])
    assert got[U[2]].capacity == 82 * GiB and got[U[2]].used == 2 * GiB and got[U[2]].name == "cuda:2"
    assert (got[MIG_B].capacity, got[MIG_B].name) == (35 * GiB, "cuda:0/mig:1")
    assert got["cuda:1"].capacity == 81 * GiB and got["cuda:1"].name == "cuda:1"  # an engine's fallback id
    # a GPU in MIG mode is no GPU of the ledger: by index or UUID it has no figures; nor has an unknown UUID
    assert set(got) == {U[2], MIG_B, "cuda:1"}
    assert sampler.description == "NVML (4 GPU(s))"


def test_the_controller_warns_when_uuids_and_fallback_ids_meet() -> None:
    assert mixed_ids_note([U[0], U[1]]) is None and mixed_ids_note(["cuda:0", "cuda:1"]) is None
    note = mixed_ids_note([U[0], "cuda:0", "cpu:0"])
    assert note is not None and "index-based ids (cuda:0)" in note and "make NVML available to every engine" in note


# --- engines in containers: real processes, real ledgers ---------------------------------------------------

ENGINE = textwrap.dedent("""
    import os, sys
    from tests.support import fake_nvml
    fake_nvml.install_from_env()
    import kvpolicy
    from kvpolicy.adapters.vllm_adapter.identity import gpu_of
    from kvpolicy.runtime.gpus import gpu_id
    name, kind, ledger = sys.argv[1:4]
    gpu = gpu_id(0) if kind == "sglang" else gpu_of(0)
    inst = kvpolicy.attach(model=name, id=name, gpu=gpu, ledger_dir=ledger, handle_signals=False,
                           capacity=80 << 30, headroom=0, other_used=0)
    inst.admit_static(int(sys.argv[4]) << 30)
    print(gpu, flush=True)
    sys.stdin.read()  # hold the slot until the test is done
""")


class Engines:
    """Engine processes, each with its own view of the machine (its container's NVML and CUDA_VISIBLE_DEVICES)."""

    def __init__(self, ledger_dir: Path, env: dict[str, str]) -> None:
        self.ledger_dir, self.env, self.procs = ledger_dir, env, []

    def start(self, name: str, kind: str, sees: list[FakeGpu] | None, visible: str | None = None,
              gib: int = 1) -> str:
        env = dict(self.env)
        env[fake_nvml.ENV] = "" if sees is None else fake_nvml.to_env(sees)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        p = subprocess.Popen([sys.executable, "-c", ENGINE, name, kind, str(self.ledger_dir), str(gib)], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        line = read_line(p).strip()  # type: ignore[union-attr]
        if not line:
            p.wait(timeout=60)
            raise AssertionError(f"engine {name} failed: {p.stderr.read()}")  # type: ignore[union-attr]
        return line

    def stop(self) -> None:
        for p in self.procs:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=60)


@pytest.fixture
def engines(ledger_dir: Path, child_env: dict[str, str]):
    e = Engines(ledger_dir, child_env)
    try:
        yield e
    finally:
        e.stop()


def ledger_ids(ledger_dir: Path) -> dict[str, list[str]]:
    with LedgerDir(ledger_dir) as ld:
        return {g: sorted(v.id for v in s.instances) for g, s in ld.read().gpus.items()}


def test_two_containers_that_both_see_cuda_0_on_different_gpus_get_different_ledgers(
        engines: Engines, ledger_dir: Path) -> None:
    gpus = machine()
    # each container's NVML lists only its own GPU, as index 0, and CUDA_VISIBLE_DEVICES is unset
    assert engines.start("a", "vllm", [gpus[1]]) == U[1]
    assert engines.start("b", "sglang", [gpus[2]]) == U[2]
    assert ledger_ids(ledger_dir) == {U[1]: ["a"], U[2]: ["b"]}
    assert sorted(p.name for p in ledger_dir.iterdir() if p.name.endswith(".ledger")) == sorted([f"{U[1]}.ledger", f"{U[2]}.ledger"])


def test_one_gpu_seen_through_different_indices_shares_one_ledger(engines: Engines, ledger_dir: Path) -> None:
    gpus = machine()
    assert engines.start("host", "sglang", gpus, visible="3,2", gib=50) == U[3]  # the host's GPU 3, its cuda:0
    assert engines.start("pod", "vllm", [gpus[3]], gib=20) == U[3]  # a pod that sees it as its only GPU
    assert engines.start("uuid", "vllm", gpus, visible=U[3][:13], gib=1) == U[3]  # named by a UUID prefix
    assert ledger_ids(ledger_dir) == {U[3]: ["host", "pod", "uuid"]}
    with LedgerDir(ledger_dir) as ld:  # one accounting: each admission counted against the same 80 GiB
        assert ld.read().gpus[U[3]].totals.runtime_reserved == 71 * GiB


def test_mig_instances_of_one_gpu_get_a_ledger_each(engines: Engines, ledger_dir: Path) -> None:
    gpus = machine(mig_on_gpu0=2)
    assert engines.start("a", "vllm", gpus, visible=MIG_A) == MIG_A
    assert engines.start("b", "sglang", gpus, visible=MIG_B) == MIG_B
    assert ledger_ids(ledger_dir) == {MIG_A: ["a"], MIG_B: ["b"]}


def test_engines_without_nvml_fall_back_to_index_ids(engines: Engines, ledger_dir: Path) -> None:
    assert engines.start("a", "vllm", None, visible="1") == "cuda:1"
    assert engines.start("b", "sglang", None, visible="1") == "cuda:1"
    assert ledger_ids(ledger_dir) == {"cuda:1": ["a", "b"]}
    assert json.loads(json.dumps(sorted(os.listdir(ledger_dir)))) == ["cuda:1.ledger"]


# --- what a policy's gpu blocks match ------------------------------------------------------------------------


def test_gpu_blocks_match_the_uuid_before_the_display_name(tmp_path: Path) -> None:
    from kvpolicy.lint.load import load_policy

    file = tmp_path / "p.kvp"
    file.write_text(f'version 1\ndefaults {{ headroom 1 GiB }}\ngpu "cuda:2" {{ headroom 3 GiB; chunk 4 MiB }}\n'
                    f'gpu "{U[2]}" {{ headroom 5 GiB }}\n')
    policy = load_policy(file)
    by_both = gpu_settings(policy, U[2], "cuda:2")
    assert (by_both.headroom_bytes(0), by_both.chunk) == (5 * GiB, 4 << 20)  # each setting from the most specific
    assert gpu_settings(policy, U[1], "cuda:2").headroom_bytes(0) == 3 * GiB  # by display name alone
    assert gpu_settings(policy, U[1], "cuda:1").headroom_bytes(0) == 1 * GiB  # neither: the defaults
    assert gpu_settings(policy, "cuda:2").headroom_bytes(0) == 3 * GiB  # a fallback id is its own name


def test_an_engines_own_figures_match_blocks_by_its_nvml_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpolicy.adapters.ledger_port import policy_gpu_figures

    file = tmp_path / "p.kvp"
    file.write_text('version 1\ngpu "cuda:2" { headroom 10% }\n')
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.module(machine()))
    assert policy_gpu_figures(file, U[2], 100 * GiB) == (100 * GiB, 10 * GiB)
    assert policy_gpu_figures(file, U[1], 100 * GiB) == (100 * GiB, 0)
