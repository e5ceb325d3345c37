"""Load-time structural checks of an ONNX model, each naming its culprit.

A user's broken export (or a corrupted file) should fail here, when it is loaded,
with a `ModelLoadError` that names the node / value / initializer at fault, instead
of surfacing later as a kernel or numpy error about something else. Checked:

- every string field is valid UTF-8 (protobuf hands undecodable ones back as bytes);
- element types are ones ONNX defines; initializer dims are non-negative and the
  stored data holds exactly as many elements / bytes as the dims say;
- no value is produced twice (two nodes, or a node over a graph input/initializer);
- every node input is produced by a node, a graph input, an initializer or (in a
  subgraph) an enclosing scope; every graph output is produced;
- the nodes can be ordered topologically (a cycle is reported with its nodes);
- attributes carry a valid type, and for ai.onnx ops: names, types, required
  attributes and input/output counts agree with the op's schema.
"""

from __future__ import annotations

import functools
import math

import onnx
from google.protobuf.descriptor import FieldDescriptor
from onnx import TensorProto, defs, helper

from ..errors import ModelLoadError

_KNOWN_ELEM_TYPES = frozenset(v for v in TensorProto.DataType.values() if v)
_PACKED_BITS = {
    TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.FLOAT4E2M1: 4,
    TensorProto.INT2: 2, TensorProto.UINT2: 2,
    TensorProto.FLOAT6E2M3: 6, TensorProto.FLOAT6E3M2: 6,
}
_KNOWN_ATTR_TYPES = frozenset(v for v in onnx.AttributeProto.AttributeType.values() if v)
#: string fields whose content only documents; undecodable bytes there are replaced, not fatal
_FREE_TEXT = frozenset({"doc_string", "producer_name", "producer_version", "domain_doc"})


def _short(name: object, limit: int = 80) -> str:
    r = repr(name)
    return r if len(r) <= limit else r[: limit - 3] + "..."


# -- UTF-8 -----------------------------------------------------------------------------


def check_strings(proto: onnx.ModelProto) -> None:
    """Every string field must decode: protobuf returns invalid UTF-8 as `bytes`,
    which later code (names, symbols, op types) would trip over far from the cause."""
    _check_message_strings(proto, "model")


def _check_message_strings(msg, where: str) -> None:
    for field, value in msg.ListFields():
        if field.type == FieldDescriptor.TYPE_STRING:
            repeated = _is_repeated(field)
            items = list(value) if repeated else [value]
            if all(isinstance(s, str) for s in items):
                continue
            if field.name in _FREE_TEXT and not repeated:
                setattr(msg, field.name, value.decode("utf-8", errors="replace"))
                continue
            bad = next(s for s in items if not isinstance(s, str))
            raise ModelLoadError(
                f"{where}: field {field.name!r} holds {_short(bytes(bad))}, which is not valid "
                "UTF-8 text (a corrupted or hand-edited file?)"
            )
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if _is_repeated(field):
                for i, sub in enumerate(value):
                    _check_message_strings(sub, _where(where, field.name, i, sub))
            else:
                _check_message_strings(value, f"{where}.{field.name}")


def _is_repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 5.x; `label` is deprecated there
    if flag is not None:
        return bool(flag)
    return field.label == FieldDescriptor.LABEL_REPEATED


def _where(parent: str, field: str, i: int, sub) -> str:
    label = f"{parent}.{field}[{i}]"
    name = getattr(sub, "name", None) if hasattr(sub, "name") else None
    if isinstance(name, str) and name:
        label += f" ({_short(name)})"
    return label


# -- tensors ---------------------------------------------------------------------------


def check_elem_type(elem_type: int, what: str, allow_undefined: bool = True) -> None:
    if elem_type == 0 and allow_undefined:
        return
    if elem_type not in _KNOWN_ELEM_TYPES:
        raise ModelLoadError(
            f"{what} has unknown element type {elem_type} (ONNX defines "
            f"{min(_KNOWN_ELEM_TYPES)}..{max(_KNOWN_ELEM_TYPES)})"
        )


def check_tensor(t: TensorProto, what: str) -> None:
    """dims >= 0 and the stored data holds exactly what the dims and type say."""
    check_elem_type(t.data_type, what, allow_undefined=False)
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{what} has negative dims {dims}")
    if t.HasField("segment"):
        raise ModelLoadError(f"{what} is stored in segments, which are not supported")
    if t.data_location == TensorProto.EXTERNAL:
        return  # read (and checked) by the external-data loader
    n = math.prod(dims)
    type_name = TensorProto.DataType.Name(t.data_type)
    if t.HasField("raw_data"):
        if t.data_type == TensorProto.STRING:
            raise ModelLoadError(f"{what} is a STRING tensor but stores raw_data")
        bits = _PACKED_BITS.get(t.data_type)
        if bits is None:
            bits = 8 * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        want = (n * bits + 7) // 8
        if len(t.raw_data) != want:
            raise ModelLoadError(
                f"{what} has dims {dims} ({n} {type_name} elements, {want} bytes) but stores "
                f"{len(t.raw_data)} bytes of raw_data"
            )
        return
    field = helper.tensor_dtype_to_field(t.data_type)
    got = len(getattr(t, field))
    if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        want_counts = {2 * n}
    elif t.data_type in _PACKED_BITS:
        want_counts = {n, (n * _PACKED_BITS[t.data_type] + 7) // 8}
    else:
        want_counts = {n}
    if got not in want_counts:
        raise ModelLoadError(
            f"{what} has dims {dims} ({n} {type_name} elements) but stores {got} values in {field}"
        )


#: no tensor is this big; a declared shape that says so is a corrupted dim
MAX_TENSOR_BYTES = 2**40


def _check_value_info(vi: onnx.ValueInfoProto, what: str, typed: bool = False) -> None:
    """A declared type: a known element type (set, when `typed`), a plausible static size."""
    t = vi.type
    kind = t.WhichOneof("value")
    while kind in ("sequence_type", "optional_type"):
        t = getattr(t, kind).elem_type
        kind = t.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return
    tt = getattr(t, kind)
    check_elem_type(tt.elem_type, f"{what} {vi.name!r}")
    if typed and tt.elem_type == 0:
        raise ModelLoadError(f"{what} {vi.name!r} declares no element type")
    if not tt.HasField("shape"):
        return
    static = [d.dim_value for d in tt.shape.dim if d.HasField("dim_value") and d.dim_value > 0]
    itemsize = 1
    if tt.elem_type and tt.elem_type != TensorProto.STRING:
        itemsize = helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize
    if math.prod(static) * itemsize > MAX_TENSOR_BYTES:
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        raise ModelLoadError(
            f"{what} {vi.name!r} declares shape {dims}: at least {math.prod(static) * itemsize} bytes, "
            f"more than any tensor can hold ({MAX_TENSOR_BYTES}); a corrupted dim?"
        )


# -- graphs ----------------------------------------------------------------------------


def check_model(proto: onnx.ModelProto, opsets: dict[str, int]) -> None:
    check_graph(proto.graph, opsets)


def check_graph(gp: onnx.GraphProto, opsets: dict[str, int],
                outer: frozenset[str] = frozenset(), owner: str | None = None) -> set[str]:
    """Check one graph (recursing into subgraphs); return the enclosing-scope names it reads.
    `owner` says, for a subgraph, which attribute of which node holds it."""
    label = f"graph {_short(gp.name)}" if owner is None else f"subgraph {_short(gp.name)} ({owner})"
    sources: dict[str, str] = {}  # value name -> what defines it

    def define(name: str, what: str) -> None:
        if name in sources:
            raise ModelLoadError(f"{label}: value {name!r} is defined twice: by {sources[name]} and by {what}")
        sources[name] = what

    for t in gp.initializer:
        check_tensor(t, f"initializer {t.name!r}")
        define(t.name, f"initializer {t.name!r}")
    for st in gp.sparse_initializer:
        check_tensor(st.values, f"sparse initializer {st.values.name!r}")
        check_tensor(st.indices, f"indices of sparse initializer {st.values.name!r}")
        define(st.values.name, f"sparse initializer {st.values.name!r}")
    for vi in gp.input:
        # the main graph's caller-fed inputs must say what to feed (as onnx.checker requires)
        _check_value_info(vi, f"{label} input", typed=owner is None)
        if vi.name in sources and sources[vi.name].startswith(("initializer", "sparse")):
            continue  # an initializer listed as an input: a default the caller may override
        define(vi.name, f"graph input {vi.name!r}")
    for vi in gp.output:
        _check_value_info(vi, f"{label} output")
    for vi in gp.value_info:
        _check_value_info(vi, f"{label} value_info")

    labels = [_node_label(n, i) for i, n in enumerate(gp.node)]
    producer: dict[str, int] = {}
    for i, n in enumerate(gp.node):
        for name in n.output:
            if name:
                define(name, labels[i])
                producer[name] = i

    visible = outer | frozenset(sources)  # what this graph's subgraphs may read
    free: set[str] = set()
    deps: list[set[int]] = []
    for i, n in enumerate(gp.node):
        reads = [name for name in n.input if name]
        _check_node(n, labels[i], opsets)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                reads.extend(sorted(check_graph(a.g, opsets, visible,
                                                f"attribute {a.name!r} of {labels[i]}")))
        d: set[int] = set()
        for name in reads:
            if name in producer:
                d.add(producer[name])
            elif name in sources:
                pass
            elif name in outer:
                free.add(name)
            else:
                scope = "node, graph input, initializer or enclosing scope" if owner \
                    else "node, graph input or initializer"
                raise ModelLoadError(
                    f"{labels[i]} reads input {name!r}, which no {scope} produces ({label})"
                )
        deps.append(d)
    for vi in gp.output:
        if vi.name not in sources:
            if vi.name in outer:  # a subgraph passing an enclosing value straight through
                free.add(vi.name)
                continue
            raise ModelLoadError(
                f"{label}: output {vi.name!r} is not produced by any node, graph input or initializer"
            )
    _check_acyclic(deps, labels, label)
    return free


def _node_label(n: onnx.NodeProto, i: int) -> str:
    domain = n.domain + "::" if n.domain not in ("", "ai.onnx") else ""
    name = n.name or f"{n.op_type}_{i}"  # the name the loader gives an unnamed node
    return f"node {_short(name)} ({domain}{n.op_type})"


def _check_acyclic(deps: list[set[int]], labels: list[str], graph_label: str) -> None:
    users: dict[int, list[int]] = {}
    remaining = []
    for i, d in enumerate(deps):
        if i in d:
            raise ModelLoadError(f"{graph_label} has a cycle: {labels[i]} reads its own output")
        remaining.append(len(d))
        for p in d:
            users.setdefault(p, []).append(i)
    ready = [i for i, r in enumerate(remaining) if r == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for u in users.get(i, ()):
            remaining[u] -= 1
            if remaining[u] == 0:
                ready.append(u)
    if done == len(deps):
        return
    # walk back along unfinished dependencies until a node repeats: that is a cycle
    stuck = {i for i, r in enumerate(remaining) if r > 0}
    path, seen = [], {}
    i = min(stuck)
    while i not in seen:
        seen[i] = len(path)
        path.append(i)
        i = min(p for p in deps[i] if p in stuck)
    cycle = path[seen[i]:] + [i]
    raise ModelLoadError(
        f"{graph_label} has a cycle, so the nodes cannot be ordered: "
        + " -> ".join(labels[j] for j in reversed(cycle))
    )


#: attributes that name an element type (Cast.to, RandomNormal.dtype, QuantizeLinear.output_dtype, ...)
_ELEM_TYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})
_CONSTANT_VALUES = ("value", "sparse_value", "value_float", "value_floats", "value_int",
                    "value_ints", "value_string", "value_strings")


def _check_node(n: onnx.NodeProto, label: str, opsets: dict[str, int]) -> None:
    for a in n.attribute:
        if a.type not in _KNOWN_ATTR_TYPES:
            raise ModelLoadError(f"{label}: attribute {a.name!r} has invalid type {a.type}")
        if a.type == onnx.AttributeProto.TENSOR:
            check_tensor(a.t, f"{label}: tensor attribute {a.name!r}")
        elif a.type == onnx.AttributeProto.TENSORS:
            for k, t in enumerate(a.tensors):
                check_tensor(t, f"{label}: tensor {k} of attribute {a.name!r}")
    for a in n.attribute:
        if a.name in _ELEM_TYPE_ATTRS and a.type == onnx.AttributeProto.INT:
            if not (a.i == 0 and a.name == "output_dtype"):  # 0: "as the input says"
                check_elem_type(a.i, f"{label}: attribute {a.name!r}", allow_undefined=False)
    domain = "" if n.domain in ("", "ai.onnx") else n.domain
    if domain != "":
        return  # contrib / custom domains: their schemas are not ours to enforce
    schema = _schema(n.op_type, opsets.get("", 1))
    if schema is None:
        return  # unknown op: reported (or run by the fallback) when the plan is built
    names = set()
    for a in n.attribute:
        if a.name in names:
            raise ModelLoadError(f"{label}: attribute {a.name!r} is given twice")
        names.add(a.name)
        spec = schema.attributes.get(a.name)
        if spec is None:
            raise ModelLoadError(
                f"{label}: unknown attribute {a.name!r} (opset {schema.since_version} "
                f"{n.op_type} has {sorted(schema.attributes) or 'none'})"
            )
        if int(spec.type) != a.type:
            raise ModelLoadError(
                f"{label}: attribute {a.name!r} has type "
                f"{onnx.AttributeProto.AttributeType.Name(a.type)}, the schema says "
                f"{onnx.AttributeProto.AttributeType.Name(int(spec.type))}"
            )
    for name, spec in schema.attributes.items():
        if spec.required and name not in names:
            raise ModelLoadError(f"{label}: required attribute {name!r} is missing")
    if n.op_type == "Constant" and len(names & set(_CONSTANT_VALUES)) != 1:
        raise ModelLoadError(
            f"{label}: a Constant needs exactly one of {', '.join(_CONSTANT_VALUES)}; got {sorted(names)}"
        )
    n_in, n_out = len(n.input), len(n.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise ModelLoadError(
            f"{label} has {n_in} inputs; {n.op_type} takes {_count_range(schema.min_input, schema.max_input)}"
        )
    if not schema.min_output <= n_out <= schema.max_output:
        raise ModelLoadError(
            f"{label} has {n_out} outputs; {n.op_type} gives {_count_range(schema.min_output, schema.max_output)}"
        )


def _count_range(lo: int, hi: int) -> str:
    if lo == hi:
        return str(lo)
    return f"at least {lo}" if hi >= 2**31 - 1 else f"{lo} to {hi}"


@functools.cache
def _schema(op_type: str, opset: int):
    try:
        return defs.get_schema(op_type, opset, "")
    except defs.SchemaError:
        return None
