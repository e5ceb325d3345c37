"""`RecordingView`: what every view shares -- a Recording, a cursor, lazy rendering."""

from __future__ import annotations

import os
import threading
from typing import Any

import ipywidgets as W

from ..reports import Frames
from .controls import StepControl
from .model import StepCursor
from .table import STYLE

__all__ = ["RecordingView", "as_frames"]


def as_frames(source: Any) -> Frames:
    """A Recording, Frames, or a saved recording's directory -> Frames."""
    if isinstance(source, Frames):
        return source
    if isinstance(source, (str, os.PathLike)):
        from ..trace import Recording

        return Frames(Recording.load(source))
    if hasattr(source, "n_events") and hasattr(source, "steps"):
        return Frames(source)
    rec = getattr(source, "recording", None)
    if rec is not None:  # an InferenceSession (or anything holding one)
        return Frames(rec)
    raise TypeError(f"cannot show {type(source).__name__}: give a Recording, a session with one, or the "
                    "directory a Recording was saved to")


class RecordingView(W.VBox):
    """Base of the views: renders `_render()` whenever the cursor moves (or the Recording
    grew), but only while active -- a hidden tab just remembers that it is stale.

    Standalone (no `cursor` given) a view gets its own step control. `lock` serialises
    rendering with a live decode (see `live.LiveDecode`). With `observe_cursor=False` the
    owner calls `_changed()` when the cursor moved.
    """

    def __init__(self, source: Any, *, cursor: StepCursor | None = None, controls: bool | None = None,
                 lock: threading.RLock | None = None, active: bool = True, observe_cursor: bool = True):
        self.frames = as_frames(source)
        standalone = cursor is None
        self.cursor = cursor if cursor is not None else StepCursor(self.frames)
        self.lock = lock if lock is not None else threading.RLock()
        self.active = active
        self._rendered_key: tuple | None = None
        self.message = W.HTML()
        body = self._build()
        show_controls = standalone if controls is None else controls
        self.controls = StepControl(self.cursor, lock=self.lock) if show_controls else None
        super().__init__([W.HTML(STYLE)] + ([self.controls] if self.controls else []) + [self.message] + body,
                         layout=W.Layout(width="100%", max_width="100%"))
        self.add_class("wb-view")
        if observe_cursor:  # else its owner calls _changed() (DecodeWorkbench: after the step label)
            self.cursor.observe(self._changed, names=["step", "slot", "node", "version"])
        if active:
            self.render()

    # -- for subclasses
    def _build(self) -> list[W.Widget]:
        raise NotImplementedError

    def _render(self) -> None:
        raise NotImplementedError

    # -- machinery
    def _changed(self, _change=None) -> None:
        if self.active:
            self.render()

    def set_active(self, active: bool) -> None:
        self.active = active
        if active:
            self.render()

    def render(self, force: bool = False) -> None:
        c = self.cursor
        key = (c.step, c.slot, c.node, c.version)
        if not force and key == self._rendered_key:
            return
        with self.lock:
            self._rendered_key = key
            if c.step < 0:
                self.message.value = "<i>Nothing recorded yet: run the session (or wait for the decode).</i>"
                return
            self._render()

    def select_node(self, plan_index: Any) -> None:
        try:
            self.cursor.select_node(int(plan_index))
        except (TypeError, ValueError):
            pass
