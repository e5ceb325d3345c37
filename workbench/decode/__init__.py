"""Generator: greedy decode loop with KV cache management."""

from .compare import compare
from .generator import GenerationResult, Generator
from .interface import DecodeInterface, DecodeInterfaceError, discover

__all__ = ["DecodeInterface", "DecodeInterfaceError", "GenerationResult", "Generator", "compare", "discover"]
