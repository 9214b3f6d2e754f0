"""Import-only stand-ins for packages SGLang imports but never calls while building pools.

SGLang's import chain reaches ``torchvision`` (the PyPI build is CUDA-only and
fails to import on a CPU machine), and on CUDA ``sgl_kernel`` (hundreds of MB)
and ``IPython.display``. None of their code runs while a KV pool is constructed,
so a module that answers any attribute and any submodule is enough to get past
the imports. ``install()`` appends a finder at the *end* of ``sys.meta_path``: a
real package that is installed and importable always wins; the stand-in only
answers for what is missing. Stand-in modules say so in their ``repr``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

DEFAULT_NAMES = ("torchvision", "sgl_kernel", "IPython")


class _StandInMeta(type):
    """A class that answers any attribute with another stand-in class."""

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __repr__(cls):
        return f"<kvpolicy test stand-in {cls.__qualname__}>"


class StandIn(metaclass=_StandInMeta):
    """Instances, like the classes, answer any attribute, call or subscript."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{type(self).__qualname__}.{name}")

    def __call__(self, *args, **kwargs):
        return self

    def __getitem__(self, item):
        return self

    def __iter__(self):
        return iter(())


def _stand_in_class(qualname: str) -> type:
    cls = _StandInMeta(qualname.rsplit(".", 1)[-1], (StandIn,), {})
    cls.__qualname__ = qualname
    return cls


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stand_in_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return f"<kvpolicy test stand-in module {self.__name__!r}>"


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package: any submodule resolves through this finder
        module.__version__ = "0.0.0+kvpolicy.standin"
        return module

    def exec_module(self, module) -> None:
        pass


def install(names: tuple[str, ...] = DEFAULT_NAMES) -> list[str]:
    """Stand in for those of ``names`` that are not importable; returns the ones stood in for."""
    missing = [n for n in names if not _importable(n)]
    if missing:
        sys.meta_path.append(_StandInFinder(tuple(missing)))
    return missing


def _importable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a broken install (e.g. a CUDA torchvision on a CPU box) counts as missing
        sys.modules.pop(name, None)
        return False
    return True
