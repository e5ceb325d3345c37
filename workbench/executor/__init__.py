"""Plan, shapes and symbols, buffers, dispatch — and the mechanisms around them.

One decode step, in the order a newcomer can read it:

1. `executor.py` `Executor.run`: enter the slot's `SlotState` (`slot_state.py`), bind
   symbols (`shapes.py`), prepare the step, make the run's scratch (`step_run.py`
   `StepRun`: the values, the node loop, owners, views, what the memo serves), hand it
   to the capture runner, shadow-check, record (`step_trace.py`).
2. `prepare.py` `StepPreparer.prepare`: full preparation or a decode-plan memo replay,
   returned as a `PreparedStep` (action, reason, steady); the decisions themselves are
   pure functions in `memo.py`, the storage layout in `storage.py`.
3. `capture_runner.py` `run_step`: eager, capture or replay per captured segment; the
   segmentation, every decline reason and the captured graph itself (`CapturedGraph`:
   its signature, `mismatch`, `replay`, `free`) are in `capture.py`.
4. `executor.py` `_run_nodes`: the node loop — a bare kernel call (`ops/`) straight
   from it, anything more (views, in-place writes, buffers) through `_dispatch_node`.
5. `shadow.py`: on a step a mechanism served, the eager re-execution and comparison.

Following one step from `InferenceSession.run` (`session/inference_session.py`):

- an eager step: `executor.py`, `prepare.py` (full preparation), `capture_runner.py`
  (warm-up: every node eager), the kernels' modules in `ops/`, and `step_trace.py`
  where the step is traced: five files past the session;
- a decode-plan memo replay: the same, `prepare.py` replaying the memo's shapes
  (`memo.py`: its guard, and the view plan and shape fold that serve nodes);
- a captured replay: `executor.py`, `prepare.py`, `capture_runner.py` (`_replay`),
  `capture.py` (`CapturedGraph.mismatch` / `replay`), the backend's `launch`
  (`backend/cpu.py` or `backend/cuda.py`) and the kernels' fixed-arrays forms in `ops/`.
"""

from .executor import Executor
from .plan import KernelCache, Plan, PlanNode, build_plan

__all__ = ["Executor", "KernelCache", "Plan", "PlanNode", "build_plan"]
