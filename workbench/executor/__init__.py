"""Plan, shapes and symbols, buffers, dispatch."""

from .executor import Executor
from .plan import KernelCache, Plan, PlanNode, build_plan

__all__ = ["Executor", "KernelCache", "Plan", "PlanNode", "build_plan"]
