"""Typed trace events and the Recording (columnar, saveable, loadable without a model).

The executor emits into a `Recording` (cheap appends to per-column lists); reports
and widgets read it back as pandas frames (`rec.steps()`, `rec.views()`,
`rec.liveness()`, `rec.memory_summary()`, ...) or as typed events
(`rec.events()`), and `rec.save(dir)` / `Recording.load(dir)` move it between
machines as parquet + JSON. pandas and pyarrow are imported only when reading or
saving, never when emitting. A lean recording (`Recording(memory=False)`, what
`SessionOptions(trace_memory=False)` gives) keeps no memory tables (liveness,
io_buffers, views, buffer events, aliases, materializations); `rec.memory` tells a
reader "not recorded" from "none happened".
"""

from .events import (
    BufferEvent,
    Event,
    InPlaceAlias,
    LivenessRow,
    Materialized,
    NodeExecuted,
    StepBegan,
    StepEnded,
    TableRow,
    ViewCreated,
)
from .recording import Recording, TraceError

__all__ = [
    "BufferEvent",
    "Event",
    "InPlaceAlias",
    "LivenessRow",
    "Materialized",
    "NodeExecuted",
    "Recording",
    "StepBegan",
    "StepEnded",
    "TableRow",
    "TraceError",
    "ViewCreated",
]
