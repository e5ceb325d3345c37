"""Generator: greedy decode loop with KV cache management."""

from .compare import compare
from .generator import GenerationResult, Generator
from .interface import DecodeInterface, DecodeInterfaceError, ExportFiles, check, discover, find_export

__all__ = ["DecodeInterface", "DecodeInterfaceError", "ExportFiles", "GenerationResult", "Generator", "check",
           "compare", "discover", "find_export"]
