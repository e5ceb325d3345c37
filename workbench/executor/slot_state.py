"""Everything an executor prepares for one slot, in one object.

The one-token decode (slot "primary") and the k+1-token speculative verify
(slot "verify") alternate; each keeps its own prepared plan, buffers (stable
addresses), decode-plan memo, cached view plan and captured graphs, so switching
slots is switching which `SlotState` is current — nothing is copied or swapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .capture import SlotCapture
from .memo import DecodePlanMemo, ShapeFold, ViewPlan
from .storage import StoragePlan


@dataclass
class SlotState:
    name: str
    # -- the prepared step: resolved shapes, storage, each node's output positions -------
    #: exact binding signature the preparation is for (a fresh object: prepare again)
    signature: Any = field(default_factory=object)
    #: why the prepared plan must not be reused, set by a run that found it wrong
    replan: str | None = None
    #: value id -> resolved shape: the persistent working shape map
    shapes: dict[int, tuple | None] = field(default_factory=dict)
    storage: StoragePlan | None = None
    dispatch: list = field(default_factory=list)  # one `prepare.Dispatch` per plan node
    #: (plan index, output position, value, owner) of every preallocated output
    preallocated: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: the preallocated outputs whose shape moves with a varying symbol
    variant_preallocated: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: graph output value id -> (plan index, output position) of those that own their
    #: buffer: every memo replay allocates them anew, so a run's buffer may be handed
    #: to the caller instead of copied (see `Executor.output_for_caller`)
    handover: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: caller-bound output value id -> (plan index, output position)
    bound_positions: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: owner value id -> buffer, reused while its shape holds
    buffers: dict[int, Any] = field(default_factory=dict)
    # -- decode-plan memo (Stage 1) and the cached view plan (Stage 2) ----------------
    memo: DecodePlanMemo | None = None
    prev_bindings: dict[str, int] | None = None
    prev_signature: tuple | None = None
    signature_cache: dict[tuple, tuple] = field(default_factory=dict)
    view_plan: ViewPlan | None = None
    stage2_streak: int = 0
    stage2_latched: bool = False
    #: shape arithmetic folded on replays (see memo.shape_fold_nodes)
    shape_fold: ShapeFold | None = None
    # -- device-graph capture ------------------------------------------------------------
    capture: SlotCapture = field(default_factory=SlotCapture)
