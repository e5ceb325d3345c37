"""plotly's widget code, sent to the browser once per kernel and evaluated once per page.

A plain `plotly.graph_objects.FigureWidget` is an anywidget whose module is plotly's
whole widget bundle (plotly.js inside: ~5 MB of JavaScript) as a string in its state.
anywidget imports it from a fresh blob URL for every figure, so the browser received and
evaluated all of plotly.js again for each plot: in JupyterLab on a 2-core machine, ~2 s
before a figure (and the box around it) drew -- a live decode's first plot came seconds
after its first step.

Here the bundle travels once, in one hidden `PlotlyCode` widget per kernel; its
front-end starts importing it the moment the widget exists (`preload()`, called when the
views are imported in a kernel: the browser evaluates plotly while the next cells run).
`Figure` is a FigureWidget whose module is a few lines that take plotly's widget from
that one import (keyed by plotly's version and the bundle's hash, so a page that outlives
a kernel never mixes two plotly versions) and hand it the model: the Python side and
the messages are plotly's own.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path

import anywidget
import ipywidgets as W
import plotly
import plotly.graph_objects as go
import traitlets

__all__ = ["Figure", "PlotlyCode", "code_widget", "preload"]

_BUNDLE = Path(plotly.__file__).parent / "package_data" / "widgetbundle.js"

#: shared by both modules: the one import of plotly's widget bundle on this page
_LOAD = """
const load = (code) => {
  const key = "__workbench_plotly_widget:" + code.get("key");
  if (!globalThis[key]) {
    const url = URL.createObjectURL(new Blob([code.get("source")], {type: "text/javascript"}));
    globalThis[key] = import(/* webpackIgnore: true */ url).finally(() => URL.revokeObjectURL(url));
    globalThis[key].catch(() => { delete globalThis[key]; });
  }
  return globalThis[key];
};
"""

_CODE_ESM = _LOAD + """
export default { initialize({ model }) { load(model); } };
"""

_FIGURE_ESM = _LOAD + """
const codeOf = async (model) => {
  const ref = String(model.get("_wb_code") || "");
  return model.widget_manager.get_model(ref.replace(/^IPY_MODEL_/, ""));
};
// plotly's view listens on the model for good: once its output is gone (a re-run cell),
// an update still in flight redraws a purged plot and throws; with no view left, drop that
const guarded = (model, views) => new Proxy(model, {
  get(target, key) {
    if (key !== "on") return Reflect.get(target, key);
    return (name, cb, ...rest) => target.on(name, (...a) => {
      try { return cb(...a); } catch (e) { if (views.live > 0) throw e; }
    }, ...rest);
  },
});
export default () => {
  let widget = null;
  const views = { live: 0 };
  return {
    async initialize(ctx) {
      const mod = await load(await codeOf(ctx.model));
      widget = mod.default();
      return widget.initialize({ ...ctx, model: guarded(ctx.model, views) });
    },
    render(ctx) {
      views.live += 1;
      const cleanup = widget.render(ctx);
      return () => { views.live -= 1; if (typeof cleanup === "function") cleanup(); };
    },
  };
};
"""


class PlotlyCode(anywidget.AnyWidget):
    """Hidden: carries plotly's widget bundle to the browser, which imports it at once."""

    _esm = _CODE_ESM
    source = traitlets.Unicode().tag(sync=True)
    key = traitlets.Unicode().tag(sync=True)


_code: PlotlyCode | None = None
_code_lock = threading.Lock()


def code_widget() -> PlotlyCode:
    """This kernel's `PlotlyCode` (made again if it was closed, e.g. by `Widget.close_all()`)."""
    global _code
    with _code_lock:
        if _code is None or getattr(_code, "comm", None) is None:
            source = _BUNDLE.read_text(encoding="utf-8")
            digest = hashlib.sha1(source.encode("utf-8")).hexdigest()[:12]  # noqa: S324 - a cache key
            _code = PlotlyCode(source=source, key=f"{plotly.__version__}-{digest}")
        return _code


def preload() -> None:
    """Send plotly's widget code now when running in a kernel, so the browser has evaluated it
    before the first figure (outside a kernel: nothing)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        code_widget()


class Figure(go.FigureWidget):
    """A plotly `FigureWidget` that draws with the page's one import of plotly (`PlotlyCode`)."""

    _esm = _FIGURE_ESM
    _wb_code = traitlets.Instance(PlotlyCode).tag(sync=True, **W.widget_serialization)

    @traitlets.default("_wb_code")
    def _code_default(self) -> PlotlyCode:  # read when the widget opens: in its first message
        return code_widget()
