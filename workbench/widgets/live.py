"""`LiveDecode`: run a Generator on a thread and show each step as soon as it is recorded.

The Generator calls `on_token(id)` for every new token once the step that produced it
is timed and recorded, i.e. between two runs: the views refresh there (outside the
Generator's timed region, so `GenerationResult.step_times` stay honest). The decode
thread holds `lock` while the session runs and releases it only there, so views (which
render under the same lock) never read a Recording in mid-step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LiveDecode"]


class LiveDecode:
    """Decode `max_new_tokens` after `prompt` on a thread; `on_step(done, finished)` after
    each new token (`done` = tokens so far) and once more at the end (`finished`)."""

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
        self.tokens: list[int] = []
        self._thread = threading.Thread(target=self._main, name="workbench-live-decode", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> LiveDecode:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the decode ends; re-raises its error; returns the GenerationResult."""
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
            time.sleep(self.step_delay)
        finally:
            self.lock.acquire()

    def _main(self) -> None:
        with self.lock:
            try:
                self.result = self.generator.generate(self.prompt, self.max_new_tokens, on_token=self._on_token,
                                                      **self.generate_kwargs)
            except BaseException as exc:  # noqa: BLE001 - reported by wait() and the view
                self.error = exc
        self.on_step(len(self.tokens), True)
