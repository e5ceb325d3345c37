"""Jupyter widgets that show a Recording step by step (ipywidgets + plotly FigureWidget).

    from workbench.widgets import DecodeWorkbench, PlanView
    DecodeWorkbench(generator, prompt, max_new_tokens=16)   # decode live, watch each step
    DecodeWorkbench(recording)                              # replay a recorded / saved one
    PlanView(recording)                                     # any single view, on its own

Each view's *model* (what it renders for a step / selection) lives in
`workbench.widgets.model` and is plain pandas; the views only draw it.
Importing `workbench` never imports this package (nor plotly / ipywidgets).
"""

from .liveness_view import LivenessView
from .memo_timeline import MemoTimeline
from .model import StepCursor
from .plan_view import PlanView
from .segmentation_view import SegmentationView
from .view_alias_view import ViewAliasView
from .workbench import DecodeWorkbench

__all__ = ["DecodeWorkbench", "LivenessView", "MemoTimeline", "PlanView", "SegmentationView", "StepCursor",
           "ViewAliasView"]
