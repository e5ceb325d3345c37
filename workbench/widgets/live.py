"""`LiveDecode`: run a Generator on a thread and show each step as soon as it is recorded.

The Generator's loop has no per-step callback, so the decode runs on a shallow copy
of the generator whose session is wrapped: the wrapper calls `on_step()` just before
each run, i.e. when the previous step (and its token) is completely recorded. The
decode thread holds `lock` while the session runs and releases it between runs, so
views (which render under the same lock) never read a Recording in mid-step.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LiveDecode"]


class _SteppingSession:
    """Delegates everything to the real session; calls `before_run` before each run."""

    def __init__(self, session: Any, before_run: Callable[[], None]):
        self._session = session
        self._before_run = before_run

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def run(self, *args, **kwargs):
        self._before_run()
        return self._session.run(*args, **kwargs)

    def run_with_iobinding(self, *args, **kwargs):
        self._before_run()
        return self._session.run_with_iobinding(*args, **kwargs)


class LiveDecode:
    """Decode `max_new_tokens` after `prompt` on a thread; `on_step(done)` after each step
    (`done` = tokens generated so far) and once more at the end."""

    def __init__(self, generator: Any, prompt: Sequence[int], max_new_tokens: int,
                 on_step: Callable[[int], None], lock: threading.RLock | None = None,
                 step_delay: float = 0.0, **generate_kwargs: Any):
        self.generator = generator
        self.prompt = list(prompt)
        self.max_new_tokens = max_new_tokens
        self.on_step = on_step
        self.lock = lock if lock is not None else threading.RLock()
        self.step_delay = step_delay
        self.generate_kwargs = dict(generate_kwargs, progress=False)
        self.result: Any = None
        self.error: BaseException | None = None
        self._runs = 0
        self._thread = threading.Thread(target=self._main, name="workbench-live-decode", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> LiveDecode:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the decode ends; re-raises its error; returns the GenerationResult."""
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result

    def _between_runs(self) -> None:
        if self._runs:
            self.on_step(self._runs)
        self._runs += 1
        self.lock.release()  # let the views in between steps
        try:
            if self.step_delay:
                time.sleep(self.step_delay)
            else:
                time.sleep(0)
        finally:
            self.lock.acquire()

    def _main(self) -> None:
        gen = copy.copy(self.generator)
        gen.session = _SteppingSession(self.generator.session, self._between_runs)
        with self.lock:
            try:
                self.result = gen.generate(self.prompt, self.max_new_tokens, **self.generate_kwargs)
            except BaseException as exc:  # noqa: BLE001 - reported by wait() and the view
                self.error = exc
        self.on_step(len(self.result.tokens) if self.result is not None else self._runs)
