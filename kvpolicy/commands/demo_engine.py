"""One simulated engine of ``kvpolicy demo``: an elastic KV pool on the host driver, attached
to the ledger like a real engine, serving a load that rises and falls.

``python -m kvpolicy.commands.demo_engine MODEL LEDGER_DIR PHASE`` runs until killed. Its
memory is the host driver's (ordinary process memory standing in for a GPU's); its blocks
are 2 MiB, allocated while its load grows and freed while it falls, within the limit the
controller publishes, which it acknowledges like an engine.
"""

from __future__ import annotations

import math
import sys
import time

from kvpolicy.units import GiB, MiB

DEMO_CAPACITY = 4 * GiB
"""The simulated GPU: small, since the host driver's mapped memory is this machine's."""
BLOCK = 2 * MiB
PERIOD_S = 20.0
"""One rise and fall of an engine's load."""


def main(argv: list[str]) -> int:
    from kvpolicy import attach
    from kvpolicy.alloc import BlockPool, BlockSpec, HostDriver, OutOfBlocks

    model, ledger_dir, phase = argv[0], argv[1], float(argv[2])
    instance = attach(model=model, gpu="cuda:0", ledger_dir=ledger_dir, elastic=True, id=f"{model}/0")
    driver = HostDriver(capacity=DEMO_CAPACITY)
    pool = BlockPool(driver, BlockSpec(BLOCK), DEMO_CAPACITY // BLOCK, chunk=BLOCK, limit=instance.limit_source())
    live: list[int] = []
    print("attached", flush=True)
    last_revision = None
    started = time.monotonic()
    while True:
        reading = instance.read()
        if reading.revision != last_revision:
            last_revision = reading.revision
            instance.acknowledge(reading.revision, "applied")
        # The load the engine would like to hold: a wave between 10% and 90% of the simulated GPU.
        wave = 0.5 + 0.4 * math.sin(2 * math.pi * ((time.monotonic() - started) / PERIOD_S + phase))
        want = int(wave * DEMO_CAPACITY) // BLOCK
        if want > len(live):
            try:
                live += pool.alloc(min(want - len(live), 16))
            except OutOfBlocks:
                pass  # at its limit: a real engine would queue requests
        elif want < len(live):
            pool.free(live[want:])
            del live[want:]
        instance.report(pool.used_bytes, pool.held_bytes)
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
