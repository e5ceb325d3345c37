"""ONNX -> workbench Graph.

Loading is the trust boundary for untrusted models: nothing here executes code
from the model, and external-data locations must stay inside the model's folder.
"""

from __future__ import annotations

import itertools
import mmap
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.message import DecodeError
from onnx import external_data_helper, helper, numpy_helper

from ..errors import ModelLoadError
from .contrib_schemas import contrib_shape_inference
from .graph import Graph, LoadNote, Node, Value
from .scoped_names import restore_names, scope_names
from .validate import check_model, check_strings
from .wire import LiftedBytes, lift_weights


def read_model(model: Any, weights: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """Parse the caller's model (path, bytes or ModelProto) with external data resolved safely.

    Main-graph initializers kept in external files, and the large ones embedded in a
    model file, are memory-mapped read-only into `weights` (name -> array) instead of
    being read into the proto: no copy at load, and pages are read as kernels touch them."""
    lifted: list[LiftedBytes] = []
    if isinstance(model, onnx.ModelProto):
        proto, base_dir = onnx.ModelProto(), None
        proto.CopyFrom(model)  # loading moves weights out of the proto: never the caller's
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto, base_dir = _parse_bytes(bytes(model), "<bytes>"), None
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        proto, lifted = _read_model_file(path)
        base_dir = path.resolve().parent
    else:
        raise ModelLoadError(
            f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}"
        )
    weights = {} if weights is None else weights
    check_strings(proto)  # before anything reads a name or an external-data location
    _load_external_data(proto, base_dir, weights)
    if lifted:
        _map_lifted(path, proto, lifted, weights)
    return proto


def _read_model_file(path: Path) -> tuple[onnx.ModelProto, list[LiftedBytes]]:
    """The model file parsed without its large embedded weights (`wire.lift_weights`:
    they are mapped from the file afterwards), or parsed whole where that does not apply."""
    lifted: list[LiftedBytes] = []
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
                data = f.read()
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as whole:
                    view = memoryview(whole)
                    try:
                        found = lift_weights(view, LARGE_INITIALIZER)
                        data, lifted = found if found is not None else (bytes(view), [])
                    finally:
                        view.release()  # the map closes with no view of it left
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read model file {str(path)!r}: {getattr(e, 'strerror', None) or e}"
                             ) from None
    return _parse_bytes(data, str(path)), lifted


def _map_lifted(path: Path, proto: onnx.ModelProto, lifted: list[LiftedBytes],
                weights: dict[str, np.ndarray]) -> None:
    """Lifted initializers become read-only maps of the model file (as external data
    is mapped); one that is no plain array (bfloat16, packed int4, a segment, a
    repeated name) gets its bytes back into the proto, as a plain parse would have."""
    initializers = proto.graph.initializer
    with open(path, "rb") as f:
        for item in lifted:
            t = initializers[item.index]
            if external_data_helper.uses_external_data(t):
                continue  # external data wins over raw_data, as onnx loads it
            dtype = _plain_dtype(t.data_type)
            if dtype is None or t.HasField("segment") or t.name in weights:
                f.seek(item.offset)
                t.raw_data = f.read(item.length)
                continue
            dims = _checked_dims(t, dtype, item.length)
            try:
                weights[t.name] = _mapped(path, dtype, item.offset, dims)
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"initializer {t.name!r}: cannot map it from {str(path)!r}: {e}") from None
            _mark_set_aside(t)


def _mapped(path: Path, dtype: np.dtype, offset: int, dims: tuple) -> np.ndarray:
    """A read-only plain ndarray over the file's bytes (kernels see no memmap subclass);
    read into memory of its own where `offset` is misaligned for `dtype` (an embedded
    raw_data lands wherever the protobuf put it): numpy copies an unaligned array
    before most kernels use it, and did so every step (torch.onnx's SmolLM2 embedding,
    113 MB at an odd offset: a 30 ms Gather per token)."""
    mapped = np.asarray(np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=dims))
    if mapped.flags.aligned:
        return mapped
    aligned = mapped.copy()
    aligned.flags.writeable = False
    return aligned


def _parse_bytes(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as e:
        raise ModelLoadError(f"{where} is not a valid ONNX model (protobuf decode failed: {e})") from None
    # protobuf accepts many garbage byte strings as an empty message
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise ModelLoadError(
            f"{where} is not a valid ONNX model (no ir_version or graph; truncated or not ONNX?)"
        )
    return proto


def _load_external_data(proto: onnx.ModelProto, base_dir: Path | None, weights: dict[str, np.ndarray]) -> None:
    tensors = [
        t for t in external_data_helper._get_all_tensors(proto)
        if external_data_helper.uses_external_data(t)
    ]
    if not tensors:
        return
    if base_dir is None:
        raise ModelLoadError(
            f"initializer {tensors[0].name!r} keeps its data in an external file; "
            "load the model from its path so the file can be found next to it"
        )
    root = base_dir.resolve()
    main_initializers = {t.name for t in proto.graph.initializer}
    for tensor in tensors:
        dtype = _plain_dtype(tensor.data_type)
        if tensor.name in main_initializers and tensor.name not in weights and dtype is not None:
            weights[tensor.name] = _map_external(root, tensor, dtype)
            continue  # stays external in the proto: shape inference needs its dims only
        tensor.raw_data = _read_external(root, tensor)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def _plain_dtype(data_type: int) -> np.dtype | None:
    """The numpy dtype of a tensor whose bytes are a plain little-endian array (None
    for strings, packed 4/2-bit types, bfloat16 / float8 and anything else onnx decodes)."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
    except (KeyError, TypeError, ValueError):
        return None
    if data_type in _DECODED_TYPES or dtype.hasobject or dtype.kind not in "biufc":
        return None
    return dtype.newbyteorder("<")


#: element types whose numpy form onnx builds by decoding, not by viewing bytes
_DECODED_TYPES = frozenset(
    getattr(onnx.TensorProto, name) for name in (
        "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4",
        "FLOAT4E2M1", "UINT2", "INT2", "FLOAT8E8M0") if hasattr(onnx.TensorProto, name))


def _map_external(root: Path, tensor: onnx.TensorProto, dtype: np.dtype) -> np.ndarray:
    """A read-only memory map of one external initializer, checked against its dims."""
    what = f"initializer {tensor.name!r}"
    entries = {e.key: e.value for e in tensor.external_data}
    if "location" not in entries:
        raise ModelLoadError(f"{what} is marked as external data but has no 'location' entry")
    offset = _external_int(entries, "offset", what)
    length = _external_int(entries, "length", what)
    target = _safe_location(root, entries["location"], tensor.name)
    dims = tuple(tensor.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{what} has negative dims {list(dims)}")
    want = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    size = target.stat().st_size
    span = want if length is None else length
    if length is None and offset <= size < offset + want:
        raise ModelLoadError(f"{what} has dims {list(dims)} ({int(np.prod(dims))} {dtype} elements, {want} "
                             f"bytes) but its external data {entries['location']!r} stores {size - offset} "
                             f"bytes from offset {offset}")
    if offset > size or offset + span > size:
        said = f"offset {offset}" + (f" + length {length} = {offset + length}" if length is not None
                                     else f" + {want} bytes = {offset + want}")
        raise ModelLoadError(f"{what}: external data {entries['location']!r} is {size} bytes, but {said} "
                             "reaches past its end (truncated weights file?)")
    if length is not None and length != want:
        raise ModelLoadError(f"{what} has dims {list(dims)} ({want} bytes of {dtype}) but its external "
                             f"data entry says length {length}")
    if want == 0:
        return np.zeros(dims, dtype)
    try:
        return _mapped(target, dtype, offset, dims)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{what}: cannot map external data {entries['location']!r}: {e}") from None


MAX_LOCATION = 4096  # characters: longer external-data locations are refused outright


def _read_external(root: Path, tensor: onnx.TensorProto) -> bytes:
    """The bytes of one external tensor, read only from a regular file inside `root`."""
    what = f"initializer {tensor.name!r}"
    entries = {e.key: e.value for e in tensor.external_data}
    if "location" not in entries:
        raise ModelLoadError(f"{what} is marked as external data but has no 'location' entry")
    location = entries["location"]
    offset = _external_int(entries, "offset", what)
    length = _external_int(entries, "length", what)
    target = _safe_location(root, location, tensor.name)
    try:
        with open(target, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            end = size if length is None else offset + length
            if offset > size or end > size:
                span = f"offset {offset}" + ("" if length is None else f" + length {length}")
                raise ModelLoadError(
                    f"{what}: external data {location!r} is {size} bytes, but {span} = {end} "
                    "reaches past its end (truncated weights file?)"
                )
            f.seek(offset)
            raw = f.read(end - offset)
    except OSError as e:
        raise ModelLoadError(f"{what}: cannot read external data {location!r}: {e.strerror or e}") from None
    if len(raw) != end - offset:
        raise ModelLoadError(
            f"{what}: external data {location!r} gave {len(raw)} bytes, expected {end - offset}"
        )
    return raw


def _external_int(entries: dict[str, str], key: str, what: str) -> int | None:
    text = entries.get(key)
    if text is None or text == "":
        return 0 if key == "offset" else None
    try:
        value = int(text)
    except ValueError:
        raise ModelLoadError(f"{what}: external data {key} {text[:40]!r} is not an integer") from None
    if value < 0:
        raise ModelLoadError(f"{what}: external data {key} {value} is negative")
    return value


def _safe_location(root: Path, location: str, tensor_name: str) -> Path:
    what = f"initializer {tensor_name!r}"
    if not location:
        raise ModelLoadError(f"{what}: external data location is empty")
    if "\x00" in location:
        raise ModelLoadError(f"{what}: external data location {location[:80]!r} contains a NUL byte")
    if len(location) > MAX_LOCATION:
        raise ModelLoadError(
            f"{what}: external data location is {len(location)} characters long "
            f"(at most {MAX_LOCATION}): {location[:60]!r}..."
        )
    if os.path.isabs(location) or Path(location).is_absolute() or location.startswith(("/", "\\")):
        raise ModelLoadError(
            f"{what}: external data location {location!r} is absolute; "
            "only paths inside the model's folder are allowed"
        )
    try:
        target = (root / location).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a name too long, ...
        raise ModelLoadError(f"{what}: external data location {location[:80]!r} cannot be resolved: {e}") from None
    if target != root and root not in target.parents:
        raise ModelLoadError(
            f"{what}: external data location {location!r} escapes the "
            f"model's folder {str(root)!r}"
        )
    try:
        kind = "is not a regular file" if not stat.S_ISREG(target.stat().st_mode) else ""
    except OSError as e:
        kind = "does not exist" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror or e})"
    if kind:  # a directory, a FIFO (which would block the read), a device, or missing
        raise ModelLoadError(f"{what}: external data location {location!r} {kind} (in {str(root)!r})")
    return target


def prepare(proto: onnx.ModelProto, weights: dict[str, np.ndarray] | None = None,
            notes: list[LoadNote] | None = None) -> onnx.ModelProto:
    """Inline model-local functions, then run ONNX shape inference (best effort).

    Large embedded weights move into `weights` (name -> array, viewing the bytes
    protobuf handed out: no decode, no copy back); the returned proto keeps their dims
    only, so neither inference nor anything after it copies weight bytes around.

    A domain the nodes use but the model does not import is imported as version 1
    (onnxruntime reads it so: `optimize_model` at opt_level 0 writes com.microsoft nodes
    without the import); a value_info entry contradicting the initializer it names is
    dropped; where shape inference fails, it is run again past the failure (best
    effort). Each is appended to `notes`, never silent."""
    weights = {} if weights is None else weights
    notes = [] if notes is None else notes
    if proto.functions:
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:  # noqa: BLE001 - the inliner raises assorted C++ errors
            raise ModelLoadError(f"cannot inline the model's local functions: {e}") from None
    _import_used_domains(proto, notes)
    _drop_contradicting_value_info(proto, notes)
    _set_weights_aside(proto, weights)
    # onnx's data propagation keys values by name across the model's graphs: subgraph
    # names are made unique for inference and given back after (`scoped_names`)
    restores = scope_names(proto)
    with contrib_shape_inference(opset_map(proto)):
        try:
            # strict first: a failure is reported (a partial inference would hide it) ...
            proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
        except Exception as e:  # noqa: BLE001 - onnx raises assorted inference errors
            notes.append(_inference_note(e))
            try:  # ... then as far as it gets; the rest is resolved just in time
                proto = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
            except Exception:  # noqa: BLE001 - already noted: shapes resolved just in time
                pass
            restore_names(proto, restores)
            return proto
    restore_names(proto, restores)
    untyped = _untyped_nodes(proto.graph)
    if untyped:  # onnx passes over ops it has no schema for without a word
        ops = sorted({n.op_type if not n.domain else f"{n.domain}::{n.op_type}" for n in untyped})
        notes.append(LoadNote(
            rule="shape_inference_incomplete", nodes=tuple(n.name or n.op_type for n in untyped),
            ops=tuple(n.op_type for n in untyped),
            detail=f"ONNX shape inference left the outputs of {len(untyped)} node(s) untyped (no schema or no "
                   f"inference for {', '.join(ops[:8])}{' ...' if len(ops) > 8 else ''}); those values get their "
                   "dtype and shape at run time"))
    return proto


def _untyped_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The main graph's nodes with an output shape inference gave no element type."""
    typed = {v.name for v in itertools.chain(graph.input, graph.output, graph.value_info)
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
             or v.type.HasField("sequence_type") or v.type.HasField("optional_type") or v.type.HasField("map_type")}
    typed.update(t.name for t in graph.initializer)
    return [n for n in graph.node if any(o and o not in typed for o in n.output)]


def _all_nodes(graph: onnx.GraphProto) -> Any:
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g)


def _import_used_domains(proto: onnx.ModelProto, notes: list[LoadNote]) -> None:
    imported = set(opset_map(proto))
    missing: dict[str, list[onnx.NodeProto]] = {}
    for node in _all_nodes(proto.graph):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if domain not in imported:
            missing.setdefault(domain, []).append(node)
    for domain, nodes in sorted(missing.items()):
        proto.opset_import.append(helper.make_opsetid(domain, 1))
        notes.append(LoadNote(
            rule="opset_import_assumed", nodes=tuple(n.name or n.op_type for n in nodes),
            ops=tuple(n.op_type for n in nodes),
            detail=f"domain {domain!r} is used by {len(nodes)} node(s) but not imported; read as version 1 "
                   "(as onnxruntime does)"))


def _drop_contradicting_value_info(proto: onnx.ModelProto, notes: list[LoadNote]) -> None:
    """Drop the main graph's value_info entries that contradict the tensor they name (an
    initializer, or a Constant node's `value`: another element type, rank or dim): that
    tensor is the value, as onnxruntime takes it. onnxruntime's optimizer has written a
    scale initializer of dims [1] with a scalar value_info, and onnxruntime-genai's builder
    a Constant [1] declared as a scalar; onnx's inference stops at the contradiction,
    leaving everything after it untyped (no fusion can read those values' dtypes)."""
    tensors = {t.name: t for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                         None)
            if value is not None:
                tensors[node.output[0]] = value
    wrong = [v for v in proto.graph.value_info if v.name in tensors and _contradicts(v, tensors[v.name])]
    if not wrong:
        return
    names = {v.name for v in wrong}
    kept = [v for v in proto.graph.value_info if v.name not in names]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)
    listed = ", ".join(sorted(names)[:8]) + (" ..." if len(names) > 8 else "")
    notes.append(LoadNote(
        rule="value_info_dropped", nodes=(), ops=(),
        detail=f"value_info of {len(names)} value(s) contradicted the initializer or Constant that is the value "
               f"({listed}); dropped: that tensor's own dtype and dims stand, as in onnxruntime"))


def _contradicts(info: onnx.ValueInfoProto, tensor: onnx.TensorProto) -> bool:
    if not info.type.HasField("tensor_type"):
        return True  # the value is a tensor
    declared = info.type.tensor_type
    if declared.elem_type and declared.elem_type != tensor.data_type:
        return True
    if not declared.HasField("shape"):
        return False
    dims = declared.shape.dim
    return len(dims) != len(tensor.dims) or any(
        d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, tensor.dims))


def _inference_note(e: Exception) -> LoadNote:
    message = " ".join(str(e).split())
    if len(message) > 400:
        message = message[:400] + " ..."
    node = ""
    if "node name " in message:  # onnx names the node: "... for node name X. ..."
        node = message.split("node name ", 1)[1].split(" ", 1)[0].rstrip(".:,")
    return LoadNote(rule="shape_inference_failed", nodes=(node,) if node else (), ops=(),
                    detail=f"ONNX shape inference failed ({type(e).__name__}: {message}); it went on past the "
                           "failure where it could, values it left untyped get their dtype and shape at run time")


LARGE_INITIALIZER = 4096  # bytes: bigger initializers never feed shape computations
SET_ASIDE = "set-aside-by-the-workbench-loader"  # the location a set-aside weight points to


def _set_weights_aside(proto: onnx.ModelProto, weights: dict[str, np.ndarray]) -> None:
    for t in proto.graph.initializer:
        if not t.HasField("raw_data") or t.name in weights or t.HasField("segment"):
            continue
        dtype = _plain_dtype(t.data_type)
        if dtype is None:
            continue  # decoded by onnx (bfloat16, packed int4, ...): left in the proto
        raw = t.raw_data  # protobuf hands out a copy on every access: take it once
        if len(raw) <= LARGE_INITIALIZER:
            continue
        dims = _checked_dims(t, dtype, len(raw))
        weights[t.name] = np.frombuffer(raw, dtype=dtype).reshape(dims)  # a read-only view, no copy
        t.ClearField("raw_data")
        _mark_set_aside(t)


def _checked_dims(t: onnx.TensorProto, dtype: np.dtype, nbytes: int) -> tuple[int, ...]:
    """The tensor's dims, checked against its `nbytes` of raw data (the check validation
    would make, before the bytes leave the proto)."""
    dims = tuple(t.dims)
    want = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize if all(d >= 0 for d in dims) else -1
    if nbytes != want:
        raise ModelLoadError(f"initializer {t.name!r} has dims {list(dims)} ({want} bytes of {dtype}) "
                             f"but stores {nbytes} bytes of raw_data")
    return dims


def _mark_set_aside(t: onnx.TensorProto) -> None:
    """The proto keeps the tensor's dims only; its values live in the loader's weights."""
    t.data_location = onnx.TensorProto.EXTERNAL  # never read from here
    entry = t.external_data.add()
    entry.key, entry.value = "location", SET_ASIDE


def opset_map(proto: onnx.ModelProto) -> dict[str, int]:
    opsets = {}
    for imp in proto.opset_import:
        domain = "" if imp.domain in ("", "ai.onnx") else imp.domain
        opsets[domain] = imp.version
    opsets.setdefault("", 1)
    return opsets


class GraphBuilder:
    """Turns a GraphProto (and its subgraphs) into workbench Graphs."""

    def __init__(self, opsets: dict[str, int], weights: dict[str, np.ndarray] | None = None):
        self.opsets = opsets
        self.weights = weights or {}  # main-graph initializers set aside or memory-mapped
        self._fresh = itertools.count()

    def build(self, gp: onnx.GraphProto, outer: Callable[[str], Value | None] | None = None) -> Graph:
        """`outer(name)`: the enclosing scopes' value of that name (None: not visible);
        a subgraph's reads of it take its type and shape, which the subgraph's own
        value_info does not repeat (a kernel tells an omitted input by its dtype)."""
        outer = outer or _nothing_visible
        g = Graph(name=gp.name, values=[], nodes=[], inputs=[], outputs=[], initializers={},
                  opsets=self.opsets)
        infos: dict[str, onnx.ValueInfoProto] = {}
        for vi in itertools.chain(gp.input, gp.output, gp.value_info):
            infos.setdefault(vi.name, vi)

        def value_id(name: str) -> int:
            vid = g.by_name.get(name)
            if vid is None:
                vid = len(g.values)
                g.by_name[name] = vid
                g.values.append(self._value(vid, name, infos.get(name)))
            return vid

        init_names = set()
        for t in gp.initializer:
            vid = value_id(t.name)
            arr = self._initializer(t, main=outer is _nothing_visible)
            g.initializers[vid] = arr
            v = g.values[vid]
            v.elem_type, v.dtype, v.shape = t.data_type, arr.dtype, tuple(arr.shape)
            init_names.add(t.name)
        for st in gp.sparse_initializer:
            arr = _sparse_to_array(st)
            vid = value_id(st.values.name)
            g.initializers[vid] = arr
            v = g.values[vid]
            v.elem_type, v.dtype, v.shape = st.values.data_type, arr.dtype, tuple(arr.shape)
            init_names.add(st.values.name)
        for vi in gp.input:
            if vi.name not in init_names:
                g.inputs.append(value_id(vi.name))

        # names this graph defines itself, wherever in the node list (validation has
        # checked each is defined once and that the nodes can be ordered)
        local = set(g.by_name) | {name for np_ in gp.node for name in np_.output if name}
        captured: dict[str, int] = {}

        def read(name: str) -> int:
            if name not in local and name not in captured:
                source = outer(name)
                if source is not None:
                    captured[name] = vid = value_id(name)
                    _inherit_type(g.values[vid], source)
            return value_id(name)

        def visible(name: str) -> Value | None:
            """What this graph's subgraphs see under `name`."""
            if name in g.by_name:
                return g.values[g.by_name[name]]
            if name in local:  # produced by a later node: its inferred type, if any
                return self._value(-1, name, infos.get(name))
            return outer(name)
        for i, np_ in enumerate(gp.node):
            ins = [read(name) if name else -1 for name in np_.input]
            subgraphs, outer_reads = {}, []
            attrs = {}
            for a in np_.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    sub = self.build(a.g, visible)
                    subgraphs[a.name] = sub
                    outer_reads.extend(sub.values[vid].name for vid in sub.outer_inputs)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    raise ModelLoadError(f"node {np_.name!r}: GRAPHS attributes are not supported")
                else:
                    attrs[a.name] = _attr_value(a)
            cap_ids = [read(name) for name in dict.fromkeys(outer_reads)]
            outs = []
            for name in np_.output:
                if not name:
                    outs.append(-1)
                    continue
                outs.append(value_id(name))
            g.nodes.append(Node(
                index=i, name=np_.name or f"{np_.op_type}_{i}", op_type=np_.op_type,
                domain="" if np_.domain == "ai.onnx" else np_.domain,
                inputs=tuple(ins), outputs=tuple(outs), attrs=attrs,
                subgraphs=subgraphs, outer_reads=tuple(cap_ids), proto=np_,
            ))
        g.outputs = [read(vi.name) for vi in gp.output]
        g.outer_inputs = list(captured.values())
        return g

    def _initializer(self, t: onnx.TensorProto, main: bool) -> np.ndarray:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            return _tensor_to_array(t)
        arr = self.weights.get(t.name) if main else None
        if arr is None or tuple(arr.shape) != tuple(t.dims):
            raise ModelLoadError(f"initializer {t.name!r}: its external data was not loaded")
        return arr

    def _value(self, vid: int, name: str, vi: onnx.ValueInfoProto | None) -> Value:
        if vi is None or not vi.type.HasField("tensor_type"):
            kind = "unknown" if vi is None else vi.type.WhichOneof("value") or "unknown"
            kind = {"tensor_type": "tensor", "sequence_type": "sequence",
                    "optional_type": "optional", "map_type": "map"}.get(kind, kind)
            return Value(vid, name, 0, None, None, kind=kind)
        tt = vi.type.tensor_type
        dtype = None
        if tt.elem_type:
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
            except (KeyError, TypeError, ValueError):
                dtype = None
        shape = None
        if tt.HasField("shape"):
            shape = tuple(self._dim(d) for d in tt.shape.dim)
        return Value(vid, name, tt.elem_type, dtype, shape)

    def _dim(self, d: onnx.TensorShapeProto.Dimension) -> int | str:
        # defensive: shape inference output is not re-validated, and some exporters
        # write -1 for "dynamic"; anything but a non-negative int or a text symbol is unknown
        if d.HasField("dim_value"):
            if d.dim_value >= 0:
                return int(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param and isinstance(d.dim_param, str):
            return d.dim_param
        return f"unk_{next(self._fresh)}"


def _nothing_visible(name: str) -> None:
    return None


def _inherit_type(v: Value, source: Value) -> None:
    """An outer-scope value read inside a subgraph: the enclosing graph's type and shape,
    where the subgraph declares none of its own."""
    if v.dtype is None and source.dtype is not None:
        v.elem_type, v.dtype, v.kind = source.elem_type, source.dtype, source.kind
    if v.shape is None and source.shape is not None:
        v.shape = source.shape


def _tensor_to_array(t: onnx.TensorProto) -> np.ndarray:
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - malformed tensors raise assorted errors
        raise ModelLoadError(f"initializer {t.name!r} cannot be decoded: {e}") from None


def _sparse_to_array(st: onnx.SparseTensorProto) -> np.ndarray:
    values = _tensor_to_array(st.values)
    indices = _tensor_to_array(st.indices)
    try:
        dense = np.zeros(tuple(st.dims), dtype=values.dtype)
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values
        else:
            dense[tuple(indices.T)] = values
    except (IndexError, ValueError, TypeError, MemoryError) as e:
        raise ModelLoadError(
            f"sparse initializer {st.values.name!r} (dims {list(st.dims)}): its indices "
            f"{list(indices.shape)} and values {list(values.shape)} do not fit: {e}"
        ) from None
    return dense


def _attr_value(a: onnx.AttributeProto) -> Any:
    if a.ref_attr_name:
        raise ModelLoadError(f"attribute {a.name!r} refers to a function attribute outside a function")
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return _tensor_to_array(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode("utf-8", errors="replace") for s in v]
    if isinstance(v, list) and v and isinstance(v[0], onnx.TensorProto):
        return [_tensor_to_array(x) for x in v]
    return v


def load_graph(model: Any) -> tuple[Graph, onnx.ModelProto]:
    """Read, validate, inline and shape-infer a model; return its main Graph and the prepared proto."""
    weights: dict[str, np.ndarray] = {}
    notes: list[LoadNote] = []
    proto = prepare(read_model(model, weights), weights, notes)
    check_model(proto, opset_map(proto))
    graph = GraphBuilder(opset_map(proto), weights).build(proto.graph)
    graph.load_notes = notes
    return graph, proto
