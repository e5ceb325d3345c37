"""`StepHTML`: HTML about one step that the page shows together with that step's plot.

A step label, a plot and a token highlight are three widgets: each update is its own
message, and a plot takes a kernel's figure build and a plotly redraw longer than a line
of HTML. So the page showed "step 12" above the plot of step 10 (or the reverse) for a
tenth of a second to half a second at every step of a live decode.

A `StepHTML` names its step; its update is sent before the plot's (the widgets order
their messages so), and the browser holds it until every visible figure that follows the
step (`FigureHolder(follows_step=True)`: its layout's `meta.wb_step`) shows that step,
then applies it in the same frame as the plot's redraw (the redraw's `plotly_afterplot`
event, or the next animation frame, whichever comes first). Never longer than
`HOLD_MS`: a plot that does not redraw does not freeze the label.
"""

from __future__ import annotations

import anywidget
import traitlets

__all__ = ["HOLD_MS", "StepHTML"]

#: the longest the browser holds a step's HTML for its plot
HOLD_MS = 3000
#: how long a new view's first value waits for a figure that follows the step to appear
#: in its scope (the page builds a re-run cell's workbench over several frames)
BUILD_MS = 1000

_ESM = """
const HOLD_MS = __HOLD_MS__, BUILD_MS = __BUILD_MS__;
const scopeOf = (el) => el.closest(".wb-workbench") || el.closest(".wb-view");
// the visible figures that follow the step: their plotly element (null: not drawn yet)
const plotsOf = (scope) => scope ? [...scope.querySelectorAll(".wb-step-figure")]
  .filter((f) => f.offsetParent !== null).map((f) => f.querySelector(".js-plotly-plot")) : [];
// the step a plot has finished drawing (undefined: none yet)
const shown = (gd, scope) => {
  if (!gd) return undefined;
  if (!gd.__wbHooked && typeof gd.on === "function") {
    gd.__wbHooked = true;
    gd.__wbStep = gd._fullLayout?.meta?.wb_step;
    gd.on("plotly_afterplot", () => {
      gd.__wbStep = gd._fullLayout?.meta?.wb_step;
      scope.dispatchEvent(new CustomEvent("wb-plot-drawn"));
    });
  }
  return gd.__wbHooked ? gd.__wbStep : undefined;
};

function render({ model, el }) {
  // while a value waits: `watch` sees the page's mutations (the page attaching this element,
  // then the scope's plots being built and drawn) and checks at once, in the same task, so
  // the value lands before the paint that first shows its plot, never a frame after it
  let frame = 0, timer = 0, scope = null, watch = null, since = 0;
  const stop = () => {
    cancelAnimationFrame(frame); clearTimeout(timer); frame = timer = 0;
    if (scope) scope.removeEventListener("wb-plot-drawn", check);
    if (watch) watch.disconnect();
    scope = watch = null; since = 0;
  };
  const apply = () => { stop(); el.innerHTML = model.get("value"); };
  const observe = (node) => {
    if (watch) watch.disconnect();
    watch = new MutationObserver(check);
    watch.observe(node, { childList: true, subtree: true, attributes: true, characterData: true });
  };
  function check() {
    cancelAnimationFrame(frame);
    if (!el.isConnected) { if (!watch) observe(document.body); return; }  // not in the page yet
    if (!scope) {
      scope = scopeOf(el);
      if (!scope) return apply();
      scope.addEventListener("wb-plot-drawn", check);
      observe(scope);
    }
    const step = model.get("step"), plots = plotsOf(scope);
    if (step < 0) return apply();
    // no figure follows the step in view: a grace for a view still being built (a new
    // workbench's figure appears some frames after its label: BUILD_MS until its scope has
    // shown a figure, none after), then the value shows on its own
    since = since || performance.now();
    if (plots.length) scope.__wbFigureSeen = true;
    const grace = scope.__wbFigureSeen ? 0 : BUILD_MS;
    if (!plots.length && performance.now() - since > grace) return apply();
    if (plots.length && plots.every((gd) => shown(gd, scope) === step)) return apply();
    frame = requestAnimationFrame(check);
  }
  const update = () => { stop(); timer = setTimeout(apply, HOLD_MS); check(); };
  model.on("change:value", update);
  model.on("change:step", update);
  update();  // the first value too waits for its plot
  return () => { stop(); model.off("change:value", update); model.off("change:step", update); };
}
export default { render };
""".replace("__HOLD_MS__", str(HOLD_MS)).replace("__BUILD_MS__", str(BUILD_MS))


class StepHTML(anywidget.AnyWidget):
    """HTML (`value`) about step `step` (-1: about no step), shown in step with the plots."""

    _esm = _ESM
    value = traitlets.Unicode("").tag(sync=True)
    step = traitlets.Int(-1).tag(sync=True)

    def show(self, value: str, step: int) -> None:
        """Set both in one message."""
        with self.hold_sync():
            self.step = int(step)
            self.value = value
