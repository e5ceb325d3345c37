"""The Recording: a columnar, saveable log of everything the executor did.

Emission is the hot path (one call per node per step while a model generates), so
every emitting method only appends to Python lists: a row's fields one after another
in one flat list per per-node table, the rows as given for liveness (a step equal to
the last one shares its tuple) and for generic tables (`add_row`, `add_rows`). They
are laid out into columns the first time something reads them. No event objects, no
pandas, and no container kept per row: a kept tuple per row would be one more object
for the garbage collector's young generation, and a traced decode step would set off
a young collection every few steps. One extra small int per event (`_order`, the
table it went to; a long run of one table's events as one entry until read) keeps
the global emission order, so `events()` and the `seq` column of every frame can
replay the interleaving exactly.

Node rows, the events a step has most of between its kernels, go first to a log
(`node_log`) that the executor extends without a call per node, and take their
place among the events at the next event of another kind, a run of them as one
block that is written out row by row when read. A call into the
Recording right after a kernel finds its code and data evicted and costs a few
microseconds; a list append costs a fraction of that.

Reading is the cold path: `steps()`, `views()`, `liveness()`, ... build pandas
frames on demand (pandas is imported there, never when emitting); `events()` builds
typed dataclasses lazily; `save()` / `load()` go through parquet + JSON (no pickle).

Step numbering: `begin_step` returns 0, 1, 2, ... (its position in the steps
table). Every event row carries the step most recently begun (-1 before the first
one) -- including events emitted after that step's `end_step` and before the next
`begin_step`. `clear()` empties the per-step tables and restarts numbering at 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import WorkbenchError
from ..tables import (
    CAPTURE_DECLINES_COLUMNS,
    CAPTURE_EVENTS_COLUMNS,
    CAPTURE_SEGMENTS_COLUMNS,
    DIVERGENCES_COLUMNS,
    MEMO_COLUMNS,
    SHADOW_COLUMNS,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from .events import Event
    from .memory_planner import MemoryPlan

__all__ = ["Recording", "TraceError"]


class TraceError(WorkbenchError):
    """The trace API was misused (unbalanced steps, bad table name, unreadable recording)."""


#: built-in per-step tables: name -> columns (the raw, id-based layout saved to disk)
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "steps": ("step", "slot", "phase", "bindings", "wall_s", "resident_peak_bytes", "extra"),
    "node_exec": ("step", "plan_index", "mode", "duration_s"),
    "buffer": ("step", "event", "value_id", "nbytes", "plan_index"),
    "view": ("step", "value_id", "source_id", "shape", "strides", "byte_offset", "plan_index"),
    "alias": ("step", "value_id", "into_id", "plan_index"),
    "materialize": ("step", "plan_index", "value_id", "nbytes", "reason"),
    "liveness": ("step", "value_id", "storage", "owner_id", "nbytes", "first_def", "last_use",
                 "pinned", "released_at"),
}

#: static tables: name -> the columns every row has (callers may add more keys)
STATIC_COLUMNS: dict[str, tuple[str, ...]] = {
    "nodes": ("plan_index", "name", "op_type", "domain", "kernel", "produces_view",
              "capture_supported", "capture_reason", "capture_detail", "inputs", "outputs"),
    "values": ("value_id", "name", "dtype", "shape", "kind", "role"),
}

#: event-order codes: which table each emitted event went to
CODE_STEP_BEGAN, CODE_STEP_ENDED, CODE_NODE, CODE_BUFFER, CODE_VIEW, CODE_ALIAS, \
    CODE_MATERIALIZE, CODE_LIVENESS = range(8)
#: table name -> code of its rows in `_order` (steps: the begin event)
TABLE_CODES = {"steps": CODE_STEP_BEGAN, "node_exec": CODE_NODE, "buffer": CODE_BUFFER,
               "view": CODE_VIEW, "alias": CODE_ALIAS, "materialize": CODE_MATERIALIZE,
               "liveness": CODE_LIVENESS}
#: generic tables get codes GENERIC_CODE_BASE, +1, ... in creation order
GENERIC_CODE_BASE = 16
#: in `_event_codes` only, never read: the place of a run of events of one code (a
#: block of logged node rows, a step's liveness rows, a span), written out as that
#: many codes at the next read (`_order`)
CODE_RUN = -1
#: runs shorter than this are written out at once
_SHORT_RUN = 8
#: a row of another per-step table logged among the node rows (`Recording.node_log`):
#: its marker (a negative int, where a node row has a plan index or a tuple of them),
#: then its fields in `TABLE_COLUMNS` order without the step
LOG_VIEW, LOG_BUFFER, LOG_ALIAS, LOG_MATERIALIZE = -1, -2, -3, -4
#: marker -> (event code, the table's pending list's index in `Recording._pending`, fields)
_LOGGED_ROWS = {LOG_VIEW: (CODE_VIEW, 2, 6), LOG_BUFFER: (CODE_BUFFER, 1, 4), LOG_ALIAS: (CODE_ALIAS, 3, 3),
                LOG_MATERIALIZE: (CODE_MATERIALIZE, 4, 4)}


_STEP_RESERVED = frozenset(TABLE_COLUMNS["steps"]) | {"wall_ms"}
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_LIVENESS_WIDTH = len(TABLE_COLUMNS["liveness"]) - 1


class _Generic:
    """A table added through `add_row`: columns appear as rows name them (earlier rows: None).

    Rows are kept as emitted, two entries each in the flat list `pending`: the step,
    then {column: value} or a block (column names, rows of values); they are laid out
    into `cols` when read."""

    __slots__ = ("_cols", "_n", "code", "pending")

    def __init__(self, code: int):
        self._cols: dict[str, list] = {"step": []}
        self._n = 0
        self.code = code
        self.pending: list = []

    @property
    def cols(self) -> dict[str, list]:
        if self.pending:
            self._flush()
        return self._cols

    @cols.setter
    def cols(self, cols: dict[str, list]) -> None:
        self.pending.clear()
        self._cols = cols

    @property
    def n(self) -> int:
        return self._n + sum(1 if type(p) is dict else len(p[1]) for p in self.pending[1::2])

    @n.setter
    def n(self, n: int) -> None:
        self.cols  # noqa: B018 - lay out what is pending first
        self._n = n

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        for step, item in zip(pending[::2], pending[1::2]):
            if type(item) is dict:
                self._lay_out(step, item)
            else:
                keys, rows = item
                for values in rows:
                    self._lay_out(step, dict(zip(keys, values)))

    def _lay_out(self, step: int, columns: dict[str, Any]) -> None:
        cols, n = self._cols, self._n
        if "step" not in columns:
            cols["step"].append(step)
        for k, v in columns.items():
            col = cols.get(k)
            if col is None:
                col = cols[k] = [None] * n
            col.append(v)
        n += 1
        if len(columns) + ("step" not in columns) != len(cols):
            for col in cols.values():
                if len(col) < n:
                    col.append(None)
        self._n = n


class _FlatRows:
    """Rows of `width` fields, stored one after another in one flat tuple (a block of
    `add_flat_rows`): what `_Generic` needs of a block of rows, its length and its rows."""

    __slots__ = ("fields", "width")

    def __init__(self, fields: tuple, width: int) -> None:
        self.fields, self.width = fields, width

    def __len__(self) -> int:
        return len(self.fields) // self.width

    def __iter__(self) -> Iterator[tuple]:
        return zip(*[iter(self.fields)] * self.width)


#: padding for a span's row in a pending list
_NONES = (None,) * 8


class _LoggedBlock:
    """The node log as placed when it held rows of other tables too: node rows (a plan
    index or a span's tuple of them, mode, duration_s) and marked rows (`_LOGGED_ROWS`)
    one after another, in the order emitted."""

    __slots__ = ("fields",)

    def __init__(self, fields: tuple) -> None:
        self.fields = fields

    def rows(self) -> Iterator[tuple]:
        """(marker, or None for a node row; the row's fields) of each row, in order."""
        fields = self.fields
        i, n = 0, len(fields)
        while i < n:
            marker = fields[i]
            if type(marker) is int and marker < 0:
                width = _LOGGED_ROWS[marker][2]
                yield marker, fields[i + 1:i + 1 + width]
                i += 1 + width
            else:
                yield None, fields[i:i + 3]
                i += 3

    def codes(self) -> list[int]:
        """The event code of each row it stands for, in order (a span: one per node)."""
        out: list[int] = []
        for marker, row in self.rows():
            if marker is None:
                k = row[0]
                out.extend((CODE_NODE,) * (len(k) if type(k) is tuple else 1))
            else:
                out.append(_LOGGED_ROWS[marker][0])
        return out


class _LoggedTable:
    """The rows of one table in a `_LoggedBlock` (marker None: the node rows): what a
    table's pending list holds of the block, as a span."""

    __slots__ = ("block", "marker")

    def __init__(self, block: _LoggedBlock, marker: int | None) -> None:
        self.block, self.marker = block, marker

    def __iter__(self) -> Iterator[tuple]:
        marker = self.marker
        return (row for m, row in self.block.rows() if m == marker)


def _expanded(flat: list, width: int, span_rows: Any) -> list:
    """A flat pending list with its spans replaced by the rows they stand for. A span
    takes one row's `width` fields, the step first and a tuple (or `_FlatRows`) in the
    second field (where a plain row has an int or a str); `span_rows(fields)` gives
    its rows."""
    out: list = []
    for i in range(0, len(flat), width):
        fields = flat[i:i + width]
        if type(fields[1]) in _SPANS:
            for row in span_rows(fields):
                out.extend(row)
        else:
            out.extend(fields)
    return out


_SPANS = (tuple, _FlatRows, _LoggedTable)


def _node_span_rows(fields: list) -> list[tuple]:
    step, what, mode, share = fields
    if type(what) is _FlatRows or type(what) is _LoggedTable:  # a block of the node log: (plan index or span, mode, duration_s) each
        rows: list[tuple] = []
        for k, mode, duration in what:
            if type(k) is tuple:
                rows += [(step, i, mode, duration / len(k)) for i in k]
            else:
                rows.append((step, k, mode, duration))
        return rows
    return [(step, k, mode, share) for k in what]


def _node_rows_in(block: tuple) -> int:
    """Rows a block of the node log stands for: one per plan index, a span's each."""
    return sum(len(k) if type(k) is tuple else 1 for k in block[::3])


def _row_span_rows(fields: list) -> list[tuple]:
    step = fields[0]
    return [(step, *row) for row in fields[1]]


#: the emission calls of the memory tables, which record nothing where `Recording.memory`
#: is off (so is `liveness(rows)`, also the liveness frame's reader; its emitters check
#: `memory` first, to skip working the rows out)
_MEMORY_EMITTERS = ("buffer", "buffer_span", "buffer_rows", "view", "view_span", "alias", "materialize")


def _ignore(*_args: Any) -> None:
    """A memory table's emission call where the Recording keeps no memory tables."""


class Recording:
    """Everything one session's executor did, step by step; see the module docstring.

    Emission API (what the executor calls): `set_static`, `begin_step`, `node`,
    `node_span`, `node_log`, `buffer`, `buffer_span`, `buffer_rows`, `view`, `view_span`, `alias`,
    `materialize`, `liveness`, `end_step`, `add_row`, `add_rows`.
    Reading API: `steps`, `nodes`, `values`, `views`, `liveness_frame` (also reachable
    as `liveness()` with no argument), `buffer_events`, `node_timings`, `aliases`,
    `materializations`, `memory_summary`, `memory_plan`, `table`, `tables`, `events`,
    `save`, `load`, `len()`, `clear`. `Recording(memory=False)` keeps no memory tables
    (`memory`): the calls that emit them record nothing.
    """

    def __init__(self, memory: bool = True) -> None:
        #: whether the memory tables are recorded (liveness, io_buffers, views, buffer
        #: events, aliases, materializations): off, their emission calls record nothing
        #: and an emitter may skip working their rows out (`SessionOptions.trace_memory`);
        #: readers tell "not recorded" from "none happened" by it
        self.memory = memory
        if not memory:
            for name in _MEMORY_EMITTERS:
                setattr(self, name, _ignore)
        self._tables: dict[str, dict[str, list]] = {
            name: {c: [] for c in cols} for name, cols in TABLE_COLUMNS.items()}
        #: liveness rows as emitted, (step, tuple of row tuples, nbytes patch or None),
        #: laid out when read; a step whose rows equal the last step's shares that
        #: step's tuple, and one that differs from it only in nbytes shares it too, with
        #: the new nbytes as a patch (see `liveness`)
        self._lv_pending: list[tuple[int, tuple, tuple | None]] = []
        self._lv_last: tuple | None = None
        self._lv_positions: tuple | None = None  # (positions, rows) of the last patch checked
        self._static: dict[str, dict[str, list]] = {
            name: {c: [] for c in cols} for name, cols in STATIC_COLUMNS.items()}
        self._generic: dict[str, _Generic] = {}
        self._event_codes: list[int] = []  # `_order` as emitted so far: node rows still logged are not in it
        #: node rows not yet placed among the events: (plan index, or a tuple of plan
        #: indices for a span; mode; duration_s) one after another (see `node_log`),
        #: with the view, buffer, alias and materialize rows emitted between them, each
        #: its marker and fields (`_LOGGED_ROWS`)
        self._node_log: list = []
        self._logged = False  # whether the node log holds such rows
        #: the runs stood for by a CODE_RUN in `_event_codes` from index `_runs_from` on,
        #: oldest first, two entries each: the code, then the count (or a block of the
        #: node log, whose rows are counted when written out)
        self._runs: list = []
        self._runs_from = 0
        self._step = -1
        self._open = False
        self._maps: tuple | None = None
        self._bind()

    @property
    def _order(self) -> list[int]:
        """Every event's code, in emission order (logged node rows placed first)."""
        if self._node_log:
            self._place_nodes()
        if self._runs:
            self._write_runs()
        return self._event_codes

    def _run(self, code: int, n: int) -> None:
        """`n` events of `code` into the event order: a long run as one CODE_RUN, so a
        traced step adds a dozen entries to it instead of a thousand."""
        if n < _SHORT_RUN:
            self._event_codes.extend((code,) * n)
        else:
            self._push_run(code, n)

    def _push_run(self, code: int, n: int | tuple) -> None:
        """A CODE_RUN into the event order, standing for `n` events of `code` (or for
        the rows of a node-log block)."""
        if not self._runs:
            self._runs_from = len(self._event_codes)
        self._runs += (code, n)
        self._event_codes.append(CODE_RUN)

    def _write_runs(self) -> None:
        """Each CODE_RUN as the codes of the run it stands for."""
        codes, runs = self._event_codes, self._runs
        start = self._runs_from
        out: list[int] = []
        i = 0
        for code in codes[start:]:
            if code == CODE_RUN:
                run, n = runs[i], runs[i + 1]
                if type(n) is _LoggedBlock:
                    out += n.codes()
                else:
                    out.extend((run,) * (n if type(n) is int else _node_rows_in(n)))
                i += 2
            else:
                out.append(code)
        codes[start:] = out
        runs.clear()

    @property
    def _t(self) -> dict[str, dict[str, list]]:
        """The built-in tables, column by column (pending rows laid out first)."""
        if self._node_log:
            self._place_nodes()
        if self._lv_pending:
            self._flush_liveness()
        if self._spans:
            self._expand_spans()
        for name, flat in self._pending.items():
            if flat:
                cols = self._tables[name]
                width = len(cols)
                for i, col in enumerate(cols.values()):
                    col.extend(flat[i::width])
                flat.clear()
        return self._tables

    def _expand_spans(self) -> None:
        """Rows of replayed segments, pending as one span each, in place."""
        for name, span_rows in (("node_exec", _node_span_rows), ("buffer", _row_span_rows),
                                ("view", _row_span_rows), ("alias", _row_span_rows),
                                ("materialize", _row_span_rows)):
            flat = self._pending[name]
            flat[:] = _expanded(flat, len(TABLE_COLUMNS[name]), span_rows)
        self._spans = 0

    def _flush_liveness(self) -> None:
        pending, self._lv_pending = self._lv_pending, []
        lv = self._tables["liveness"]
        names = TABLE_COLUMNS["liveness"][1:]
        nbytes_at = names.index("nbytes")
        for step, rows, patch in pending:
            lv["step"].extend([step] * len(rows))
            for i, (name, col) in enumerate(zip(names, zip(*rows))):
                if patch is not None and i == nbytes_at:
                    col = list(col)
                    for position, nbytes in zip(*patch):
                        col[position] = nbytes
                lv[name].extend(col)

    def _bind(self) -> None:
        """The per-node tables take rows as their fields in `TABLE_COLUMNS` order, one
        after another in one flat list per table, laid out into columns by `_t`; direct
        references to those lists (only ever cleared or replaced in place)."""
        self._steps = self._tables["steps"]
        self._pending: dict[str, list] = {
            name: [] for name in ("node_exec", "buffer", "view", "alias", "materialize")}
        self._ne, self._bu, self._vi, self._al, self._ma = self._pending.values()
        self._spans = 0  # spans among the pending rows (`_expanded`)

    # ------------------------------------------------------------------ emission

    def set_static(self, nodes: list[dict], values: list[dict]) -> None:
        """The plan's nodes and the graph's values (replaces any earlier static tables).

        Keys beyond `STATIC_COLUMNS` become extra columns; a row missing a key gets None.
        """
        for name, rows in (("nodes", nodes), ("values", values)):
            cols = list(STATIC_COLUMNS[name])
            seen = set(cols)
            for r in rows:
                for k in r:
                    if k not in seen:
                        seen.add(k)
                        cols.append(k)
            self._static[name] = {c: [r.get(c) for r in rows] for c in cols}
        self._maps = None

    def begin_step(self, slot: str = "primary", phase: str = "",
                   bindings: dict[str, int] | None = None) -> int:
        """Open a step (one run); returns its index, carried by every event until the next one."""
        if self._node_log:
            self._place_nodes()
        s = self._steps
        step = len(s["step"])
        s["step"].append(step)
        s["slot"].append(slot)
        s["phase"].append(phase)
        s["bindings"].append({str(k): int(v) for k, v in bindings.items()} if bindings else {})
        s["wall_s"].append(math.nan)
        s["resident_peak_bytes"].append(0)
        s["extra"].append({})
        self._step = step
        self._open = True
        self._event_codes.append(CODE_STEP_BEGAN)
        return step

    def node(self, plan_index: int, mode: str, duration_s: float) -> None:
        """Plan node ran: mode "eager" | "replayed" | "elided"."""
        self._node_log += (plan_index, mode, duration_s)

    def node_span(self, plan_indices: list[int], mode: str, duration_s: float) -> None:
        """Many plan nodes ran together (a replayed segment): `duration_s` is shared
        evenly; the same rows as one `node` call each, kept as one span until read (a
        tuple of indices is kept as given, not copied)."""
        if len(plan_indices):
            self._node_log += (plan_indices if type(plan_indices) is tuple else tuple(plan_indices),
                               mode, duration_s)

    def node_log(self) -> list:
        """The list `node` and `node_span` append their rows to, for a caller that times
        a step's nodes between its kernels: extending it directly with the same triples
        (a plan index, or a non-empty tuple of them for a span; the mode; duration_s)
        emits the same rows without a call each. A step's rows wait there, in order,
        and take their place among the events before the next event of another kind
        (or the next read), so the interleaving is exactly that of one call each. It
        stays the same list for the Recording's life."""
        return self._node_log

    def _place_nodes(self) -> None:
        """The logged rows into their tables and the event order. Node rows alone go as
        one block (`_place_node_rows`); a log holding rows of other tables too goes
        whole, as one `_LoggedBlock`: each table it has rows of takes a span over it,
        and the event order a run standing for its rows, all written out in the order
        logged when read (`_expand_spans`, `_write_runs`)."""
        if not self._logged:
            self._place_node_rows()
            return
        log = self._node_log
        block = _LoggedBlock(tuple(log))
        log.clear()
        step = self._step
        self._ne.extend((step, _LoggedTable(block, None), None, None))
        pending = tuple(self._pending.values())
        for marker, (_, table, width) in _LOGGED_ROWS.items():  # a span each (some may hold no row)
            pending[table].extend((step, _LoggedTable(block, marker), *_NONES[:width - 1]))
        self._spans += 1 + len(_LOGGED_ROWS)
        self._logged = False
        self._push_run(CODE_NODE, block)

    def _place_node_rows(self) -> None:
        """The logged node rows into the node table and the event order as one block,
        written out row by row when read (`_expand_spans`, `_write_runs`): a step
        places a block after each run of eager nodes, and a row at a time cost most of
        what the log saves. A lone row goes in as it is: a block keeps two containers."""
        log = self._node_log
        if len(log) == 3:
            k, mode, duration = log
            log.clear()
            if type(k) is tuple:
                self._run(CODE_NODE, len(k))
                self._ne.extend((self._step, k, mode, duration / len(k)))
                self._spans += 1
            else:
                self._event_codes.append(CODE_NODE)
                self._ne.extend((self._step, k, mode, duration))
            return
        block = tuple(log)
        log.clear()
        self._ne.extend((self._step, _FlatRows(block, 3), None, None))
        self._spans += 1
        self._push_run(CODE_NODE, block)

    def buffer(self, event: str, value_id: int, nbytes: int, plan_index: int) -> None:
        """Buffer event: "alloc" | "reuse" | "release" | "pin". Logged among the node
        rows, as are `view`, `alias` and `materialize`: a step emits them between its
        kernels, and placing the logged node rows before each would cost a block each."""
        self._node_log += (LOG_BUFFER, event, value_id, nbytes, plan_index)
        self._logged = True

    def buffer_span(self, rows: tuple) -> None:
        """Many buffer events of this step, each (event, value_id, nbytes, plan_index): the
        same rows as one `buffer` call each, kept as one span until read. `rows` is
        kept as given: pass a tuple."""
        if self._node_log:
            self._place_nodes()
        if rows:
            rows = rows if type(rows) is tuple else tuple(rows)  # a span is told from a row by its tuple
            self._run(CODE_BUFFER, len(rows))
            self._bu.extend((self._step, rows, None, None, None))
            self._spans += 1

    def buffer_rows(self, fields: tuple) -> None:
        """`buffer_span` with the rows' fields one after another in one tuple (event,
        value_id, nbytes, plan_index, then the next row's): no tuple per row for the
        garbage collector to count."""
        if len(fields) % 4:
            raise TraceError(f"buffer_rows: {len(fields)} fields are not whole rows of 4")
        if self._node_log:
            self._place_nodes()
        if fields:
            self._run(CODE_BUFFER, len(fields) // 4)
            self._bu.extend((self._step, _FlatRows(fields, 4), None, None, None))
            self._spans += 1

    def view_span(self, rows: tuple) -> None:
        """Many views of this step, each (value_id, source_id, shape, strides, byte_offset,
        plan_index): the same rows as one `view` call each, kept as one span until read.
        `rows` is kept as given: pass a tuple."""
        if self._node_log:
            self._place_nodes()
        if rows:
            rows = rows if type(rows) is tuple else tuple(rows)  # a span is told from a row by its tuple
            self._run(CODE_VIEW, len(rows))
            self._vi.extend((self._step, rows, None, None, None, None, None))
            self._spans += 1

    def view(self, value_id: int, source_id: int, shape: tuple, strides: tuple, byte_offset: int,
             plan_index: int) -> None:
        """`value_id` is a view of owner `source_id`; strides in elements (may be negative or 0)."""
        self._node_log += (LOG_VIEW, value_id, source_id, shape, strides, byte_offset, plan_index)
        self._logged = True

    def alias(self, value_id: int, into_id: int, plan_index: int) -> None:
        """In place: `value_id` was written into `into_id`'s buffer."""
        self._node_log += (LOG_ALIAS, value_id, into_id, plan_index)
        self._logged = True

    def materialize(self, plan_index: int, value_id: int, nbytes: int, reason: str) -> None:
        """A kernel needed a copy of `value_id` (e.g. a contiguous input)."""
        self._node_log += (LOG_MATERIALIZE, plan_index, value_id, nbytes, reason)
        self._logged = True

    def liveness(self, rows: Iterable[tuple] | None = None,
                 nbytes: tuple[Sequence[int], Sequence[int]] | None = None) -> pd.DataFrame | None:
        """Emit this step's liveness rows; with no argument, return the liveness frame.

        Each row: (value_id, storage, owner_id, nbytes, first_def, last_use, pinned,
        released_at); storage "owner" | "view" | "alias" | "input" | "initializer".
        `nbytes`, (row positions, their nbytes this step), overrides those rows' nbytes:
        a decode step whose values only grew passes its last rows again with it, and
        nothing is copied until the frame is read. Keep both sequences unchanged.
        """
        if rows is None:
            return self.liveness_frame()
        if not self.memory:
            return None
        if self._node_log:
            self._place_nodes()
        if rows is not self._lv_last:
            rows = self._frozen_liveness(rows)
            if not rows:
                return None
            self._lv_last = rows
        if nbytes is not None:
            positions, sizes = nbytes
            checked = self._lv_positions is not None and self._lv_positions[0] is positions \
                and self._lv_positions[1] is rows  # these positions against these rows: checked before
            if len(positions) != len(sizes) or (not checked and positions and not
                                                0 <= min(positions) <= max(positions) < len(rows)):
                raise TraceError(f"liveness nbytes patch: {len(positions)} positions for {len(sizes)} sizes, "
                                 f"positions must lie within the {len(rows)} rows")
            self._lv_positions = (positions, rows)
        self._lv_pending.append((self._step, rows, nbytes))
        self._run(CODE_LIVENESS, len(rows))
        return None

    @staticmethod
    def _frozen_liveness(rows: Iterable[tuple]) -> tuple:
        """`rows` checked and as a tuple of tuples (kept as it is when it already is one:
        a caller that passes the same tuple again, unchanged, is not checked again)."""
        if type(rows) is not tuple or set(map(type, rows)) - {tuple}:
            rows = rows if isinstance(rows, (list, tuple)) else list(rows)
            frozen = tuple(map(tuple, rows))
        else:
            frozen = rows
        if frozen and set(map(len, frozen)) != {_LIVENESS_WIDTH}:
            r = next(r for r in rows if len(r) != _LIVENESS_WIDTH)
            raise TraceError(
                f"liveness row {r!r} has {len(r)} fields; expected {_LIVENESS_WIDTH}: "
                "(value_id, storage, owner_id, nbytes, first_def, last_use, pinned, released_at)")
        return frozen

    def end_step(self, wall_s: float, resident_peak_bytes: int = 0, **extra: Any) -> None:
        """Close the open step; `extra` (token=..., text=...) become columns of `steps()`."""
        if not self._open:
            raise TraceError("end_step() called without an open step (call begin_step() first)")
        if self._node_log:
            self._place_nodes()
        clash = _STEP_RESERVED.intersection(extra)
        if clash:
            raise TraceError(f"end_step(): extra column(s) {sorted(clash)} clash with the steps "
                             f"table's own columns {sorted(_STEP_RESERVED)}")
        s = self._steps
        i = self._step
        s["wall_s"][i] = float(wall_s)
        s["resident_peak_bytes"][i] = int(resident_peak_bytes)
        s["extra"][i] = extra
        self._open = False
        self._event_codes.append(CODE_STEP_ENDED)

    def add_row(self, table: str, **columns: Any) -> None:
        """Append a row to generic table `table` (created on first use).

        A `step` column is filled with the current step unless given. Columns may
        differ between rows: a column's missing entries are None.
        """
        if "seq" in columns:
            raise TraceError(f"add_row({table!r}): column 'seq' is reserved (the frames' emission order)")
        if self._node_log:
            self._place_nodes()
        g = self._generic.get(table)
        if g is None:
            g = self._new_generic(table)
        g.pending.extend((self._step, columns))
        self._event_codes.append(g.code)

    def add_rows(self, table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
        """Append many rows to generic table `table`: the same as one `add_row(table,
        **dict(zip(columns, row)))` per row (a `step` column is filled in likewise).
        `rows` is kept as given: pass a list (or tuple) that is not changed afterwards."""
        if not rows:
            return
        if "seq" in columns:
            raise TraceError(f"add_rows({table!r}): column 'seq' is reserved (the frames' emission order)")
        if self._node_log:
            self._place_nodes()
        g = self._generic.get(table)
        if g is None:
            g = self._new_generic(table)
        g.pending.extend((self._step, (tuple(columns), rows)))
        self._run(g.code, len(rows))

    def add_flat_rows(self, table: str, columns: tuple[str, ...], fields: tuple) -> None:
        """`add_rows` with the rows' fields one after another in one tuple (`len(columns)`
        fields a row), kept as given: no tuple per row for the garbage collector to count."""
        width = len(columns)
        if not width or len(fields) % width:
            raise TraceError(f"add_flat_rows({table!r}): {len(fields)} fields are not whole rows of "
                             f"{width} columns {tuple(columns)}")
        self.add_rows(table, columns, _FlatRows(fields, width))

    def _new_generic(self, table: str) -> _Generic:
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise TraceError(f"table name {table!r}: use letters, digits, '_', '.', '-' "
                             "(it becomes a file name)")
        if table in TABLE_COLUMNS or table in STATIC_COLUMNS:
            raise TraceError(f"table name {table!r} is a built-in table of the Recording")
        g = self._generic[table] = _Generic(GENERIC_CODE_BASE + len(self._generic))
        return g

    # ------------------------------------------------------------------ state

    @property
    def current_step(self) -> int:
        """Index of the most recently begun step (-1 before the first)."""
        return self._step

    @property
    def step_open(self) -> bool:
        return self._open

    @property
    def tables(self) -> list[str]:
        """Names of the generic tables (added with `add_row`)."""
        return list(self._generic)

    def __len__(self) -> int:
        return len(self._steps["step"])

    @property
    def n_events(self) -> int:
        """Events emitted (step begin/end, nodes, buffers, views, ..., liveness rows, generic rows)."""
        return len(self._order)

    def clear(self, static: bool = False) -> None:
        """Drop every step and event (numbering restarts at 0); static tables too if `static`."""
        self._node_log.clear()
        self._logged = False
        self._runs.clear()
        self._lv_pending.clear()
        self._lv_last = self._lv_positions = None
        for rows in self._pending.values():
            rows.clear()
        self._spans = 0
        for cols in self._tables.values():
            for col in cols.values():
                col.clear()
        self._generic.clear()
        self._event_codes.clear()
        self._step = -1
        self._open = False
        if static:
            self.set_static([], [])

    def __repr__(self) -> str:
        n_nodes = len(self._static["nodes"]["plan_index"])
        n_values = len(self._static["values"]["value_id"])
        return (f"Recording(steps={len(self)}, events={len(self._order)}, nodes={n_nodes}, "
                f"values={n_values}, tables={self.tables})")

    # ------------------------------------------------------------------ reading

    def events(self) -> Iterator[Event]:
        """Typed events (see `workbench.trace.events`), built lazily, in emission order."""
        from .events import (
            BufferEvent,
            InPlaceAlias,
            LivenessRow,
            Materialized,
            NodeExecuted,
            StepBegan,
            StepEnded,
            TableRow,
            ViewCreated,
        )

        t = self._t
        s, ne, bu, vi, al, ma, lv = (t[k] for k in ("steps", "node_exec", "buffer", "view", "alias",
                                                    "materialize", "liveness"))
        generic = {g.code: (name, g.cols) for name, g in self._generic.items()}
        pos = [0] * 8
        gpos: dict[int, int] = {}
        current = -1
        for code in self._order:
            if code >= GENERIC_CODE_BASE:
                i = gpos.get(code, 0)
                gpos[code] = i + 1
                name, cols = generic[code]
                row = {k: c[i] for k, c in cols.items()}
                yield TableRow(name, row["step"], row)
                continue
            i = pos[code]
            pos[code] = i + 1
            if code == CODE_NODE:
                yield NodeExecuted(ne["step"][i], ne["plan_index"][i], ne["mode"][i], ne["duration_s"][i])
            elif code == CODE_BUFFER:
                yield BufferEvent(*(bu[c][i] for c in TABLE_COLUMNS["buffer"]))
            elif code == CODE_VIEW:
                yield ViewCreated(vi["step"][i], vi["value_id"][i], vi["source_id"][i],
                                  tuple(vi["shape"][i]), tuple(vi["strides"][i]),
                                  vi["byte_offset"][i], vi["plan_index"][i])
            elif code == CODE_ALIAS:
                yield InPlaceAlias(*(al[c][i] for c in TABLE_COLUMNS["alias"]))
            elif code == CODE_MATERIALIZE:
                yield Materialized(*(ma[c][i] for c in TABLE_COLUMNS["materialize"]))
            elif code == CODE_LIVENESS:
                yield LivenessRow(*(lv[c][i] for c in TABLE_COLUMNS["liveness"]))
            elif code == CODE_STEP_BEGAN:
                current = s["step"][i]
                yield StepBegan(current, s["slot"][i], s["phase"][i], s["bindings"][i])
            else:  # CODE_STEP_ENDED: ends the step most recently begun
                yield StepEnded(current, s["wall_s"][current], s["resident_peak_bytes"][current],
                                s["extra"][current])

    def steps(self) -> pd.DataFrame:
        """One row per step; see `frames.steps_frame`."""
        from .frames import steps_frame
        return steps_frame(self)

    def nodes(self) -> pd.DataFrame:
        """The static plan-node table; see `frames.static_frame`."""
        from .frames import static_frame
        return static_frame(self, "nodes")

    def values(self) -> pd.DataFrame:
        """The static value table; see `frames.static_frame`."""
        from .frames import static_frame
        return static_frame(self, "values")

    def views(self) -> pd.DataFrame:
        """Zero-copy views; see `frames.views_frame`."""
        from .frames import views_frame
        return views_frame(self)

    def liveness_frame(self) -> pd.DataFrame:
        """Per-step value lifetimes; see `frames.liveness_frame`."""
        from .frames import liveness_frame
        return liveness_frame(self)

    def buffer_events(self) -> pd.DataFrame:
        """Buffer alloc/reuse/release/pin; see `frames.buffer_events_frame`."""
        from .frames import buffer_events_frame
        return buffer_events_frame(self)

    def node_timings(self) -> pd.DataFrame:
        """Node executions; see `frames.node_timings_frame`."""
        from .frames import node_timings_frame
        return node_timings_frame(self)

    def aliases(self) -> pd.DataFrame:
        """In-place writes; see `frames.aliases_frame`."""
        from .frames import aliases_frame
        return aliases_frame(self)

    def materializations(self) -> pd.DataFrame:
        """Copies kernels needed; see `frames.materializations_frame`."""
        from .frames import materializations_frame
        return materializations_frame(self)

    def memory_summary(self, alignment: int = 64, heuristics: list[str] | None = None) -> pd.DataFrame:
        """Per step: one-buffer-per-value vs planner peak vs lower bound; see `frames.memory_summary_frame`.

        `heuristics` (default: all of `memory_planner.HEURISTICS`) trades planner
        quality for speed on big plans, e.g. ``["size_first_fit"]``.
        """
        from .frames import memory_summary_frame
        return memory_summary_frame(self, alignment, heuristics)

    def memory_plan(self, step: int, alignment: int = 64, heuristics: list[str] | None = None) -> MemoryPlan:
        """The activation-memory planner's layout for one step (offsets keyed by value id)."""
        from .memory import step_intervals
        from .memory_planner import plan_offsets
        return plan_offsets(step_intervals(self, step), alignment, heuristics)

    def table(self, name: str) -> pd.DataFrame:
        """A generic table (from `add_row`), or a built-in table's raw id-based columns."""
        from .frames import table_frame
        return table_frame(self, name)

    def memo_timeline(self) -> pd.DataFrame:
        """One row per run: what the decode-plan memo did.

        Columns: `step, slot, phase` (prefill/decode/verify), `action` (disabled,
        primed, rebuilt, replayed, ineligible), `reason` (e.g. "first observation",
        "non-varying symbol past_sequence_length changed 7->8"), `varying` (symbols
        seen to change), `invariant_values`, `variant_values`, `resolve_ms` (shape
        resolution time), `stage2` (none/candidate/validated/latched),
        `views_reused`, `dispatch_elided`, `mismatch_streak`. Empty (with these
        columns) when nothing was recorded.
        """
        import pandas as pd

        columns = ["step", *MEMO_COLUMNS]
        if "memo" not in self._generic:
            return pd.DataFrame(columns=columns)
        return self.table("memo")[columns]

    def _named_table(self, name: str, columns: list[str]) -> pd.DataFrame:
        import pandas as pd

        if name not in self._generic:
            return pd.DataFrame(columns=columns)
        frame = self.table(name)
        return frame[[c for c in columns if c in frame.columns]]

    def segments(self) -> pd.DataFrame:
        """One row per segment per step and slot: `step, slot, segment, first_node,
        last_node, node_count, kind` (captured/eager), `state` (captured/replayed/
        retired/eager). A step that ran fully eager shows one eager segment."""
        return self._named_table("capture_segments", ["step", *CAPTURE_SEGMENTS_COLUMNS])

    def capture_declines(self) -> pd.DataFrame:
        """Why each seam node is not captured: `step, slot, segment, plan_index, node,
        op_type, domain, reason, detail, symbols`. Rows are written when a slot's plan
        is segmented (its capture step); `reason` codes are documented in
        `workbench.reasons.DECLINE_REASONS`."""
        return self._named_table("capture_declines", ["step", *CAPTURE_DECLINES_COLUMNS])

    def capture_events(self) -> pd.DataFrame:
        """`step, slot, segment, event` (capture/replay/retire/quarantine), `reason, duration_s`."""
        return self._named_table("capture_events", ["step", *CAPTURE_EVENTS_COLUMNS])

    def divergences(self) -> pd.DataFrame:
        """What shadow verification (`SessionOptions.shadow`) found: one row per value a
        mechanism served differently from eager execution: `step, slot, plan_index,
        node, op_type, value, mechanism` (decode_memo, view_plan, capture_replay,
        if_skip, storage), `max_abs_err, shape_expected, shape_got`. Empty in a sound run."""
        return self._named_table("divergences", ["step", *DIVERGENCES_COLUMNS])

    def rewrites(self) -> pd.DataFrame:
        """What the load-time optimizer changed (`SessionOptions.graph_optimization_level`):
        `rule` (constant_folding, identity_op, dead_node, unread_output, unused_initializer, matvec_layout, the fusion
        rules such as matmul_siblings), `original_nodes`, `original_ops` (the loaded
        graph's nodes replaced, removed or changed), `result` (the initializers or nodes
        standing in their place), `nodes_saved`, `bytes_delta` (resident bytes added,
        negative when freed), `kept` (the original nodes stay in the plan, changed)."""
        return self._named_table("rewrites", ["rule", "original_nodes", "original_ops", "result",
                                              "nodes_saved", "bytes_delta", "kept"])

    def shadow_checks(self) -> pd.DataFrame:
        """One row per shadowed step: `step, slot, checked, divergences, mechanisms`
        (which mechanisms served that step)."""
        return self._named_table("shadow", ["step", *SHADOW_COLUMNS])

    # ------------------------------------------------------------------ persistence

    def save(self, path: str) -> None:
        """Write a directory: one parquet file per non-empty table + meta.json; see `storage`."""
        from .files import save_recording
        save_recording(self, path)

    @classmethod
    def load(cls, path: str) -> Recording:
        """Read a directory written by `save` (parquet + JSON only: no code is executed)."""
        from .files import load_recording
        return load_recording(cls, path)
