"""`StepControl`: previous / play / slider / next over recorded steps, and the slot."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable

import ipywidgets as W

from ..reports import step_info
from ..reports.units import fmt_ms
from .model import StepCursor
from .step_html import StepHTML

__all__ = ["StepControl"]


class StepControl(W.HBox):
    """Drives a `StepCursor`: the slider runs over the slot's recorded steps (its value is
    the position in that list); the label names the step, its phase, time and memo action."""

    def __init__(self, cursor: StepCursor, interval_ms: int = 900, lock: threading.RLock | None = None,
                 token_text: Callable[[int], str | None] | None = None):
        self.cursor = cursor
        self.token_text = token_text
        self.lock = lock if lock is not None else threading.RLock()
        self._syncing = False
        self.prev_btn = W.Button(description="◀", tooltip="previous step", layout=W.Layout(width="40px"))
        self.next_btn = W.Button(description="▶", tooltip="next step", layout=W.Layout(width="40px"))
        self.play = W.Play(interval=interval_ms, min=0, max=0, step=1, description="play", repeat=False,
                           tooltip="play / pause / stop / repeat: step through the recorded steps")
        self.slider = W.IntSlider(min=0, max=0, description="step", readout=False, continuous_update=False,
                                  layout=W.Layout(width="320px", max_width="30%"))
        self.slot = W.Dropdown(options=cursor.slots, value=cursor.slot, description="slot",
                               layout=W.Layout(width="170px"))
        self.label = StepHTML()  # shown together with the plot of its step
        for w, cls in ((self.prev_btn, "wb-prev"), (self.next_btn, "wb-next"), (self.play, "wb-play"),
                       (self.slider, "wb-slider"), (self.slot, "wb-slot"), (self.label, "wb-step-label")):
            w.add_class(cls)
        W.jslink((self.play, "value"), (self.slider, "value"))
        self.prev_btn.on_click(lambda _b: self._user(cursor.prev))
        self.next_btn.on_click(lambda _b: self._user(cursor.next))
        self.slider.observe(self._slider_moved, names="value")
        self.slot.observe(lambda c: self._user(lambda: cursor.set_slot(c["new"])), names="value")
        cursor.observe(self._sync, names=["step", "slot", "version"])
        super().__init__([self.prev_btn, self.play, self.slider, self.next_btn, self.slot, self.label],
                         layout=W.Layout(flex_flow="row wrap", width="100%"))
        self.add_class("wb-step-control")
        self._sync()

    def _user(self, action) -> None:
        if self._syncing:
            return
        with self.lock:  # never read a live Recording while a step is being written
            self.cursor.follow = False  # the user took the wheel: stop following a live decode
            action()

    def _slider_moved(self, change) -> None:
        if not self._syncing:
            self._user(lambda: self.cursor.go_position(change["new"]))

    def _sync(self, _change=None) -> None:
        c = self.cursor
        with self.lock:
            self._syncing = True
            try:
                self._update(c)
            finally:
                self._syncing = False

    def _update(self, c: StepCursor) -> None:
        n = len(c.steps)
        if list(self.slot.options) != c.slots:
            self.slot.options = c.slots
        self.slot.value = c.slot
        self.slider.max = self.play.max = max(n - 1, 0)
        self.slider.value = max(c.position, 0)
        self.prev_btn.disabled = c.position <= 0
        self.next_btn.disabled = c.position >= n - 1
        self.label.show(self._describe(n), c.step)

    def _describe(self, n: int) -> str:
        c = self.cursor
        if c.step < 0:
            return "<i>no step recorded yet</i>"
        info = step_info(c.frames, c.step)
        memo = f" · memo {html.escape(str(info['memo_action']))}" if info.get("memo_action") else ""
        tok = ""
        if info.get("token") is not None:
            piece = self.token_text(int(info["token"])) if self.token_text is not None else None
            tok = f" · token {info['token']}" + (f" {html.escape(repr(piece))}" if piece is not None else "")
        return (f"<b>step {c.step}</b> ({c.position + 1}/{n}) · {html.escape(str(info.get('phase') or 'run'))}"
                f" · {fmt_ms(info.get('wall_ms'))}{memo}{tok}")
