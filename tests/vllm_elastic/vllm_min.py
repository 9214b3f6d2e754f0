"""Build the smallest vLLM 0.33.0 package the GPU loop imports, for a machine where vLLM cannot be installed.

vLLM's wheel wants torch 2.14 and its kernels (over 64 MiB); importing
``vllm.v1.core.block_pool`` the normal way also pulls ~40 packages (transformers,
openai, fastapi, zmq, …) through ``vllm/__init__.py`` and ``vllm.config``. The GPU loop
(``pool_loop.py``) needs none of them: it runs vLLM's ``BlockPool``,
``FreeKVCacheBlockQueue`` and ``KVCacheBlock`` — pure Python over torch — and the
elastic pool built on them.

So this copies, **byte for byte** from the installed vllm 0.33.0, the modules that code
is (``REAL``), and writes a *placeholder* module for each module they import only for
paths the loop never takes (``PLACEHOLDERS``: KV-cache events, multimodal hashing,
request and config types, metrics, Mamba). Every name a placeholder provides is a
class that cannot be used: calling or instantiating it, or reading an attribute,
raises ``RuntimeError("... not carried to this machine ...")`` (it may only appear in
annotations). The exceptions are one constant used as a default argument and one enum
used as a dataclass default (noted below). So if the loop ever
reached one of those paths, it would fail loudly, not run on a stand-in.

    python tests/vllm_elastic/vllm_min.py DEST        # writes DEST/vllm/... and DEST/MANIFEST.json

Then ``PYTHONPATH=DEST`` makes ``import vllm.v1.core.block_pool`` resolve to it (the
placeholder ``vllm/__init__.py`` does none of the real one's start-up work).
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path

VALIDATED = "0.33.0"

REAL = (
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/kv_cache_interface.py",
    "vllm/v1/kv_cache_layout.py",
    "vllm/v1/kv_cache_spec_registry.py",
    "vllm/utils/math_utils.py",
    "vllm/envs.py",
    "vllm/logger.py",
    "vllm/logging_utils/__init__.py",
    "vllm/logging_utils/formatter.py",
    "vllm/logging_utils/lazy.py",
    "vllm/logging_utils/log_time.py",
    "vllm/logging_utils/torch_tensor.py",
    "vllm/logging_utils/uvicorn_logging.py",
)
"""Copied verbatim: the code the loop runs, and what it imports for real."""

PACKAGES = ("vllm", "vllm/v1", "vllm/v1/core", "vllm/utils", "vllm/distributed", "vllm/multimodal",
            "vllm/v1/attention", "vllm/v1/attention/backends", "vllm/v1/metrics")
"""Packages whose real ``__init__`` does start-up work the loop does not need: empty here."""

PLACEHOLDERS: dict[str, tuple[str, ...]] = {
    # block_pool: KV-cache events (published only with enable_kv_cache_events, off here).
    "vllm.distributed.kv_events": ("AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent"),
    # block_pool / kv_cache_utils: multimodal features in a block (events and mm hashing only).
    "vllm.multimodal.utils": ("get_mm_features_in_window",),
    # kv_cache_utils / block_pool: type annotations; hashing of real Requests (the loop has none).
    "vllm.v1.request": ("Request",),
    "vllm.config": ("VllmConfig",),
    "vllm.v1.utils": ("tensor_data",),
    # kv_cache_utils: the xxhash hash functions, selectable by name (the loop passes its own hashes).
    "vllm.utils.hashing": ("xxhash", "xxhash_cbor"),
    # block_pool: the optional metrics collector (None here).
    "vllm.v1.core.kv_cache_metrics": ("KVCacheMetricsCollector",),
    # kv_cache_interface: spec page sizes (the loop builds no specs).
    "vllm.utils.torch_utils": ("get_dtype_size",),
}
CONSTANTS = {
    # A default argument of BlockPool.__init__ (the medium named in events): vLLM's own value.
    "vllm.distributed.kv_events": {"MEDIUM_GPU": '"GPU"'},
}
ENUMS = {
    # kv_cache_interface: MambaSpec's field default (class definition time); Mamba is not carried.
    "vllm.v1.attention.backends.registry": ("MambaAttentionBackendEnum", ("MAMBA2",)),
}

_NOT_CARRIED = '''
class _NotCarried(type):
    """A name from a vLLM module not carried to this machine: calling it or reading its
    attributes raises; it can only appear in annotations (``X | None``)."""

    def _fail(cls):
        raise RuntimeError(
            f"{cls.__qualname__} is not carried to this machine (tests/vllm_elastic/vllm_min.py): "
            "the code path that needs it is not part of the elastic KV cache's GPU loop"
        )

    def __call__(cls, *args, **kwargs):
        cls._fail()

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls._fail()


def not_carried(qualname):
    return _NotCarried(qualname, (), {"__qualname__": qualname})
'''


def _placeholder(module: str) -> str:
    lines = [
        f'"""Placeholder for {module} (kvpolicy GPU run, see tests/vllm_elastic/vllm_min.py): not vLLM\'s code."""',
        _NOT_CARRIED,
    ]
    for name, value in CONSTANTS.get(module, {}).items():
        lines.append(f"{name} = {value}")
    for name in PLACEHOLDERS.get(module, ()):
        lines.append(f'{name} = not_carried("{module}.{name}")')
    if module in ENUMS:
        name, members = ENUMS[module]
        lines.append("import enum")
        lines.append(f"class {name}(enum.Enum):")
        lines.append('    """Members exist so MambaSpec can be defined; nothing here selects a backend."""')
        lines += [f'    {m} = "{m.lower()} (not carried)"' for m in members]
    return "\n".join(lines) + "\n"


def build(dest: Path) -> dict[str, str]:
    """Write the minimal package under ``dest``; returns {path: sha256 or 'placeholder'}."""
    found = metadata.version("vllm")
    if found != VALIDATED:
        raise SystemExit(f"vllm {found} is installed; the minimal package is built from {VALIDATED}")
    root = Path(metadata.distribution("vllm").locate_file("vllm")).parent
    manifest: dict[str, str] = {}
    for pkg in PACKAGES:
        path = dest / pkg / "__init__.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""Placeholder package {pkg.replace("/", ".")}: its real __init__ is not carried."""\n')
        manifest[f"{pkg}/__init__.py"] = "placeholder"
    for rel in REAL:
        data = (root / rel).read_bytes()
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        manifest[rel] = hashlib.sha256(data).hexdigest()
    for module in sorted({*PLACEHOLDERS, *CONSTANTS, *ENUMS}):
        rel = module.replace(".", "/") + ".py"
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_placeholder(module))
        manifest[rel] = "placeholder"
    (dest / "MANIFEST.json").write_text(json.dumps({"vllm": found, "files": manifest}, indent=1) + "\n")
    return manifest


def verify(dest: Path) -> None:
    """Check that the real files under ``dest`` are vLLM 0.33.0's, byte for byte (on the GPU machine too)."""
    info = json.loads((dest / "MANIFEST.json").read_text())
    for rel, digest in info["files"].items():
        if digest != "placeholder":
            got = hashlib.sha256((dest / rel).read_bytes()).hexdigest()
            assert got == digest, f"{rel} differs from vLLM {info['vllm']}'s"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/vllm_elastic/vllm_min.py DEST")
    files = build(Path(sys.argv[1]))
    print(f"{len(files)} files ({sum(v != 'placeholder' for v in files.values())} vLLM's own) under {sys.argv[1]}")
