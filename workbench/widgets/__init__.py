"""Jupyter widgets that show a Recording step by step (ipywidgets + plotly FigureWidget).

    from workbench.widgets import DecodeWorkbench, PlanView
    DecodeWorkbench(generator, prompt, max_new_tokens=16)   # decode live, watch each step
    DecodeWorkbench(recording)                              # replay a recorded / saved one
    PlanView(recording)                                     # any single view, on its own

Each view's *model* (what it renders for a step / selection) lives in
`workbench.widgets.model` and is plain pandas; the views only draw it. The views are
imported on first use, so `workbench.widgets.model` (and `import workbench`) stay free
of ipywidgets and plotly.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module that defines it
_VIEWS = {
    "DecodeWorkbench": ".workbench",
    "DiagnosticsView": ".diagnostics_view",
    "LivenessView": ".liveness_view",
    "MemoTimeline": ".memo_timeline",
    "PlanView": ".plan_view",
    "SegmentationView": ".segmentation_view",
    "StepControl": ".controls",
    "ViewAliasView": ".view_alias_view",
    "StepCursor": ".model",
}

__all__ = sorted(_VIEWS)


def __getattr__(name: str) -> Any:
    module = _VIEWS.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.widgets' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_VIEWS))
