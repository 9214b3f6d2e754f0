"""The co-location tenants' paged decode kernel (``benchmarks/colocate/paged_attention.py``)
against the paged gather + SDPA it replaced, on a real block pool's views.

On a CPU the Triton interpreter runs the kernel, in a process of its own (``paged_check``);
on the GPU the compiled kernel reads a cuda-python pool (``gpu``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the kernel and its reference are torch work")
pytest.importorskip("triton", reason="the paged kernel is a Triton kernel")
pytest.importorskip("numpy")

HERE = Path(__file__).resolve().parent


def _check_results(results: dict) -> None:
    assert results["window=0"] < 1e-3, results  # the whole context, ragged lengths
    assert results["window=2"] < 1e-3, results  # each request's last two blocks
    poisoned = results["poisoned"]  # one token of request 1's V changed: request 1 moves, the others do not
    assert poisoned[1] > 1e-3 and poisoned[0] == 0 and poisoned[2] == 0, poisoned


def test_interpreted_kernel_matches_gather_and_sdpa() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(HERE / "paged_check.py")], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_results(json.loads(done.stdout.strip().splitlines()[-1]))


def _cuda() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("cuda") is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU and cuda-python")
def test_compiled_kernel_on_a_cuda_pool_matches_gather_and_sdpa() -> None:
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")  # the primary context, before the driver uses it
    from tests.colocate import paged_check

    _check_results(paged_check.run("cuda"))
    assert paged_check.far_blocks_only("cuda") < 1e-3
    # Through KVWork.attend, as the tenants run it: it ran, and it accumulated a finite number.
    pool = paged_check.make_pool("cuda")
    try:
        work = paged_check.KVWork(pool, attn_layers=3, max_batch=16, window=0, attention="paged")
        tables = paged_check.fill_batch(work, [100, 250], seed=5)
        work.attend(tables, [100, 250])
        work.synchronize()
        assert torch.isfinite(work.sink) and work.sink.item() != 0
        del work
    finally:
        pool.close()
