"""Options of a session: the executor's switches (`SessionOptions`, defined with the
executor) and what one run is (`RunOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..executor.options import SHADOW_MODES, SessionOptions, env_flag

__all__ = ["SHADOW_MODES", "RunOptions", "SessionOptions", "env_flag"]


@dataclass
class RunOptions:
    """Per-run annotations (onnxruntime's RunOptions counterpart): what this run is."""

    #: "prefill" | "decode" | "verify" | "" (unknown)
    phase: str = ""
    #: device-graph slot: "primary" (one-token decode) or "verify" (speculative verify)
    slot: str = "primary"
