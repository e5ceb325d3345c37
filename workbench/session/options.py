"""SessionOptions: every switch of the executor, mirrored by WORKBENCH_* variables."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SessionOptions:
    """Options for an InferenceSession (later mechanisms add fields here)."""

    #: keep a trace of what the executor did (see workbench.trace)
    trace: bool = True
