"""Records, in every Python process of an engine under test, each call vLLM makes to a general plugin.

The e2e tests put this folder on PYTHONPATH (inherited by the engine core and worker
processes vLLM spawns) and name a folder in KVPOLICY_E2E_PLUGIN_CALLS. vLLM finds its general
plugins (``vllm.general_plugins``) with ``importlib.metadata.entry_points`` and calls
``EntryPoint.load()()`` in each of its processes;
the wrapper returned here writes one JSON file per call: the process, the entry point,
and how the call ended. Neither vLLM nor kvpolicy is changed.
"""

import os

_CALLS = os.environ.get("KVPOLICY_E2E_PLUGIN_CALLS")

if _CALLS:
    import functools
    import importlib.metadata
    import json
    import multiprocessing
    import sys
    import time

    _load = importlib.metadata.EntryPoint.load

    def _record(entry_point, outcome):
        record = {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "process": multiprocessing.current_process().name,
            "argv": sys.argv[:3],
            "group": entry_point.group,
            "name": entry_point.name,
            "value": entry_point.value,
            "outcome": outcome,
            "time": time.time(),
        }
        path = os.path.join(_CALLS, f"{os.getpid()}-{entry_point.group}-{entry_point.name}-{time.monotonic_ns()}.json")
        with open(path, "w") as out:
            json.dump(record, out)

    def load(self):
        target = _load(self)
        if self.group != "vllm.general_plugins" or not callable(target):
            return target

        @functools.wraps(target)
        def called(*args, **kwargs):
            try:
                result = target(*args, **kwargs)
            except BaseException as exc:
                _record(self, f"raised {type(exc).__name__}: {exc}")
                raise
            _record(self, "returned")
            return result

        return called

    importlib.metadata.EntryPoint.load = load
