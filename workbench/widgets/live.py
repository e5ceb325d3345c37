"""`LiveDecode`: run a Generator on a thread and show each step as soon as it is recorded.

The Generator calls `on_token(id)` for every new token once the step that produced it
is timed and recorded, i.e. between two runs: the views refresh there (outside the
Generator's timed region, so `GenerationResult.step_times` stay honest). The decode
thread holds `lock` while the session runs and releases it only there, so views (which
render under the same lock) never read a Recording in mid-step.

One live decode per session: `claim(session, live)` registers the decode a widget runs;
a new widget on the same session first `stop()`s the previous one -- at that same
between-steps point, so the stopped decode's Recording ends with a whole step and the
new decode gets a Recording of its own (two decodes never mix in one).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DecodeStopped", "LiveDecode", "live_decode_on"]


class DecodeStopped(Exception):  # noqa: N818 - a request, not a failure
    """Raised inside the Generator's `on_token` to end a decode at a step boundary."""


#: session -> the LiveDecode running on it (a widget re-run on the session stops it first)
_RUNNING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RUNNING_LOCK = threading.Lock()


def live_decode_on(session: Any) -> LiveDecode | None:
    """The live decode a widget runs on `session` now (None when there is none)."""
    with _RUNNING_LOCK:
        try:
            live = _RUNNING.get(session)
        except TypeError:  # not weak-referenceable: nothing was registered
            return None
    return live if live is not None and live.running else None


class LiveDecode:
    """Decode `max_new_tokens` after `prompt` on a thread; `on_step(done, finished)` after
    each new token (`done` = tokens so far) and once more at the end (`finished`).
    `stop()` ends it cleanly after the step in progress."""

    def __init__(self, generator: Any, prompt: Sequence[int], max_new_tokens: int,
                 on_step: Callable[[int, bool], None], lock: threading.RLock | None = None,
                 step_delay: float = 0.0, **generate_kwargs: Any):
        self.generator = generator
        self.prompt = list(prompt)
        self.max_new_tokens = max_new_tokens
        self.on_step = on_step
        self.lock = lock if lock is not None else threading.RLock()
        self.step_delay = step_delay
        self._user_on_token = generate_kwargs.pop("on_token", None)
        self.generate_kwargs = dict(generate_kwargs, progress=False)
        self.result: Any = None
        self.error: BaseException | None = None
        self.stopped = False  # ended by stop(), not by reaching max_new_tokens / eos
        self.stop_reason = ""
        self.tokens: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="workbench-live-decode", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    @property
    def sessions(self) -> list[Any]:
        """The workbench sessions this decode runs on (a Generator may have two)."""
        g = self.generator
        return [s for s in (getattr(g, "session", None), getattr(g, "prefill_session", None)) if s is not None]

    def start(self) -> LiveDecode:
        with _RUNNING_LOCK:
            for s in self.sessions:
                try:
                    _RUNNING[s] = self
                except TypeError:
                    pass
        self._thread.start()
        return self

    def stop(self, reason: str = "stopped", timeout: float | None = 30.0) -> bool:
        """Ask the decode to end after the step in progress; wait up to `timeout` s for
        it. Returns whether it has ended."""
        if not self._stop.is_set():
            self.stop_reason = reason
        self._stop.set()
        if self.started and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return not self.running

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the decode ends; re-raises its error; returns the GenerationResult
        (None when it was stopped before its end)."""
        if self.started:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result

    def _on_token(self, token: int) -> None:
        """Between two runs: the step that chose `token` is completely recorded."""
        self.tokens.append(int(token))
        if self._user_on_token is not None:
            self._user_on_token(token)
        self.on_step(len(self.tokens), False)
        self.lock.release()  # let the views in
        try:
            self._stop.wait(self.step_delay)  # a stop() ends the delay at once
        finally:
            self.lock.acquire()
        if self._stop.is_set():
            raise DecodeStopped(self.stop_reason)

    def _main(self) -> None:
        with self.lock:
            try:
                self.result = self.generator.generate(self.prompt, self.max_new_tokens, on_token=self._on_token,
                                                      **self.generate_kwargs)
            except DecodeStopped:
                self.stopped = True
            except BaseException as exc:  # noqa: BLE001 - reported by wait() and the view
                self.error = exc
        with _RUNNING_LOCK:
            for s in self.sessions:
                try:
                    if _RUNNING.get(s) is self:
                        del _RUNNING[s]
                except TypeError:
                    pass
        self.on_step(len(self.tokens), True)
