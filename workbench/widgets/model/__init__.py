"""The widgets' models: what each view renders for a step / selection, in pure pandas.

Nothing here imports ipywidgets or plotly, so every model is testable without a
browser (and without a kernel).
"""

from .cursor import StepCursor
from .diagnostics import CALLS, DiagnosticsModel
from .liveness import LivenessModel
from .memo import MemoModel
from .paging import Page, page_of
from .plan import PlanModel
from .search import find
from .segmentation import SegmentationModel
from .tokens import token_strip
from .views import ViewsModel, explain_walk

__all__ = ["CALLS", "DiagnosticsModel", "LivenessModel", "MemoModel", "Page", "PlanModel", "SegmentationModel", "StepCursor", "ViewsModel",
           "explain_walk", "find", "page_of", "token_strip"]
