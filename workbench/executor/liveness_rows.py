"""A slot's liveness rows, step by step: built in full once, then re-emitted.

One row per value of the storage plan: (value_id, storage, owner_id, nbytes,
first_def, last_use, pinned, released_at). A row is a function of the storage plan,
the value's owner, the pinned and released sets and, for values holding bytes, their
`nbytes`. While the plan, owners, pinned and released are those of the slot's last
step, the rows are those last built, with this step's nbytes of the holding values as
a patch where they moved (a growing KV cache moves some every step), and an unchanged
step hands the Recording the very same tuple (and patch) again.

Per step, what is still read is only what can change: the owners of view values
(the executor starts every step from the storage plan's owners and only a layout
node rewrites its own output's, in a copy: a step whose owners are the plan's very
dict, as last time, has the same), and the arrays of holding values other than the
graph's initializers, which never change (no feed can replace one: the session
refuses a feed named like an initializer). Of those arrays, one that is the very object it
was last step has its last nbytes (an array cannot change size while referenced), so
comparing references is all a replayed step costs, and it reads no array's size.
The sizes are kept as one block of machine integers, copied and compared whole: a
decode step streams its weights through the caches, and a list's int objects, each
wherever it lies, would be fetched from memory one by one every step. While the same
captured graphs replay step after step, only the values they do not restore can
change: the rows are rebased once on every other size, and each step's patch names
just those values (`_replay_patch`).
"""

from __future__ import annotations

import array
import operator
from typing import Any

from ..addresses import items_at
from .storage import INITIALIZER, INPUT, OWNER, VIEW, StoragePlan

_OWNS = frozenset({OWNER, INPUT, INITIALIZER})
_NBYTES = operator.attrgetter("nbytes")


def _sizes(nbytes) -> array.array:
    """Sizes in one flat block of machine integers: a step copies and compares them
    whole, where a list would reach each size's own int object, wherever it lies (a
    decode step streams its weights through the caches between two such reads)."""
    return array.array("q", nbytes)


def _with_changes(sizes: array.array, objects: tuple, last: tuple, at: Any) -> array.array:
    """`sizes` with `at[k]` set to `objects[k]`'s nbytes wherever that is not `last[k]`
    (the very object of the last step keeps its size): a copy made at the first change,
    else `sizes` itself. A plain loop: at the end of a step, after the kernels streamed
    the weights, fewer cold code paths than map and compress."""
    copied = False
    for k, obj in enumerate(objects):
        if obj is not last[k]:
            if not copied:
                sizes, copied = sizes[:], True
            sizes[at[k]] = obj.nbytes
    return sizes


class LivenessRows:
    """A slot's last liveness rows and what they were made from."""

    __slots__ = ("storage", "static", "view_vids", "_owner_of", "fixed_vids", "rows", "view_owners", "pinned", "released",
                 "holding", "moving_at", "nbytes", "built_nbytes", "patch", "objects", "_plan_owners",
                 "_moving_vids", "_watch_all", "_watch_replay", "_watching", "_replayed", "_sparse",
                 "_nbytes_stale")

    def __init__(self, sp: StoragePlan, view_vids: tuple[int, ...], fixed_vids: frozenset[int]):
        self.storage = sp
        #: (vid, kind, first_def, last_use, owns) of every value: the same for every step
        self.static = [(vid, kind, sp.first_def.get(vid, -1), sp.last_use.get(vid, -1), kind in _OWNS)
                       for vid, kind in sp.storage.items()]
        #: the outputs of layout nodes: the only values whose owner a step may change
        self.view_vids = view_vids
        self._owner_of = items_at(list(view_vids))
        #: the graph's initializers: their arrays never change
        self.fixed_vids = fixed_vids
        #: the rows last built in full (a later step's differ from them only in nbytes)
        self.rows: tuple | None = None
        self.view_owners: tuple | None = None  # the owners of `view_vids` when `rows` were built
        #: the storage plan's owner dict, once `view_owners` were read from it: no step
        #: writes into it (the executor copies it at a step's first owner change), so
        #: a step whose owners are that very dict has those view owners without a read
        self._plan_owners: dict | None = None
        self.pinned: set = set()
        self.released: dict = {}
        self.holding: tuple[int, ...] = ()  # row positions whose nbytes is read from the value
        self.moving_at: tuple[int, ...] = ()  # positions in `holding` of values that may change
        self.nbytes: array.array | None = None  # the holding values' nbytes at the last step
        self.built_nbytes: array.array | None = None  # ... and when `rows` were built
        self.patch: tuple | None = None  # the last step's (holding, nbytes) patch of `rows`
        #: the watched values' arrays when `nbytes` was read (the executor's arrays hold them too)
        self.objects: tuple | None = None
        self._moving_vids: list[int] = []  # the values at `moving_at`
        #: (getter of the arrays, their positions in `holding`) of the values a step
        #: compares: every moving value, or those a replay of the same captured graphs
        #: as last step does not restore (`_watch_for`); `objects` are `_watching`'s
        self._watch_all: tuple = (items_at(()), ())
        self._watch_replay: tuple | None = None
        self._watching: tuple | None = None
        #: the values the last step's replay restored, as `emit` got them
        self._replayed: frozenset | None = None
        #: while the same graphs replay: (the replay watch, the row positions of its
        #: values, their sizes), the rows rebased so that only those can differ
        self._sparse: tuple | None = None
        self._nbytes_stale = False  # `nbytes` lags the sparse sizes (`_full_nbytes`)

    def emit(self, rec: Any, arrays: list, owners: dict[int, int], buffers: dict[int, Any],
             released: dict[int, int], pinned: set[int], replayed: frozenset | None = None) -> None:
        """This step's rows into `rec`. `replayed`: where the step replayed captured
        graphs, the values whose arrays every replay of those graphs restores as the
        very same objects (`CaptureRunner.replay_restores`), one frozenset for as long
        as the same graphs replay; None otherwise."""
        rows = patch = None
        if self.rows is not None and self.nbytes is not None and not released and not self.released \
                and pinned == self.pinned and self._same_view_owners(owners):
            if replayed is not None and replayed is self._replayed and self._watch_replay is not None \
                    and self._watching is self._watch_replay:
                try:
                    patch = self._replay_patch(arrays)
                    rows = self.rows
                except AttributeError:  # an absent value or a sequence: rebuilt below
                    pass
            else:
                nbytes = self.nbytes_now(arrays, replayed)
                if nbytes is not None:
                    rows = self.rows
                    if nbytes is self.nbytes or nbytes == self.nbytes:
                        nbytes, patch = self.nbytes, self.patch
                    elif nbytes != self.built_nbytes:
                        patch = (self.holding, nbytes)
                    self.nbytes, self.patch = nbytes, patch
        if rows is None:
            rows = self.rows = self._build(arrays, owners, buffers, released, pinned)
            self.view_owners = self._view_owners(owners)
            self._plan_owners = owners if owners is self.storage.owner else None
            self.pinned, self.released = set(pinned), dict(released)
            self._set_holding(tuple(i for i, r in enumerate(rows) if r[1] in _OWNS), arrays)
        rec.liveness(rows, patch)

    def _same_view_owners(self, owners: dict[int, int]) -> bool:
        if owners is self._plan_owners:
            return True
        if self._view_owners(owners) != self.view_owners:
            return False
        if owners is self.storage.owner:
            self._plan_owners = owners
        return True

    def _view_owners(self, owners: dict[int, int]) -> tuple:
        try:
            return self._owner_of(owners)
        except KeyError:  # a view value without an owner entry (views off): one by one
            return tuple(map(owners.get, self.view_vids))

    def _build(self, arrays: list, owners: dict[int, int], buffers: dict[int, Any],
               released: dict[int, int], pinned: set[int]) -> tuple:
        rows = []
        append = rows.append
        for vid, kind, first, lu, owns in self.static:
            owner = owners.get(vid, vid)
            if kind is VIEW and owner == vid:
                kind, owns = OWNER, True  # the layout op had to copy
            nbytes = 0
            if owns:
                value = arrays[vid]
                if value is None:
                    value = buffers.get(vid)
                nbytes = getattr(value, "nbytes", 0)
            append((vid, kind, owner, nbytes, first, lu, owner in pinned,
                    released.get(owner, -1) if released else -1))
        return tuple(rows)

    def _set_holding(self, positions: tuple[int, ...], arrays: list) -> None:
        self.holding = positions
        vids = [self.static[i][0] for i in positions]
        self.moving_at = tuple(i for i, vid in enumerate(vids) if vid not in self.fixed_vids)
        self._moving_vids = [vids[i] for i in self.moving_at]
        self._watch_all = (items_at(self._moving_vids), self.moving_at)
        self._watch_replay = self._watching = self._replayed = self._sparse = None
        self._nbytes_stale = False
        try:
            self.nbytes = self.built_nbytes = _sizes(map(_NBYTES, items_at(vids)(arrays)))
        except AttributeError:  # an absent value or a sequence: rows are rebuilt every step
            self.nbytes = self.built_nbytes = None
        self.objects = None
        self.patch = None

    def nbytes_now(self, arrays: list, replayed: frozenset | None = None) -> array.array | None:
        """nbytes of every holding value now (the very array of the last step where no
        compared value changed, `_watch_for`); None when one has none (an absent value,
        whose row falls back to its buffer, or a sequence): then rows are rebuilt."""
        if self._nbytes_stale:
            self._full_nbytes()
        watch = self._watch_for(replayed)
        get, moving_at = watch
        objects = get(arrays)
        last = self.objects if self._watching is watch else None
        nbytes = self.nbytes
        try:
            if last is None:
                nbytes = nbytes[:]
                for i, obj in zip(moving_at, objects):
                    nbytes[i] = obj.nbytes
            else:
                nbytes = _with_changes(nbytes, objects, last, moving_at)
        except AttributeError:
            return None
        self.objects, self._watching = objects, watch
        return nbytes

    def _replay_patch(self, arrays: list) -> tuple | None:
        """The patch of a step that replays the same graphs as the last, which replayed
        them too: only the values those graphs do not restore are compared, and the
        patch names only them (`_enter_sparse` rebased the rows on every other size),
        so a step copies a few dozen sizes instead of every holding value's. Raises
        AttributeError where a compared value has no nbytes."""
        sparse = self._sparse
        if sparse is None or sparse[0] is not self._watch_replay:
            sparse = self._enter_sparse()
        watch, positions, sizes = sparse
        objects = watch[0](arrays)
        now = _with_changes(sizes, objects, self.objects, range(len(objects)))
        self.objects = objects
        if now is not sizes:
            self._sparse = (watch, positions, now)
            self.patch = (positions, now)
            self._nbytes_stale = True
        return self.patch

    def _enter_sparse(self) -> tuple:
        """Start patching only the replay watch's values: `nbytes` holds every size as
        the last step left it (it compared this watch's values, the replay restored the
        rest), so rows rebuilt on those sizes differ from later steps' only there."""
        watch, nbytes = self._watch_replay, self.nbytes
        if nbytes != self.built_nbytes:
            rows = list(self.rows)
            for k, i in enumerate(self.holding):
                r = rows[i]
                if r[3] != nbytes[k]:
                    rows[i] = (*r[:3], nbytes[k], *r[4:])
            self.rows, self.built_nbytes, self.patch = tuple(rows), nbytes, None
        self._sparse = (watch, tuple(self.holding[m] for m in watch[1]), _sizes(nbytes[m] for m in watch[1]))
        return self._sparse

    def _full_nbytes(self) -> None:
        """Bring `nbytes` up to the sparse sizes (a step left the replay watch)."""
        watch, _, sizes = self._sparse
        nbytes = self.nbytes[:]
        for m, size in zip(watch[1], sizes):
            nbytes[m] = size
        self.nbytes, self._nbytes_stale = nbytes, False

    def _watch_for(self, replayed: frozenset | None) -> tuple:
        """The values to compare this step. A step that replays the same captured graphs
        as the last (the very `replayed` set) gets every value they restore back as the
        very array of the last step, whose nbytes are those read then: only the others
        are compared (in a small llama's decode, 38 of 174). Any other step compares
        them all, and a replay that follows it may skip from the next step on."""
        if replayed is None or replayed is not self._replayed:
            self._replayed, self._watch_replay = replayed, None
            return self._watch_all
        if self._watch_replay is None:
            keep = [k for k, vid in enumerate(self._moving_vids) if vid not in replayed]
            self._watch_replay = (items_at([self._moving_vids[k] for k in keep]),
                                  tuple(self.moving_at[k] for k in keep))
        return self._watch_replay
