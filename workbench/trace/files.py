"""Saving and loading Recordings: a directory of parquet files plus meta.json.

Layout (format "workbench-recording", version 1)::

    meta.json                 format, version, current step, whether the memory tables were
                              recorded, per-table file/rows/column kinds
    event_order.parquet       one row per event: the code of the table it went to
    static_nodes.parquet      static tables (when non-empty)
    static_values.parquet
    steps.parquet             built-in per-step tables, raw id-based columns
    node_exec.parquet  buffer.parquet  view.parquet  alias.parquet
    materialize.parquet  liveness.parquet
    tables/<name>.parquet     generic tables from `add_row`

Only non-empty tables are written. Each column is stored natively when its values
allow and otherwise as JSON text; meta.json records which ("kind"), so loading
rebuilds the exact Python values:

- "int" / "float" / "bool" / "str" / "bytes": one scalar type (None allowed; numpy
  scalars come back as the matching Python scalars);
- "tuple" / "list": sequences of one scalar type; they come back as tuples / lists.
  Shapes and strides (view table) are always tuples;
- "json": anything else (dicts such as step bindings and extras, mixed types,
  nested sequences). Dicts come back as dicts with string keys; sequences inside
  JSON come back as lists; numpy arrays are stored as (nested) lists;
- "tuple_json": every value a tuple, but not of one scalar type: JSON, and each
  value comes back as a tuple (its nested sequences as lists);
- "null": every value None.

Loading reads parquet and JSON only: it never unpickles or executes anything.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .recording import (
    GENERIC_CODE_BASE,
    STATIC_COLUMNS,
    TABLE_COLUMNS,
    Recording,
    TraceError,
    _Generic,
)

FORMAT = "workbench-recording"
VERSION = 1

__all__ = ["FORMAT", "VERSION", "load_recording", "save_recording"]

_SCALAR_NAMES = {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes"}
#: columns whose sequences are always tuples, whatever the caller passed
_FORCE_TUPLE = {("view", "shape"), ("view", "strides")}


def _arrow_type(kind: str):
    import pyarrow as pa
    return {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "str": pa.string(),
            "bytes": pa.binary()}[kind]


def _scalar_kind(t: type) -> str | None:
    name = _SCALAR_NAMES.get(t)
    if name is not None:
        return name
    if issubclass(t, np.bool_):
        return "bool"
    if issubclass(t, np.integer):
        return "int"
    if issubclass(t, np.floating):
        return "float"
    if issubclass(t, str):
        return "str"
    return None


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot store a {type(o).__name__} in a recording: {o!r}")


def _py(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _encode(values: list, force_tuple: bool = False):
    """(pyarrow array, kind) for one column; see the module docstring."""
    import pyarrow as pa

    types = set(map(type, values))
    types.discard(type(None))
    if not types:
        return pa.nulls(len(values)), "null"
    seq_kind = None
    if types <= {tuple, list} and (force_tuple or len(types) == 1):
        seq_kind = "tuple" if (force_tuple or tuple in types) else "list"
        inner = {_scalar_kind(t) for t in set(map(type, itertools.chain.from_iterable(
            v for v in values if v is not None)))}
        if len(inner) <= 1 and None not in inner:
            elem = inner.pop() if inner else "int"
            try:
                data = [None if v is None else [_py(x) for x in v] for v in values]
                return pa.array(data, type=pa.list_(_arrow_type(elem))), seq_kind
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                pass
    elif len(types) == 1:
        kind = _scalar_kind(next(iter(types)))
        if kind is not None:
            try:
                data = values if next(iter(types)) in _SCALAR_NAMES else [_py(v) for v in values]
                return pa.array(data, type=_arrow_type(kind)), kind
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                pass
    text = [json.dumps(v, default=_json_default, allow_nan=True) for v in values]
    return pa.array(text, type=pa.string()), ("tuple_json" if seq_kind == "tuple" else "json")


def _decode(values: list, kind: str) -> list:
    if kind == "null":
        return [None] * len(values)
    if kind == "tuple":
        return [None if v is None else tuple(v) for v in values]
    if kind == "json":
        return [json.loads(v) for v in values]
    if kind == "tuple_json":
        return [None if v is None else tuple(v) for v in (json.loads(s) for s in values)]
    if kind in ("int", "float", "bool", "str", "bytes", "list"):
        return values
    raise TraceError(f"recording column kind {kind!r} is unknown to this version of workbench")


def _write(path: Path, cols: dict[str, list], table: str) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays, kinds = [], []
    for name, values in cols.items():
        try:
            arr, kind = _encode(values, (table, name) in _FORCE_TUPLE)
        except (TypeError, ValueError) as e:
            raise TraceError(f"table {table!r}, column {name!r}: {e}") from e
        arrays.append(arr)
        kinds.append([name, kind])
    pq.write_table(pa.Table.from_arrays(arrays, names=list(cols)), path)
    return {"rows": len(next(iter(cols.values()))) if cols else 0, "columns": kinds}


def _read(path: Path, info: dict) -> dict[str, list]:
    import pyarrow.parquet as pq

    data = pq.read_table(path).to_pydict()
    out = {}
    for name, kind in info["columns"]:
        if name not in data:
            raise TraceError(f"{path}: column {name!r} listed in meta.json is missing")
        out[name] = _decode(data[name], kind)
        if len(out[name]) != info["rows"]:
            raise TraceError(f"{path}: column {name!r} has {len(out[name])} rows, meta.json says "
                             f"{info['rows']}")
    return out


def save_recording(rec: Recording, path: str | os.PathLike) -> None:
    """Write `rec` to directory `path` (created if needed; files of an earlier save replaced)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    (root / "tables").mkdir(exist_ok=True)
    written: set[Path] = set()
    meta: dict[str, Any] = {
        "format": FORMAT, "version": VERSION,
        "current_step": rec._step, "step_open": rec._open, "memory": rec.memory,
        "n_steps": len(rec), "n_events": len(rec._order),
        "static": {}, "tables": {}, "generic": {},
    }
    for name, cols in rec._static.items():
        if cols and len(next(iter(cols.values()))):
            f = root / f"static_{name}.parquet"
            meta["static"][name] = {"file": f.name, **_write(f, cols, name)}
            written.add(f)
        else:
            meta["static"][name] = {"file": None, "rows": 0, "columns": [[c, "null"] for c in cols]}
    for name, cols in rec._t.items():
        if cols["step"]:
            f = root / f"{name}.parquet"
            meta["tables"][name] = {"file": f.name, **_write(f, cols, name)}
            written.add(f)
    for name, g in rec._generic.items():
        f = root / "tables" / f"{name}.parquet"
        meta["generic"][name] = {"file": f"tables/{name}.parquet", "code": g.code, **_write(f, g.cols, name)}
        written.add(f)
    if rec._order:
        import pyarrow as pa
        import pyarrow.parquet as pq

        f = root / "event_order.parquet"
        pq.write_table(pa.table({"code": pa.array(rec._order, type=pa.int32())}), f)
        meta["event_order"] = f.name
        written.add(f)
    else:
        meta["event_order"] = None
    # drop files a previous save of another recording left behind (only our own names)
    stale = [root / f"{n}.parquet" for n in TABLE_COLUMNS] + \
        [root / f"static_{n}.parquet" for n in STATIC_COLUMNS] + [root / "event_order.parquet"] + \
        list((root / "tables").glob("*.parquet"))
    for f in stale:
        if f not in written and f.exists():
            f.unlink()
    (root / "meta.json").write_text(json.dumps(meta, indent=1, allow_nan=True))


def load_recording(cls: type[Recording], path: str | os.PathLike) -> Recording:
    """Read a directory written by `save_recording` into a new `cls` instance."""
    root = Path(path)
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise TraceError(f"{root} is not a saved recording: meta.json is missing")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise TraceError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise TraceError(f"{meta_path}: version {meta.get('version')!r}; this workbench reads version "
                         f"{VERSION}")
    rec = cls(memory=bool(meta.get("memory", True)))  # recordings saved before the option had them all
    for name, info in meta["static"].items():
        if name not in STATIC_COLUMNS:
            raise TraceError(f"{meta_path}: unknown static table {name!r}")
        if info["file"] is None:
            rec._static[name] = {c: [] for c, _ in info["columns"]}
        else:
            rec._static[name] = _read(root / info["file"], info)
    for name, info in meta["tables"].items():
        if name not in TABLE_COLUMNS:
            raise TraceError(f"{meta_path}: unknown table {name!r}")
        data = _read(root / info["file"], info)
        for c, col in rec._t[name].items():  # extend in place: the hot-path references stay valid
            if c not in data:
                raise TraceError(f"{root / info['file']}: column {c!r} is missing")
            col.extend(data[c])
    for name, info in sorted(meta["generic"].items(), key=lambda kv: kv[1]["code"]):
        code = int(info["code"])
        if code < GENERIC_CODE_BASE:
            raise TraceError(f"{meta_path}: generic table {name!r} has a reserved code {code}")
        g = _Generic(code)
        g.cols = _read(root / info["file"], info)
        g.n = int(info["rows"])
        rec._generic[name] = g
    if meta.get("event_order"):
        import pyarrow.parquet as pq

        rec._order.extend(pq.read_table(root / meta["event_order"]).column("code").to_pylist())
    if len(rec._order) != meta.get("n_events", len(rec._order)):
        raise TraceError(f"{root}: event order has {len(rec._order)} events, meta.json says "
                         f"{meta['n_events']}")
    rec._step = int(meta["current_step"])
    rec._open = bool(meta["step_open"])
    return rec
