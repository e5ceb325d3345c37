"""ONNX Decode Workbench: an instrumented ONNX executor for watching decoder LLMs run.

`import workbench` stays free of the front-end packages (plotly, ipywidgets): those
belong to `workbench.widgets` and the reports.
"""

from . import ops as _ops  # noqa: F401 - registers the kernels
from .decode import DecodeInterfaceError, GenerationResult, Generator, compare
from .errors import (
    AllocationError,
    BackendUnavailableError,
    InputError,
    KernelError,
    MechanismDivergenceError,
    MemoVerifyError,
    ModelLoadError,
    SessionBusyError,
    UnsupportedOperatorError,
    WorkbenchError,
)
from .session import InferenceSession, IOBinding, NodeArg, RunOptions, SessionOptions
from .trace import Recording

__version__ = "0.1.0"

__all__ = [
    "AllocationError",
    "BackendUnavailableError",
    "DecodeInterfaceError",
    "GenerationResult",
    "Generator",
    "IOBinding",
    "InferenceSession",
    "InputError",
    "KernelError",
    "MechanismDivergenceError",
    "MemoVerifyError",
    "ModelLoadError",
    "NodeArg",
    "Recording",
    "SessionBusyError",
    "RunOptions",
    "SessionOptions",
    "UnsupportedOperatorError",
    "WorkbenchError",
    "compare",
]
