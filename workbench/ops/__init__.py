"""Kernels, one module per op family. Importing this package registers them all."""

import importlib
import pkgutil

from . import registry

_SKIP = {"registry", "fallback"}

for _mod in pkgutil.iter_modules(__path__):
    if _mod.name not in _SKIP and not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["registry"]
