"""plotly figures of a Recording's frames; shared by the widgets and the HTML report."""

from .anatomy import breakdown_figure
from .capture import declines_figure, segments_figure
from .common import esc
from .diagnostics import coverage_figure, kv_growth_figure, latency_figure, seam_costs_figure
from .liveness import liveness_figure
from .memo import memo_figure
from .plan import plan_strip_figure
from .views import view_walk_figure

__all__ = ["breakdown_figure", "coverage_figure", "declines_figure", "esc", "kv_growth_figure", "latency_figure", "liveness_figure",
           "memo_figure", "plan_strip_figure", "seam_costs_figure", "segments_figure", "view_walk_figure"]
