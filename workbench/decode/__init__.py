"""Generator: greedy decode loop with KV cache management."""

from .generator import GenerationResult, Generator
from .interface import DecodeInterface, DecodeInterfaceError, discover

__all__ = ["DecodeInterface", "DecodeInterfaceError", "GenerationResult", "Generator", "discover"]
