"""ONNX -> workbench Graph.

Loading is the trust boundary for untrusted models: nothing here executes code
from the model, and external-data locations must stay inside the model's folder.
"""

from __future__ import annotations

import itertools
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
from .graph import Graph, Node, Value
from .validate import check_model, check_strings


def read_model(model: Any) -> onnx.ModelProto:
    """Parse the caller's model (path, bytes or ModelProto) with external data resolved safely."""
    if isinstance(model, onnx.ModelProto):
        proto, base_dir = model, None
    elif isinstance(model, (bytes, bytearray, memoryview)):
        proto, base_dir = _parse_bytes(bytes(model), "<bytes>"), None
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ModelLoadError(f"cannot read model file {str(path)!r}: {e.strerror or e}") from None
        proto, base_dir = _parse_bytes(data, str(path)), path.resolve().parent
    else:
        raise ModelLoadError(
            f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}"
        )
    check_strings(proto)  # before anything reads a name or an external-data location
    _load_external_data(proto, base_dir)
    return proto


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


def _load_external_data(proto: onnx.ModelProto, base_dir: Path | None) -> None:
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
    for tensor in tensors:
        tensor.raw_data = _read_external(root, tensor)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


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


def prepare(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Inline model-local functions, then run ONNX shape inference (best effort)."""
    if proto.functions:
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:  # noqa: BLE001 - the inliner raises assorted C++ errors
            raise ModelLoadError(f"cannot inline the model's local functions: {e}") from None
    try:
        with contrib_shape_inference(opset_map(proto)):
            proto = _infer_without_weight_bytes(proto)
    except Exception:  # noqa: BLE001 - shapes are then resolved just in time
        pass
    return proto


LARGE_INITIALIZER = 4096  # bytes: bigger initializers never feed shape computations


def _infer_without_weight_bytes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference copies the whole model several times; weights only need their
    dims, so their bytes are set aside during inference and put back after."""
    weights: dict[str, bytes] = {}
    for t in proto.graph.initializer:
        if t.HasField("raw_data") and len(t.raw_data) > LARGE_INITIALIZER:
            weights[t.name] = t.raw_data
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL  # dims only; never read
            entry = t.external_data.add()
            entry.key, entry.value = "location", "set-aside-during-shape-inference"
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    finally:
        for model in (proto,):
            _restore(model, weights)
    _restore(inferred, weights)
    return inferred


def _restore(model: onnx.ModelProto, weights: dict[str, bytes]) -> None:
    for t in model.graph.initializer:
        if t.name in weights and not t.HasField("raw_data"):
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            t.raw_data = weights[t.name]


def opset_map(proto: onnx.ModelProto) -> dict[str, int]:
    opsets = {}
    for imp in proto.opset_import:
        domain = "" if imp.domain in ("", "ai.onnx") else imp.domain
        opsets[domain] = imp.version
    opsets.setdefault("", 1)
    return opsets


class GraphBuilder:
    """Turns a GraphProto (and its subgraphs) into workbench Graphs."""

    def __init__(self, opsets: dict[str, int]):
        self.opsets = opsets
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
            arr = _tensor_to_array(t)
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
            subgraphs, captures = {}, []
            attrs = {}
            for a in np_.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    sub = self.build(a.g, visible)
                    subgraphs[a.name] = sub
                    captures.extend(sub.values[vid].name for vid in sub.outer_inputs)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    raise ModelLoadError(f"node {np_.name!r}: GRAPHS attributes are not supported")
                else:
                    attrs[a.name] = _attr_value(a)
            cap_ids = [read(name) for name in dict.fromkeys(captures)]
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
                subgraphs=subgraphs, captures=tuple(cap_ids), proto=np_,
            ))
        g.outputs = [read(vi.name) for vi in gp.output]
        g.outer_inputs = list(captured.values())
        return g

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
    proto = prepare(read_model(model))
    check_model(proto, opset_map(proto))
    graph = GraphBuilder(opset_map(proto)).build(proto.graph)
    return graph, proto
