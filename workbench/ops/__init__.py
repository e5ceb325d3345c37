"""Kernels, one module per op family. Importing this package registers them all."""

import importlib

from . import registry

# One module per op family; each registers its kernels on import.
KERNEL_MODULES = (
    "elementwise", "compare", "cast", "generators",
    "layout", "indexing",
    "reduce", "linalg", "softmax", "normalization",
    "control_flow", "legacy",
    "contrib", "contrib_gather_quant", "fused_attention",
    "quantize",
)

for _name in KERNEL_MODULES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _e:  # a family not written yet
        if _e.name != f"{__name__}.{_name}":
            raise

__all__ = ["registry", "KERNEL_MODULES"]
