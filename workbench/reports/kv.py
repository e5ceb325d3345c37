"""The KV cache step by step: which inputs/outputs are KV, their capacity, used length, bytes.

    reports.kv_pairs(rec)    # past input <-> present output, the sequence axis and its symbols
    reports.kv_growth(rec)   # per step and KV value: capacity, length, address, moved / copied, bytes

KV values are found from the static values table alone: a graph input and a graph
output of the same dtype and rank (>= 3) whose shapes agree on every axis but one,
where both name a (different) symbol -- `past_key_values.0.key [b, 2, past, 16]`
and `present.0.key [b, 2, total, 16]`. Pairs are matched by name (with past/present
and the usual prefixes stripped) and otherwise in order.

Capacity comes from the bytes the step's buffer had (liveness rows), divided by the
bytes of one position along the sequence axis. Addresses, and the capacity of a
caller's buffer a past input is only a view of, are not in the executor's trace
today; when a recording has the optional `io_buffers` table (step, value_id, role,
address, nbytes, base_address, base_nbytes) they are taken from it.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import pandas as pd

from .source import Frames, as_frames
from .views import ITEMSIZE

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["KV_COLUMNS", "kv_growth", "kv_pairs", "kv_value_ids", "new_tokens_symbol", "parse_dims"]

_STRIP = re.compile(r"past_key_values|past_key_value|key_values|present|past|cache|layers?|[^0-9a-z]+")

#: columns of `kv_growth`
KV_COLUMNS = ["step", "slot", "phase", "kv", "io", "value", "seq_axis", "capacity", "length", "free",
              "growth", "bytes", "address", "moved", "copied_bytes", "how", "value_id"]


def parse_dims(text) -> list[str] | None:
    """'[batch_size, 2, past_sequence_length, 16]' -> ['batch_size', '2', 'past_sequence_length', '16']."""
    if not isinstance(text, str) or not text.startswith("["):
        return None
    inner = text[1:-1].strip()
    return [d.strip() for d in inner.split(",")] if inner else []


def _is_symbol(d: str) -> bool:
    return bool(d) and not d.lstrip("-").isdigit() and d != "?"


def _key(name: str) -> str:
    return _STRIP.sub("", name.lower())


def kv_pairs(src: Recording | Frames) -> pd.DataFrame:
    """One row per KV pair: kv (a short key, e.g. "0key"), past (input name), present
    (output name), seq_axis, past_symbol, present_symbol, dtype, past_id, present_id."""
    f = as_frames(src)

    def build() -> pd.DataFrame:
        values = f.get("values")
        ins = values[values["role"] == "input"]
        outs = values[values["role"] == "output"]
        cand_out = []
        for r in outs.itertuples(index=False):
            dims = parse_dims(r.shape)
            if dims is not None and len(dims) >= 3:
                cand_out.append((r, dims))
        rows, used = [], set()
        for r in ins.itertuples(index=False):
            dims = parse_dims(r.shape)
            if dims is None or len(dims) < 3:
                continue
            best = None
            for o, odims in cand_out:
                if o.value_id in used or o.dtype != r.dtype or len(odims) != len(dims):
                    continue
                diff = [i for i, (a, b) in enumerate(zip(dims, odims)) if a != b]
                if len(diff) != 1 or not (_is_symbol(dims[diff[0]]) and _is_symbol(odims[diff[0]])):
                    continue
                score = 0 if _key(o.name) == _key(r.name) else 1
                if best is None or score < best[0]:
                    best = (score, o, diff[0])
            if best is None:
                continue
            _, o, axis = best
            used.add(o.value_id)
            rows.append((_key(r.name) or r.name, r.name, o.name, axis, dims[axis], parse_dims(o.shape)[axis],
                         r.dtype, int(r.value_id), int(o.value_id)))
        return pd.DataFrame(rows, columns=["kv", "past", "present", "seq_axis", "past_symbol", "present_symbol",
                                           "dtype", "past_id", "present_id"])

    return f.memo(("kv_pairs",), build)


def kv_value_ids(src: Recording | Frames) -> set[int]:
    """Value ids of every past input and present output."""
    p = kv_pairs(src)
    return set(p["past_id"]) | set(p["present_id"])


def new_tokens_symbol(src: Recording | Frames) -> str | None:
    """The symbol counting the tokens a step feeds (input_ids' last axis), when there is one."""
    f = as_frames(src)
    values = f.get("values")
    ins = values[values["role"] == "input"]
    kv = kv_value_ids(f)
    ranked = sorted(ins.itertuples(index=False), key=lambda r: ("input_ids" not in r.name, r.value_id))
    for r in ranked:
        dims = parse_dims(r.shape)
        if r.value_id in kv or dims is None or len(dims) != 2 or not _is_symbol(dims[-1]):
            continue
        if str(r.dtype).startswith("int"):
            return dims[-1]
    return None


def _row_bytes(dims: list[str], axis: int, bindings: dict, dtype: str) -> int | None:
    n = 1
    for i, d in enumerate(dims):
        if i == axis:
            continue
        v = bindings.get(d, d)
        try:
            n *= int(v)
        except (TypeError, ValueError):
            return None
    item = ITEMSIZE.get(dtype)
    return n * item if item else None


def kv_growth(src: Recording | Frames) -> pd.DataFrame:
    """Per step and KV value (past input and present output): how the cache grew.

    Columns (`KV_COLUMNS`): step, slot, phase, kv (pair key), io ("past" | "present"),
    value, seq_axis, capacity (positions the step's buffer holds along the sequence
    axis: its bytes / the bytes of one position), length (positions in use: for a
    present, the step's binding of its sequence symbol; for a past, that minus the
    tokens the step fed, else its own binding), free (capacity - length), growth
    (length - the previous step's, same slot), bytes (the buffer's), address (from the
    optional `io_buffers` table; None when not recorded), moved (a present whose buffer
    was newly allocated this step, or whose address changed; None when unknown),
    copied_bytes (bytes the step copied to make the present: the past's used bytes
    when the present's producer reads the past and writes a buffer of its own -- a
    Concat -- plus any materialization of the value), how (a present: "new buffer"
    (allocated this step), "same buffer" (kept from an earlier step), "in place"
    (written into a dead input's buffer), "bound" (the caller's buffer, e.g. a
    shared past/present KV buffer: no executor allocation); a past: "input"), value_id.
    Without the memory tables (`SessionOptions.trace_memory` off) bytes, capacity,
    copied_bytes and a present's how and moved are None: not recorded.
    """
    f = as_frames(src)
    pairs = kv_pairs(f)
    cols = {c: pd.Series([], dtype=object) for c in KV_COLUMNS}
    if pairs.empty:
        return pd.DataFrame(cols)
    values = f.get("values").set_index("value_id")
    steps = f.get("steps")
    lv = f.get("liveness")
    kv_ids = set(pairs["past_id"]) | set(pairs["present_id"])
    lv = lv[lv["value_id"].isin(kv_ids)]
    live = {(int(s), int(v)): (int(b), st) for s, v, b, st in zip(lv["step"], lv["value_id"], lv["bytes"],
                                                                   lv["storage"])}
    be = f.get("buffer_events")
    be = be[be["value_id"].isin(kv_ids) & be["event"].isin(["alloc", "reuse"])]
    buf_event = {(int(s), int(v)): e for s, v, e in zip(be["step"], be["value_id"], be["event"])}
    mats = f.get("materializations")
    mats = mats[mats["value_id"].isin(kv_ids)].groupby(["step", "value_id"])["bytes"].sum().to_dict()
    aliases = f.get("aliases")
    in_place = {(int(s), int(v)): int(i) for s, v, i in zip(aliases["step"], aliases["value_id"], aliases["into_id"])}
    io = f.optional("io_buffers")
    addr: dict[tuple[int, int], tuple] = {}
    if io is not None:
        for r in io.itertuples(index=False):
            base_nb = getattr(r, "base_nbytes", None)
            addr[(int(r.step), int(r.value_id))] = (getattr(r, "address", None), getattr(r, "role", None),
                                                   base_nb if base_nb is not None and not pd.isna(base_nb) else None)
    nodes = f.get("nodes")
    producer_reads = {}
    name_of = dict(zip(values.index, values["name"]))
    for r in pairs.itertuples(index=False):
        prod = nodes[[r.present in outs for outs in nodes["outputs"]]]
        producer_reads[r.present_id] = bool(len(prod)) and r.past in prod["inputs"].iloc[0]
    new_sym = new_tokens_symbol(f)
    rows = []
    last: dict[tuple[str, int], tuple] = {}  # (slot, value id) -> (length, address)
    for s in steps.itertuples(index=False):
        step, b = int(s.step), dict(s.bindings)
        fed = b.get(new_sym) if new_sym else None
        for p in pairs.itertuples(index=False):
            for io_kind, vid, sym in (("past", p.past_id, p.past_symbol), ("present", p.present_id, p.present_symbol)):
                nbytes, _storage = live.get((step, vid), (None, None))
                dims = parse_dims(values.at[vid, "shape"])
                row_b = _row_bytes(dims, p.seq_axis, b, p.dtype)
                a = addr.get((step, vid))
                cap_bytes = a[2] if a is not None and a[2] is not None else nbytes
                capacity = cap_bytes // row_b if cap_bytes is not None and row_b else None
                present_len = b.get(p.present_symbol)
                if io_kind == "present":
                    length = present_len
                elif present_len is not None and fed is not None:
                    length = present_len - fed
                else:
                    length = b.get(sym)
                if length is not None and capacity is not None and nbytes:
                    length = min(int(length), int(capacity))
                address = a[0] if a is not None else None
                prev = last.get((s.slot, vid))
                if io_kind == "past":
                    how, moved = ("bound" if a is not None and a[1] == "bound_output" else "input"), None
                    if address is not None and prev is not None and prev[1] is not None:
                        moved = address != prev[1]
                    copied = int(mats.get((step, vid), 0))
                else:
                    ev = buf_event.get((step, vid))
                    if (step, vid) in in_place:
                        how = "in place"
                    elif (a is not None and a[1] == "bound_output") or ev is None:
                        how = "bound"  # the executor allocated nothing: the caller bound this output
                    else:
                        how = {"alloc": "new buffer", "reuse": "same buffer"}[ev]
                    if address is not None and prev is not None and prev[1] is not None:
                        moved = address != prev[1]
                    elif how == "new buffer" and ev == "alloc":
                        moved = True
                    elif how in ("same buffer", "in place"):
                        moved = False
                    else:
                        moved = None
                    past_len = None
                    past_row = _row_bytes(parse_dims(values.at[p.past_id, "shape"]), p.seq_axis, b, p.dtype)
                    if present_len is not None and fed is not None:
                        past_len = present_len - fed
                    elif p.past_symbol in b:
                        past_len = b[p.past_symbol]
                    copied = int(mats.get((step, vid), 0))
                    if how in ("new buffer", "same buffer") and producer_reads.get(vid) and past_len and past_row:
                        copied += int(past_len) * past_row
                if not f.memory:  # buffer events, copies and in-place writes were not recorded
                    copied = None
                    if io_kind == "present":
                        how, moved = None, None
                growth = None if prev is None or prev[0] is None or length is None else int(length) - int(prev[0])
                last[(s.slot, vid)] = (length, address)
                rows.append((step, s.slot, s.phase, p.kv, io_kind, name_of.get(vid, f"#{vid}"), int(p.seq_axis),
                             capacity, length, None if capacity is None or length is None else capacity - length,
                             growth, nbytes, address, moved, copied, how, vid))
    out = pd.DataFrame(rows, columns=KV_COLUMNS)
    for c in ("capacity", "length", "free", "growth", "bytes"):
        out[c] = pd.array([None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)
                           for v in out[c]], dtype="Int64")
    return out
