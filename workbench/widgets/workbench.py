"""`DecodeWorkbench`: every view in tabs, one step control, tokens, node selection."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W

from ..errors import SessionBusyError, WorkbenchError
from ..reports import Frames, summary
from .base import as_frames
from .controls import StepControl
from .diagnostics_view import DiagnosticsView
from .liveness_view import LivenessView
from .memo_timeline import MemoTimeline
from .model import PlanModel, StepCursor, find, token_strip
from .model.glance import summary_frame
from .model.tokens import SYNTHETIC_IDS, is_builtin_model, piece_of
from .plan_view import PlanView
from .segmentation_view import SegmentationView
from .step_html import StepHTML
from .table import STYLE, frame_html
from .view_alias_view import ViewAliasView

__all__ = ["DecodeWorkbench"]

#: the tallest a figure is inside the workbench (a laptop screen shows it with the header)
FIGURE_HEIGHT = 400

TABS = ("Plan", "Segmentation", "Memo & capture", "Views & aliases", "Liveness", "Summary", "Diagnostics")

# JupyterLab's theme variables (light and dark themes), with light fallbacks elsewhere
_TOKEN_STYLE = {"prompt": "color:var(--jp-ui-font-color2,#777)", "before": "",
                "current": "background:var(--jp-warn-color0,#ffd54f);color:var(--jp-ui-inverse-font-color0,#000);"
                           "font-weight:700",
                "after": "color:var(--jp-ui-font-color3,#bbb)"}


class DecodeWorkbench(W.VBox):
    """All the views in tabs, driven by one step control and one node selection.

    `DecodeWorkbench(recording)` (or a saved recording's directory) replays what was
    recorded. `DecodeWorkbench(generator, prompt, max_new_tokens=16)` decodes live on a
    thread into a fresh Recording of its own (the session's earlier one is kept intact
    and replaced as `session.recording`: re-running the cell shows one decode, never the
    previous one's steps before it); the widget is shown at once and each step appears
    as soon as it is recorded, at most every
    `refresh_interval` seconds (the last step always shows; `wait()` blocks until done;
    `step_delay` seconds between steps make it watchable).

    Tokens show as text when a `tokenizer` is given (anything with `decode(ids)`, e.g.
    `GGUFTokenizer` or the one `models.smollm2()` returns; hover a token for its id);
    a built-in model's ids are said to be synthetic. `decode_text(ids) -> str` shows the
    text of the tokens so far (default: the tokenizer's decode).

    The search box takes a node or value name (any part of it): every tab jumps to the
    node (a value's producer, or its first reader). The Diagnostics tab runs the
    reports' diagnostic calls at the selected step, one click each; `compare` (another
    Recording or its directory) makes its "diff" compare the two recordings.
    """

    def __init__(self, source: Any, prompt: Sequence[int] | None = None, max_new_tokens: int = 16, *,
                 decode_text: Callable[[list[int]], str] | None = None, tokenizer: Any = None,
                 step_delay: float = 0.0,
                 refresh_interval: float = 0.25, start: bool = True, compare: Any = None,
                 **generate_kwargs: Any):
        self.lock = threading.RLock()
        self.live = None
        self.refresh_interval = refresh_interval
        self._last_refresh = 0.0
        self.prompt = list(prompt) if prompt is not None else None
        self.decode_text = decode_text
        self.tokenizer = tokenizer
        generator = _as_generator(source) if prompt is not None else None
        self.synthetic_ids = tokenizer is None and decode_text is None and is_builtin_model(
            generator.session if generator is not None else getattr(source, "session", source))
        #: why this widget could not decode (another decode holds the session), else ""
        self.busy = take_sessions(generator) if generator is not None else ""
        if self.busy:
            self.frames = None
            self.message = W.HTML(f"<div class='wb-busy' style='padding:6px 10px;border-left:3px solid "
                                  f"var(--jp-warn-color0,#ff7f0e)'>{html.escape(self.busy)}</div>")
            super().__init__([W.HTML("<b>Decode workbench</b>"), self.message])
            self.add_class("wb-workbench")
            return
        if generator is not None:
            if getattr(generator.session, "recording", None) is None:
                raise WorkbenchError("the generator's session records nothing (SessionOptions(trace=False)): "
                                     "create it with trace=True to watch it decode")
            self.frames = Frames(fresh_recording(generator.session))
            record_prompt(self.frames.recording, self.prompt)
        else:
            self.frames = as_frames(source)
            if self.prompt is None:  # a saved live decode keeps its prompt
                self.prompt = prompt_of(self.frames.recording)
        self.cursor = StepCursor(self.frames, follow=generator is not None)
        self.controls = StepControl(self.cursor, lock=self.lock,
                                    token_text=(lambda t: piece_of(tokenizer, t)) if tokenizer is not None else None)
        self.node_pick = W.Dropdown(options=[("(no node selected)", -1)] + PlanModel(self.frames).options(),
                                    value=-1, description="node", layout=W.Layout(width="420px", max_width="45%"))
        self.node_pick.add_class("wb-node-pick")
        self.progress = W.IntProgress(min=0, max=max_new_tokens, description="decode",
                                      layout=W.Layout(width="260px", display="none" if generator is None else None))
        self.tokens = StepHTML()  # its highlight shown together with the plot of its step
        self.tokens.add_class("wb-tokens")
        # the views render when _cursor_changed says so: after the step label (the control's
        # own observer, registered first) and the tokens, so those messages leave before the
        # plot's and the page shows the three together (see step_html)
        kw = {"cursor": self.cursor, "controls": False, "lock": self.lock, "observe_cursor": False}
        self.views = [cls(self.frames, active=i == 0, **kw) for i, cls in enumerate(
            (PlanView, SegmentationView, MemoTimeline, ViewAliasView, LivenessView))]
        self.summary = W.HTML(layout=W.Layout(width="100%"))
        self.summary.add_class("wb-summary")
        self.diagnostics = DiagnosticsView(self.frames, compare=compare, active=False, **kw)
        self.search = W.Text(placeholder="find a node or value by name", continuous_update=False,
                             layout=W.Layout(width="260px"))
        self.search.add_class("wb-search")
        self.search_hits = W.Dropdown(options=[], layout=W.Layout(width="420px", display="none"))
        self.search_label = W.HTML()
        self.search_label.add_class("wb-search-label")
        self.tabs = W.Tab(children=[*self.views, self.summary, self.diagnostics])
        for i, name in enumerate(TABS):
            self.tabs.set_title(i, name)
        self.tabs.observe(self._tab_changed, names="selected_index")
        self.tabs.selected_index = 0
        self._tab_changed()
        title = W.HTML(f"{STYLE}<b>Decode workbench</b> · {len(self.frames.get('nodes'))} plan nodes")
        # "why is my decode slow": one click to the seams that cost the most
        self.why_slow = W.Button(description="why slow?", icon="search",
                                 tooltip="Diagnostics: which eager seams cost the most time per token, and why "
                                         "each one is not captured", layout=W.Layout(width="auto"))
        self.why_slow.add_class("wb-why-slow")
        self.why_slow.on_click(lambda _b: self.show_diagnostic("seam costs"))
        # when the live decode started (the kernel's epoch ms), in the DOM for a browser to time
        # its first plot and steps against; empty when the widget replays a recording
        self.clock = W.HTML(layout=W.Layout(display="none"))
        self.clock.add_class("wb-live-clock")
        # a laptop screen (1366x768): the header takes ~5 rows, so a tab's plot is on screen
        # with it; figures at most FIGURE_HEIGHT px, the plan table a page of 12 rows
        for holder in _holders([*self.views, self.diagnostics]):
            holder.max_height = min(holder.max_height or FIGURE_HEIGHT, FIGURE_HEIGHT)
        self.views[0].table.size = 12
        wrap = W.Layout(flex_flow="row wrap", width="100%", align_items="center")
        super().__init__([W.HBox([title, self.progress], layout=wrap), self.clock, self.tokens, self.controls,
                          W.HBox([self.node_pick, self.search, self.search_hits, self.why_slow, self.search_label],
                                 layout=wrap), self.tabs],
                         layout=W.Layout(width="100%", max_width="100%"))
        self.add_class("wb-workbench")
        self.node_pick.observe(self._node_picked, names="value")
        self.search.observe(lambda c: self.find(c["new"]), names="value")
        self.search_hits.observe(self._hit_picked, names="value")
        self.cursor.observe(self._cursor_changed, names=["step", "slot", "node", "version"])
        self._cursor_changed()
        if generator is not None:
            # made now, empty: the browser loads plotly while the first step runs, and the first
            # step's plan is drawn into a figure that is already there
            self.views[0].figure.ensure()
            from .live import LiveDecode

            self.live = LiveDecode(generator, self.prompt, max_new_tokens, self._on_live_step, self.lock,
                                   step_delay, **generate_kwargs)
            if start:
                self.start()

    # -- live decode
    def _on_live_step(self, done: int, finished: bool) -> None:
        with self.lock:
            self.progress.value = done
            if finished:
                self.progress.bar_style = ("danger" if self.live.error is not None else
                                           "warning" if self.live.stopped else "success")
            elif time.monotonic() - self._last_refresh < self.refresh_interval:
                return  # a fast decode: do not redraw every view for every token
            self.cursor.refresh()
            self._cursor_changed()
            self._last_refresh = time.monotonic()

    def start(self) -> DecodeWorkbench:
        if self.live is not None and not self.live.started:
            self.live.start()
            self.clock.value = f"<span data-started-ms='{time.time() * 1e3:.0f}'></span>"
        return self

    def wait(self, timeout: float | None = None):
        """Block until a live decode ends (re-raising its error); returns its GenerationResult
        (None when it was stopped, or never ran because the session was busy)."""
        return None if self.live is None else self.live.wait(timeout)

    def stop(self, timeout: float | None = 30.0) -> bool:
        """End a live decode after the step in progress (its Recording keeps every whole step)."""
        return True if self.live is None else self.live.stop("stopped by DecodeWorkbench.stop()", timeout)

    def show_diagnostic(self, call: str) -> None:
        """Open the Diagnostics tab on `call` ("seam costs", "coverage", ...)."""
        self.diagnostics.show(call)
        self.tabs.selected_index = len(self.views) + 1

    # -- selection
    def _tab_changed(self, _change=None) -> None:
        idx = self.tabs.selected_index
        for i, v in enumerate(self.views):
            v.active = i == idx
        self.diagnostics.active = idx == len(self.views) + 1
        if idx is not None and idx < len(self.views):
            self.views[idx].set_active(True)
        elif idx == len(self.views):
            self._render_summary()
        elif idx == len(self.views) + 1:
            self.diagnostics.set_active(True)

    # -- search
    def find(self, query: str) -> list[tuple[str, str, int]]:
        """Jump every tab to the first node or value whose name contains `query`; the
        other matches go in the dropdown beside the box. Returns (kind, name, plan index)."""
        with self.lock:
            hits = find(self.frames, query or "")
            found = [(k, n, int(p)) for k, n, p in zip(hits["kind"], hits["name"], hits["plan_index"])]
            self._searching = True
            try:
                self.search_hits.options = [(f"{k} {n} — {d}", i) for i, ((k, n, _), d) in
                                            enumerate(zip(found, hits["detail"]))]
                self.search_hits.layout.display = None if len(found) > 1 else "none"
                self.search_hits.value = 0 if found else None
            finally:
                self._searching = False
            self._found = found
            if not query:
                self.search_label.value = ""
            elif not found:
                self.search_label.value = f"<i>no node or value named like {html.escape(query)!s}</i>"
            else:
                self._jump(0)
            return found

    def _jump(self, i: int) -> None:
        kind, name, p = self._found[i]
        more = f" ({len(self._found)} matches)" if len(self._found) > 1 else ""
        if p < 0:
            self.search_label.value = f"{html.escape(kind)} <code>{html.escape(name)}</code>: no node uses it{more}"
            return
        self.search_label.value = f"→ #{p} for {html.escape(kind)} <code>{html.escape(name)}</code>{more}"
        self.cursor.select_node(p)

    def _hit_picked(self, change) -> None:
        if not getattr(self, "_searching", False) and change["new"] is not None:
            with self.lock:
                self._jump(int(change["new"]))

    def _node_picked(self, change) -> None:
        with self.lock:
            if change["new"] is not None and change["new"] != self.cursor.node:
                self.cursor.select_node(change["new"])

    def _cursor_changed(self, _change=None) -> None:
        with self.lock:
            if self.node_pick.value != self.cursor.node:
                self.node_pick.value = self.cursor.node
            strip = token_strip(self.frames, self.cursor.step, self.prompt, self.decode_text, self.tokenizer)
            live = self.live
            stopped = (f"stopped after {len(live.tokens)} tokens: {live.stop_reason}"
                       if live is not None and live.stopped else "")
            self.tokens.show(tokens_html(strip, self.synthetic_ids, None if live is None else live.error,
                                         stopped), self.cursor.step)
            if self.tabs.selected_index == len(self.views):
                self._render_summary()
            for view in (*self.views, self.diagnostics):  # each renders only while shown
                view._changed()

    def _render_summary(self) -> None:
        self.summary.value = summary_html(summary_frame(self.frames, summary(self.frames)))

    # -- shortcuts
    @property
    def recording(self):
        return self.frames.recording

    def select_step(self, step: int) -> None:
        with self.lock:
            self.cursor.follow = False
            self.cursor.go(step)

    def select_node(self, plan_index: int) -> None:
        with self.lock:
            self.cursor.select_node(plan_index)


def _holders(views) -> list:
    from .figure import FigureHolder

    return [w for v in views for w in vars(v).values() if isinstance(w, FigureHolder)]


def summary_html(df) -> str:
    """The Summary tab: one small table per section, flowing into as many columns as fit
    (one long table was the tallest tab: ~1,400 px at 1366x768)."""
    parts = []
    for section, rows in df.groupby("section", sort=False):
        parts.append(f"<div style='break-inside:avoid;margin-bottom:8px'><b>{html.escape(str(section))}</b>"
                     f"{frame_html(rows[['metric', 'text']].reset_index(drop=True), wrap=['metric', 'text'])}"
                     "</div>")
    return f"<div class='wb-summary-sections' style='columns:2 420px;column-gap:16px'>{''.join(parts)}</div>"


def tokens_html(strip: dict, synthetic: bool = False, error: BaseException | None = None,
                stopped: str = "") -> str:
    """The tokens panel: each token as text when known (its id on hover), else its id."""
    e = html.escape
    spans = []
    for (tok, kind), piece in zip(strip["items"], strip["pieces"]):
        if piece is None:
            spans.append(f"<span class='wb-tok wb-tok-{kind}' style='{_TOKEN_STYLE[kind]}'>{tok}</span>")
        else:
            shown = e(piece).replace(" ", "&nbsp;").replace("\n", "↵") or "∅"
            spans.append(f"<span class='wb-tok wb-tok-{kind}' title='id {tok}' style='{_TOKEN_STYLE[kind]};"
                         "border:1px solid var(--jp-border-color2,#ddd);"
                         f"border-radius:3px;padding:0 2px;margin-right:1px'>{shown}</span>")
    has_text = any(p is not None for p in strip["pieces"])
    head = "tokens" if has_text else "token ids"
    note = (f"<div class='wb-token-note' style='color:var(--jp-ui-font-color2,#777);font-size:11px'>"
            f"{e(SYNTHETIC_IDS)}</div>"
            if synthetic and not has_text else "")
    text = f"<div><i>{e(strip['text'])}</i></div>" if strip["text"] is not None else ""
    if error is not None:
        text += f"<div style='color:var(--jp-error-color1,#d62728)'>decode failed: {e(str(error))}</div>"
    if stopped:
        text += f"<div class='wb-stopped' style='color:var(--jp-warn-color1,#e65100)'>{e(stopped)}</div>"
    sep = "" if has_text else " "
    return (f"<div style='font-family:var(--jp-code-font-family,monospace);overflow-wrap:anywhere'>{head}: "
            f"{sep.join(spans) or '—'}</div>{note}{text}")


def take_sessions(generator: Any, timeout: float = 30.0) -> str:
    """Make `generator`'s sessions free for a new live decode: a live decode a widget
    still runs on one of them is stopped first (after its step in progress). Returns ""
    when the sessions are free, else why not (another decode holds one)."""
    from .live import live_decode_on

    sessions = [s for s in (getattr(generator, "session", None), getattr(generator, "prefill_session", None))
                if s is not None]
    for s in sessions:
        previous = live_decode_on(s)
        if previous is not None and not previous.stop("a new DecodeWorkbench on this session took over", timeout):
            return (f"This session is busy: the decode of an earlier DecodeWorkbench did not stop within {timeout:g} s. "
                    "Wait for it (wb.wait()), or give this decode a session of its own.")
    for s in sessions:
        if not hasattr(s, "decoding"):
            continue
        try:
            with s.decoding("a DecodeWorkbench checking that the session is free"):
                pass
        except SessionBusyError as error:
            return f"This session is busy, so nothing was decoded: {error}"
    return ""


#: the generic table a live decode's prompt is kept in (saved and loaded with the Recording)
PROMPT_TABLE = "prompt"


def record_prompt(recording: Any, prompt: Sequence[int] | None) -> None:
    """Keep the prompt in the Recording (step -1: before any step), so a saved live decode
    shows its prompt when it is loaded again."""
    if recording is None or not prompt or not hasattr(recording, "add_row"):
        return
    for position, token in enumerate(prompt):
        recording.add_row(PROMPT_TABLE, step=-1, token=int(token), position=position)


def prompt_of(recording: Any) -> list[int] | None:
    """The prompt `record_prompt` kept in `recording` (None when it holds none)."""
    if recording is None or PROMPT_TABLE not in getattr(recording, "tables", []):
        return None
    t = recording.table(PROMPT_TABLE)
    return [int(x) for x in t.sort_values("position")["token"]] if len(t) else None


def fresh_recording(session: Any):
    """The Recording the next run of `session` records into: a new one when the current
    one already holds steps (`InferenceSession.new_recording`), so each decode is its own
    run; the old Recording is left untouched for whoever holds it."""
    old = session.recording
    if old is None or len(old) == 0 or not hasattr(session, "new_recording"):
        return old
    return session.new_recording()


def _as_generator(source: Any):
    """A Generator for live decoding (an InferenceSession gets one)."""
    from ..decode import Generator

    if isinstance(source, Generator) or hasattr(source, "generate"):
        return source
    if hasattr(source, "run") and hasattr(source, "recording"):
        return Generator(source)
    raise TypeError(f"live decoding needs a Generator or an InferenceSession, got {type(source).__name__}")
