"""`Frames`: a Recording's pandas frames, built once and rebuilt only when it grew.

Widgets re-render on every step change and a live Recording grows while a
Generator runs, so every frame is cached against the Recording's event count.
Tables that only some recordings have (capture segmentation, the decode-plan memo)
come back as None from `optional()` when they were not recorded: callers say so
plainly instead of drawing empty or made-up data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from ..trace import Recording
    from ..trace.memory_planner import MemoryPlan

__all__ = ["FRAME_NAMES", "MEMORY_NOT_RECORDED", "NOT_RECORDED", "OPTIONAL_TABLES", "Frames", "as_frames"]

#: what a view says when the recording lacks the data it draws
NOT_RECORDED = "not recorded in this recording"
#: what a memory view says (liveness, views, aliases, buffer events, io_buffers) when the
#: session traced without them: empty tables there mean "not recorded", not "none happened"
MEMORY_NOT_RECORDED = ("not recorded: the session traced without its memory tables "
                       "(SessionOptions(trace_memory=False))")

#: frames every Recording has: name -> Recording method
FRAME_NAMES: dict[str, str] = {
    "steps": "steps", "nodes": "nodes", "values": "values", "views": "views",
    "liveness": "liveness_frame", "buffer_events": "buffer_events", "node_timings": "node_timings",
    "aliases": "aliases", "materializations": "materializations",
}

#: frames only some recordings have: name -> the generic table that must exist
OPTIONAL_TABLES: dict[str, str] = {
    "memo_timeline": "memo",
    "segments": "capture_segments",
    "capture_declines": "capture_declines",
    "capture_events": "capture_events",
    "tokens": "tokens",
    "divergences": "divergences",
    "shadow_checks": "shadow",
    "io_buffers": "io_buffers",
    "rewrites": "rewrites",
    "peer": "peer",  # a peer runtime's latency, measured the same way (workbench report / demo)
    "peer_profile": "peer_profile",  # the peer's own per-node profile (reports.peer_profile)
    "branch_capture": "branch_capture",  # what an If branch run as a graph of its own replayed
}


class Frames:
    """Cached frames of one Recording (see the module docstring)."""

    def __init__(self, recording: Recording):
        self.recording = recording
        self._cache: dict[Any, Any] = {}
        self._version: tuple[int, int] | None = None

    def _fresh(self) -> dict:
        version = (self.recording.n_events, len(self.recording))
        if version != self._version:
            self._cache.clear()
            self._version = version
        return self._cache

    @property
    def version(self) -> tuple[int, int]:
        """(events, steps): changes whenever the Recording grew."""
        self._fresh()
        return self._version  # type: ignore[return-value]

    def get(self, name: str) -> pd.DataFrame:
        """A frame every Recording has (`FRAME_NAMES`)."""
        cache = self._fresh()
        if name not in cache:
            if name not in FRAME_NAMES:
                raise KeyError(f"unknown frame {name!r}; known: {sorted(FRAME_NAMES)} "
                               f"and optional {sorted(OPTIONAL_TABLES)}")
            cache[name] = getattr(self.recording, FRAME_NAMES[name])()
        return cache[name]

    def optional(self, name: str) -> pd.DataFrame | None:
        """A frame only some recordings have, or None when this one did not record it."""
        cache = self._fresh()
        key = ("optional", name)
        if key not in cache:
            cache[key] = _optional(self.recording, name)
        return cache[key]

    @property
    def memory(self) -> bool:
        """Whether the recording kept the memory tables (`Recording.memory`)."""
        return self.recording.memory

    def has(self, name: str) -> bool:
        return self.optional(name) is not None if name in OPTIONAL_TABLES else name in FRAME_NAMES

    def memory_plan(self, step: int) -> MemoryPlan | None:
        """The activation-memory planner's layout for one step (None without liveness rows)."""
        cache = self._fresh()
        key = ("memory_plan", step)
        if key not in cache:
            live = self.get("liveness")
            cache[key] = (self.recording.memory_plan(step, heuristics=None)
                          if bool((live["step"] == step).any()) else None)
        return cache[key]

    def memo(self, key: Any, build) -> Any:
        """Cache any derived value until the Recording grows: `build()` runs once per version."""
        cache = self._fresh()
        k = ("derived", key)
        if k not in cache:
            cache[k] = build()
        return cache[k]


def _optional(rec: Recording, name: str) -> pd.DataFrame | None:
    if name not in OPTIONAL_TABLES:
        raise KeyError(f"unknown optional frame {name!r}; known: {sorted(OPTIONAL_TABLES)}")
    if OPTIONAL_TABLES[name] not in rec.tables:
        return None
    method = getattr(rec, name, None)
    if callable(method):
        return method()
    return rec.table(OPTIONAL_TABLES[name])


def as_frames(x: Recording | Frames) -> Frames:
    return x if isinstance(x, Frames) else Frames(x)
