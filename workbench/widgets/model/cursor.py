"""`StepCursor`: the one selection every view follows -- step, slot and node.

Pure traitlets (no ipywidgets): views observe `step`, `slot`, `node` and
`version` (bumped when a live Recording grew), and tests drive it directly.
"""

from __future__ import annotations

import traitlets

from ...reports import Frames, slots, steps_of_slot

__all__ = ["StepCursor"]


class StepCursor(traitlets.HasTraits):
    """Where the user is looking: a recorded step of a slot, and maybe one plan node."""

    step = traitlets.Int(-1)  # -1: nothing recorded yet
    slot = traitlets.Unicode("primary")
    node = traitlets.Int(-1)  # selected plan index, -1 = none
    version = traitlets.Int(0)  # bumped by refresh() when the Recording grew
    follow = traitlets.Bool(False)  # jump to each new step as a live Recording grows

    def __init__(self, frames: Frames, **kwargs):
        super().__init__(**kwargs)
        self.frames = frames
        self._seen = frames.version
        names = slots(frames)
        if names and self.slot not in names:
            self.slot = names[0]
        if self.step < 0 and self.steps:
            self.step = self.steps[-1]

    # -- what there is
    @property
    def steps(self) -> list[int]:
        """Recorded steps of the current slot, in order."""
        return steps_of_slot(self.frames, self.slot)

    @property
    def slots(self) -> list[str]:
        return slots(self.frames) or [self.slot]

    @property
    def position(self) -> int:
        """Index of `step` in `steps` (-1 when there are none)."""
        s = self.steps
        return s.index(self.step) if self.step in s else -1

    # -- moving
    def go(self, step: int) -> None:
        """Select `step`; a step of another slot switches the slot too."""
        steps = self.frames.get("steps")
        row = steps[steps["step"] == step]
        if row.empty:
            raise ValueError(f"step {step} was not recorded; recorded steps: {self.steps}")
        with self.hold_trait_notifications():
            self.slot = str(row["slot"].iloc[0])
            self.step = int(step)

    def go_position(self, position: int) -> None:
        s = self.steps
        if s:
            self.step = s[max(0, min(position, len(s) - 1))]

    def next(self) -> None:
        self.go_position(self.position + 1)

    def prev(self) -> None:
        self.go_position(max(self.position - 1, 0))

    def first(self) -> None:
        self.go_position(0)

    def last(self) -> None:
        self.go_position(len(self.steps) - 1)

    def set_slot(self, slot: str) -> None:
        """Switch slot; the step becomes that slot's latest step at or before the current one."""
        if slot == self.slot:
            return
        s = steps_of_slot(self.frames, slot)
        with self.hold_trait_notifications():
            self.slot = slot
            earlier = [x for x in s if x <= self.step]
            self.step = (earlier or s or [-1])[-1]

    def select_node(self, plan_index: int | None) -> None:
        self.node = -1 if plan_index is None else int(plan_index)

    def refresh(self) -> bool:
        """Notice a grown Recording: bump `version`; with `follow` (or when nothing valid
        is selected) jump to the newest step, whatever its slot. Returns whether anything
        changed."""
        v = self.frames.version
        if v == self._seen:
            return False
        self._seen = v
        with self.hold_trait_notifications():
            steps = self.frames.get("steps")
            if len(steps) and (self.follow or self.step < 0 or self.step not in self.steps):
                self.slot = str(steps["slot"].iloc[-1])
                self.step = int(steps["step"].iloc[-1])
            self.version += 1
        return True
