"""The one exception hierarchy of the workbench.

Every message names the model value, node, op or input it is about and what was
expected, so a user never has to read a numpy traceback to find the culprit.
"""

from __future__ import annotations


class WorkbenchError(Exception):
    """Root of every error the workbench raises on purpose."""


class ModelLoadError(WorkbenchError):
    """The model could not be read: bad bytes, a missing file, unsafe external data."""


class UnsupportedOperatorError(WorkbenchError):
    """The model uses ops that neither a native kernel nor the fallback covers."""

    def __init__(self, message: str, missing: list[tuple[str, str, int, list[str]]] | None = None):
        super().__init__(message)
        #: (domain, op_type, opset, node names) for every uncovered op
        self.missing = missing or []


class InputError(WorkbenchError):
    """A caller-supplied input is missing, unknown, or of the wrong dtype or shape."""


class KernelError(WorkbenchError):
    """A kernel failed while running a node."""


class AllocationError(WorkbenchError):
    """A value's buffer could not be allocated (a declared or inferred shape too large
    for the machine, often a corrupted or mis-declared dim)."""


class BackendUnavailableError(WorkbenchError):
    """The requested backend (e.g. CUDA) cannot be used on this machine."""


class SessionBusyError(WorkbenchError):
    """A session already runs a decode: it runs one at a time (its buffers, memo, captured
    graphs and Recording belong to one decode); a second would mix the two."""


class MemoVerifyError(WorkbenchError):
    """Verify mode caught the decode-plan memo replaying something a full resolve disagrees with."""


class MechanismDivergenceError(WorkbenchError):
    """Shadow verification found a mechanism (memo replay, cached view plan, captured
    replay, If skipping) serving a value that eager execution disagrees with."""
