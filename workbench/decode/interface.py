"""Find a decoder's decode interface, and say how it was read.

`discover(session)` gives every input of an ORT-shaped session (workbench's or
onnxruntime's) a role — token ids, attention mask, positions, `use_cache_branch`,
past K/V of layer i — pairs each past input with its present output, and works out
the concrete size of every KV axis but batch and sequence: from the declared dim, a
dim written as a numeric string ('16'), GroupQueryAttention's `num_heads` /
`kv_num_heads` with the query projection's width, the present output's inferred
shape, a user override, or a config file (in that order of trust; an override that
contradicts the graph is an error). `print(interface)` shows the reading as a table.

Exporter idioms it knows:

    past_key_values.{i}.key / present.{i}.key        optimum, torch, onnxruntime-genai
    past.{i}.key, past_key_{i}, past_key_values_{i}_key / present_key_{i}, present_{i}_key
    input.cache.layers.{i}.keys / output.cache.layers.{i}.keys   transformers (decode.onnx)
    cache.layers.{i}.keys (an output with no past input)         transformers (prefill.onnx)
    use_cache_branch (bool [1])                                   optimum's merged decoder

A graph with present outputs and no past inputs is a *prefill* graph: it starts a
cache that a decode graph continues (`Generator(decode, prefill=prefill)`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import WorkbenchError

_KIND = r"(key|value|keys|values)"
_PAST = [
    re.compile(rf"^past_key_values\.(\d+)\.{_KIND}$"),
    re.compile(rf"^past\.(\d+)\.{_KIND}$"),
    re.compile(rf"^past_{_KIND}_(\d+)$"),
    re.compile(rf"^past_key_values_(\d+)_{_KIND}$"),
    re.compile(rf"^input\.cache\.layers\.(\d+)\.{_KIND}$"),
    re.compile(rf"^past_key_values\.layers\.(\d+)\.{_KIND}$"),
]
_PRESENT = [
    re.compile(rf"^present\.(\d+)\.{_KIND}$"),
    re.compile(rf"^present_key_values\.(\d+)\.{_KIND}$"),
    re.compile(rf"^present_{_KIND}_(\d+)$"),
    re.compile(rf"^present_(\d+)_{_KIND}$"),
    re.compile(rf"^output\.cache\.layers\.(\d+)\.{_KIND}$"),
    re.compile(rf"^cache\.layers\.(\d+)\.{_KIND}$"),
]
_ROLE_NAMES = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    "use_cache_branch": "use_cache_branch",
}
#: roles a user may give an input with `roles={name: role}`
ROLES = ("input_ids", "attention_mask", "position_ids", "use_cache_branch")
_SEQ_WORDS = ("past", "seq", "total", "len")


class DecodeInterfaceError(WorkbenchError):
    """The model does not look like a decoder this Generator can drive, or was misused."""


def _match(name: str, patterns: list[re.Pattern]) -> tuple[int, str] | None:
    for pat in patterns:
        m = pat.match(name)
        if m:
            a, b = m.groups()
            layer, kind = (int(a), b) if a.isdigit() else (int(b), a)
            return layer, kind.removesuffix("s")
    return None


def _dim(d: Any) -> int | str | None:
    """A declared dim: ints stay, numeric strings ('16', as torch.export writes) become ints."""
    if isinstance(d, str) and d.strip().isdigit():
        return int(d.strip())
    return d


@dataclass
class KvTensor:
    layer: int
    kind: str  # "key" | "value"
    past: str | None  # None: a prefill graph's output, with no past input
    present: str
    dtype: np.dtype
    #: the past input's shape with every axis but batch and sequence resolved to an int
    shape: list
    seq_axis: int
    declared: list = field(default_factory=list)  # as the model declares it
    seq_axis_source: str = ""


@dataclass
class InputRole:
    """One row of the reading: a model input or output, its role, and why."""

    name: str
    role: str
    dtype: str
    shape: str
    note: str = ""
    io: str = "input"  # "input" | "output"


@dataclass
class DecodeInterface:
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    kv: list[KvTensor] = field(default_factory=list)
    #: inputs given no role (the Generator refuses a model with any)
    other_inputs: list[str] = field(default_factory=list)
    use_cache_branch: str | None = None
    #: dtype of each fed input (ids, mask, positions, use_cache_branch)
    dtypes: dict[str, np.dtype] = field(default_factory=dict)
    head_size: int | None = None
    head_size_source: str = ""
    rows: list[InputRole] = field(default_factory=list)
    graph: str = ""
    #: (input or output name, what is wrong, what was expected) for every problem
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def is_prefill_graph(self) -> bool:
        """Present outputs and no past inputs: starts a cache another graph continues."""
        return bool(self.kv) and all(s.past is None for s in self.kv)

    @property
    def layers(self) -> int:
        return len({s.layer for s in self.kv})

    def describe(self) -> str:
        """The reading as a table: each input's role, the KV pairs, the head size and its source."""
        title = f"decode interface of {self.graph or 'the model'}"
        kind = " (a prefill graph: presents without pasts)" if self.is_prefill_graph else ""
        lines = [title + kind]
        cols = [("", "io"), ("name", "name"), ("role", "role"), ("dtype", "dtype"), ("shape", "shape"),
                ("how it was read", "note")]
        table = [[getattr(r, attr) for _, attr in cols] for r in self.rows]
        widths = [max([len(h)] + [len(str(row[i])) for row in table]) for i, (h, _) in enumerate(cols)]
        widths[-1] = 0
        lines.append("  " + "  ".join(h.ljust(w) for (h, _), w in zip(cols, widths)).rstrip())
        for row in table:
            lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        if self.kv:
            lines.append(f"  head size: {self.head_size if self.head_size is not None else '?'}"
                         f"  ({self.head_size_source or 'unknown'}); {self.layers} layers of K/V")
        for name, what in self.problems:
            lines.append(f"  problem: {name}: {what}")
        return "\n".join(lines)

    __str__ = describe

    def _repr_pretty_(self, p, cycle) -> None:  # IPython
        p.text(self.describe())


# -- evidence from the graph ------------------------------------------------------------
@dataclass
class _Graph:
    """What discovery may read of the model beyond its I/O: nodes, weight dims, shapes."""

    nodes: list[Any] = field(default_factory=list)  # onnx.NodeProto, main graph
    weight_dims: dict[str, list[int]] = field(default_factory=dict)
    shapes: dict[str, list] = field(default_factory=dict)  # value name -> inferred shape
    producers: dict[str, Any] = field(default_factory=dict)


def graph_evidence(session: Any) -> _Graph:
    """What the model file says of its nodes, weights and shapes (and the loaded graph's
    inferred shapes for a workbench session)."""
    from .runners import is_workbench_session, model_proto  # noqa: PLC0415

    proto = model_proto(session)
    ev = _Graph()
    if proto is not None:
        g = proto.graph
        ev.nodes = list(g.node)
        ev.weight_dims = {t.name: list(t.dims) for t in g.initializer}
        for vi in [*g.value_info, *g.output]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                ev.shapes.setdefault(vi.name, [d.dim_value if d.HasField("dim_value") else d.dim_param
                                                for d in vi.type.tensor_type.shape.dim])
        ev.producers = {o: n for n in ev.nodes for o in n.output if o}
    if is_workbench_session(session):  # the loaded graph, after symbolic shape inference
        graph = session.graph
        for v in graph.values:
            if v.shape is not None:
                ev.shapes[v.name] = list(v.shape)
    return ev


def _attr(node: Any, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return a.i if a.type == a.INT else a.f if a.type == a.FLOAT else default
    return default


def _width(ev: _Graph, value: str) -> tuple[int, str] | None:
    """The last-axis width of `value`: its inferred shape, or the projection that makes it."""
    shape = ev.shapes.get(value)
    if shape and isinstance(_dim(shape[-1]), int):
        return int(_dim(shape[-1])), f"inferred shape of {value!r}"
    node = ev.producers.get(value)
    for _ in range(4):  # through a bias Add or a Cast to the MatMul
        if node is None:
            return None
        if node.op_type == "MatMulNBits":
            n = _attr(node, "N")
            return (int(n), f"{node.name!r} N={n}") if n else None
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in ev.weight_dims:
            dims = ev.weight_dims[node.input[1]]
            n = dims[0] if node.op_type == "Gemm" and _attr(node, "transB", 0) else dims[-1]
            return int(n), f"{node.name!r} weight {dims}"
        if node.op_type in ("Add", "Cast", "Identity"):
            node = ev.producers.get(node.input[0])
            continue
        return None
    return None


def _gqa_dims(ev: _Graph, present: str) -> tuple[dict[int, int], str] | None:
    """{axis: size} of a GroupQueryAttention present output (kv heads on 1, head size on 3),
    through the Cast that onnxruntime's fp16 converter puts after it (keep_io_types)."""
    for _ in range(4):
        node = ev.producers.get(present)
        if node is None or node.op_type not in ("Cast", "Identity") or not node.input:
            break
        present = node.input[0]
    for node in ev.nodes:
        if node.op_type != "GroupQueryAttention" or present not in list(node.output)[1:3]:
            continue
        heads, kv_heads = _attr(node, "num_heads"), _attr(node, "kv_num_heads")
        if not heads or not kv_heads:
            return None
        packed = len(node.input) < 2 or not node.input[1]
        found = _width(ev, node.input[0])
        if found is None:
            return {1: kv_heads}, f"GroupQueryAttention {node.name!r} kv_num_heads={kv_heads}"
        width, where = found
        parts = heads + 2 * kv_heads if packed else heads
        if width % parts:
            return None
        qkv = "packed QKV" if packed else "query"
        return ({1: kv_heads, 3: width // parts},
                f"GroupQueryAttention {node.name!r}: num_heads={heads}, kv_num_heads={kv_heads}, "
                f"{qkv} width {width} ({where}) / {parts}")
    return None


# -- discovery ----------------------------------------------------------------------------------
def _np_dtype(ort_type: str, what: str = "a decoder input or output") -> np.dtype:
    name = ort_type[len("tensor("):-1] if ort_type.startswith("tensor(") else ort_type
    try:
        return np.dtype({"float": "float32", "double": "float64"}.get(name, name))
    except TypeError as error:
        raise DecodeInterfaceError(f"{what} has type {ort_type!r}, which the Generator cannot feed "
                                   "(expected a numeric tensor)") from error


def _fmt_shape(shape: Iterable | None) -> str:
    if shape is None:
        return "any"
    return "[" + ", ".join(repr(d) if isinstance(d, str) else str(d) for d in shape) + "]"


def _seq_axis(shape: list) -> tuple[int, str]:
    """The KV length axis, and how it was told."""
    for axis, d in enumerate(shape):
        if isinstance(d, str) and any(w in d for w in _SEQ_WORDS):
            return axis, f"seq axis {axis}: named {d!r}"
    symbolic = [a for a, d in enumerate(shape) if a > 0 and isinstance(d, str)]
    if len(symbolic) == 1:
        return symbolic[0], f"seq axis {symbolic[0]}: the only symbolic axis after batch"
    axis = 2 if len(shape) == 4 else len(shape) - 2
    return axis, f"seq axis {axis}: by convention ([batch, heads, seq, head size])"


def discover(session: Any, *, kv_map: dict[str, str] | None = None, head_size: int | None = None,
             roles: dict[str, str] | None = None, config_head_size: tuple[int, str] | None = None,
             graph: str = "") -> DecodeInterface:
    """Read the decode interface of an ORT-shaped session (workbench's or onnxruntime's).

    `kv_map={past input: present output}` pairs KV tensors whose names no pattern
    knows (layer and kind from either name, else from the map's order: layer i's key
    then value); `head_size` states the head size where the graph does not give it;
    `roles={input: role}` names the ids / mask / positions / use_cache_branch inputs;
    `config_head_size=(n, "config.json")` is a last resort (a file beside the model).
    Problems are collected in `.problems`; `Generator` raises on any.
    """
    inputs = {a.name: a for a in session.get_inputs()}
    outputs = {a.name: a for a in session.get_outputs()}
    roles = dict(roles or {})
    kv_map = dict(kv_map or {})
    problems: list[tuple[str, str]] = []
    for name, role in roles.items():
        if role not in ROLES:
            problems.append((name, f"roles= gives it role {role!r}; expected one of {ROLES}"))
        if name not in inputs:
            problems.append((name, f"roles= names it, but the model has no such input (inputs: {sorted(inputs)})"))
    for past, present in kv_map.items():
        if past not in inputs:
            problems.append((past, f"kv_map= names it, but the model has no such input (inputs: {sorted(inputs)})"))
        if present not in outputs:
            problems.append((present, f"kv_map= names it, but the model has no such output "
                                      f"(outputs: {sorted(outputs)})"))
    by_role = {role: name for name, role in roles.items() if name in inputs}
    for name in inputs:
        role = _ROLE_NAMES.get(name)
        if role and role not in by_role and name not in roles:
            by_role[role] = name
    ids = by_role.get("input_ids")
    if ids is None:
        problems.append(("input_ids", f"the model has no 'input_ids' input (inputs: {sorted(inputs)}); "
                                      "name the token-ids input with roles={name: 'input_ids'}"))
    logits = "logits" if "logits" in outputs else next(iter(outputs), "")

    presents: dict[tuple[int, str], str] = {}
    for name in outputs:
        key = _match(name, _PRESENT)
        if key:
            presents[key] = name
    kv: list[KvTensor] = []
    pasts: dict[str, tuple[tuple[int, str], str]] = {}
    for order, (past, present) in enumerate(kv_map.items()):
        if past in inputs and present in outputs:
            key = _match(past, _PAST) or _match(present, _PRESENT) or (order // 2, ("key", "value")[order % 2])
            pasts[past] = (key, present)
    for name in inputs:
        if name in pasts or name in roles:
            continue
        key = _match(name, _PAST)
        if key is None:
            continue
        if key not in presents:
            problems.append((name, "past input has no matching present output (expected an output like "
                                   f"present.{key[0]}.{key[1]}; pair them with kv_map={{{name!r}: ...}})"))
            continue
        pasts[name] = (key, presents[key])
    paired_presents = {p for _, p in pasts.values()}

    ev = None
    resolved_sizes: dict[str, tuple[int, str]] = {}

    def resolve(slot_name: str, present: str, declared: list) -> tuple[list, int, str]:
        nonlocal ev
        shape = [_dim(d) for d in declared]
        seq_axis, seq_note = _seq_axis(shape)
        for axis, d in enumerate(shape):
            if axis in (0, seq_axis) or isinstance(d, int):
                continue
            found = None
            if axis == len(shape) - 1 and head_size is not None:
                found = (head_size, "user override (head_size=)")
            if found is None:
                ev = ev or graph_evidence(session)
                gqa = _gqa_dims(ev, present)
                if gqa and axis in gqa[0]:
                    found = (gqa[0][axis], gqa[1])
                else:
                    inferred = ev.shapes.get(present)
                    if inferred and len(inferred) == len(shape) and isinstance(_dim(inferred[axis]), int):
                        found = (_dim(inferred[axis]), f"inferred shape of {present!r} {_fmt_shape(inferred)}")
            if found is None and axis == len(shape) - 1 and config_head_size is not None:
                found = config_head_size
            if found is None:
                what = "head size" if axis == len(shape) - 1 else "size"
                problems.append((slot_name, f"axis {axis} is the symbol {d!r} and the graph does not say its "
                                            f"{what} (no GroupQueryAttention, no inferred shape of {present!r}); "
                                            "state it with head_size=N"))
                continue
            shape[axis] = found[0]
            resolved_sizes[f"{slot_name}:{axis}"] = found
        return shape, seq_axis, seq_note

    for name, ((layer, kind), present) in pasts.items():
        arg, present_arg = inputs[name], outputs[present]
        past_dtype = _np_dtype(arg.type, f"past input {name!r}")
        present_dtype = _np_dtype(present_arg.type, f"present output {present!r}")
        if past_dtype != present_dtype:
            problems.append((name, f"KV dtype mismatch: past input {name!r} is {past_dtype} but present output "
                                   f"{present!r} is {present_dtype}"))
        declared = list(arg.shape or [None, None, None, None])
        shape, seq_axis, note = resolve(name, present, declared)
        kv.append(KvTensor(layer, kind, name, present, past_dtype, shape, seq_axis, declared, note))
    if not pasts:  # a prefill graph: presents only
        for (layer, kind), present in presents.items():
            arg = outputs[present]
            declared = list(arg.shape or [None, None, None, None])
            shape, seq_axis, note = resolve(present, present, declared)
            kv.append(KvTensor(layer, kind, None, present, _np_dtype(arg.type, f"output {present!r}"), shape, seq_axis, declared, note))
    kv.sort(key=lambda s: (s.layer, s.kind))

    # the head size, and where it came from
    size, source = None, ""
    if kv:
        last = [s for s in kv if isinstance(s.shape[-1], int)]
        sizes = {s.shape[-1] for s in last}
        if len(sizes) > 1:
            problems.append(("KV cache", f"the K/V tensors disagree on the head size: {sorted(sizes)}"))
        if last:
            first = last[0]
            size = first.shape[-1]
            axis = len(first.shape) - 1
            where = resolved_sizes.get(f"{first.past or first.present}:{axis}")
            if where:
                source = where[1]
            else:
                d = first.declared[axis] if len(first.declared) > axis else None
                source = (f"declared dim of {first.past or first.present!r}" if isinstance(d, int)
                          else f"declared dim {d!r} of {first.past or first.present!r} (a number written as a symbol)")
            if head_size is not None and head_size != size:
                problems.append(("head_size", f"head_size={head_size} contradicts the model: {source} says {size}"))

    used = set(by_role.values()) | set(pasts)
    other = [n for n in inputs if n not in used]
    dtypes = {name: _np_dtype(inputs[name].type, f"input {name!r}") for name in by_role.values()}
    for role in ("input_ids", "attention_mask", "position_ids"):
        name = by_role.get(role)
        if name and dtypes[name].kind not in "iu":
            problems.append((name, f"{role} is {dtypes[name]}; expected an integer tensor (int64 or int32)"))
    if by_role.get("use_cache_branch") and dtypes[by_role["use_cache_branch"]] != np.bool_:
        problems.append((by_role["use_cache_branch"], "use_cache_branch must be a bool tensor"))
    for name in other:
        problems.append((name, "no role: expected input_ids, attention_mask, position_ids, use_cache_branch or "
                               "a past K/V input (past_key_values.{i}.key, past.{i}.key, input.cache.layers.{i}.keys, "
                               "...; give others with kv_map= / roles=)"))

    rows = []
    role_text = {"input_ids": "token ids", "attention_mask": "attention mask (ones)",
                 "position_ids": "positions (past .. past+n)", "use_cache_branch": "use_cache_branch (past > 0)"}
    by_name = {s.past: s for s in kv if s.past}
    for name, arg in inputs.items():
        role = next((r for r, n in by_role.items() if n == name), None)
        if role:
            how = "roles= override" if name in roles else "by name"
            rows.append(InputRole(name, role_text[role], str(_np_dtype(arg.type, f"input {name!r}")), _fmt_shape(arg.shape), how))
        elif name in by_name:
            s = by_name[name]
            how = "kv_map= override" if name in kv_map else "by name"
            rows.append(InputRole(name, f"past {s.kind}, layer {s.layer} -> {s.present}", str(s.dtype),
                                  _fmt_shape(s.declared), f"{how}; {s.seq_axis_source}"))
        else:
            rows.append(InputRole(name, "?", arg.type, _fmt_shape(arg.shape), "not understood"))
    for name, arg in outputs.items():
        if name == logits:
            rows.append(InputRole(name, "logits", str(_np_dtype(arg.type, f"output {name!r}")), _fmt_shape(arg.shape), "", "output"))
        elif name in paired_presents or (not pasts and name in presents.values()):
            s = next(s for s in kv if s.present == name)
            role = f"present {s.kind}, layer {s.layer}" + (" (starts the cache)" if s.past is None else "")
            rows.append(InputRole(name, role, str(s.dtype), _fmt_shape(arg.shape),
                                  s.seq_axis_source if s.past is None else "", "output"))

    return DecodeInterface(
        input_ids=ids or "input_ids",
        attention_mask=by_role.get("attention_mask"),
        position_ids=by_role.get("position_ids"),
        logits=logits,
        kv=kv,
        other_inputs=other,
        use_cache_branch=by_role.get("use_cache_branch"),
        dtypes=dtypes,
        head_size=size,
        head_size_source=source,
        rows=rows,
        graph=graph,
        problems=problems,
    )


def check(interface: DecodeInterface) -> DecodeInterface:
    """Raise DecodeInterfaceError naming every problem (and the whole reading), or return it."""
    if not interface.problems:
        return interface
    # the first problem's text leads, so a caller matching on it keeps working
    first = interface.problems[0][1]
    if interface.other_inputs and all(n in interface.other_inputs for n, _ in interface.problems):
        first = (f"cannot interpret the model's inputs {interface.other_inputs}: the Generator feeds input_ids, "
                 "attention_mask, position_ids, use_cache_branch and past K/V inputs "
                 "(past_key_values.{i}.key/value, past.{i}.*, past_key_{i}, input.cache.layers.{i}.keys, ...) "
                 "with matching present outputs")
    details = "\n".join(f"  - {name}: {what}" for name, what in interface.problems)
    raise DecodeInterfaceError(f"{first}\n{details}\n{interface.describe()}")


# -- exports on disk -------------------------------------------------------------------------
@dataclass
class ExportFiles:
    """The graph files of one export, and the config beside them."""

    decode: Path
    prefill: Path | None = None
    config: dict = field(default_factory=dict)
    config_file: str = ""
    layout: str = "single graph"

    def head_size_hint(self) -> tuple[int, str] | None:
        """The head size a config file beside the model states, if any."""
        c = self.config
        for path in (("model", "decoder", "head_size"), ("head_dim",)):
            node: Any = c
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, int):
                return node, f"{self.config_file} {'.'.join(path)}"
        if isinstance(c.get("hidden_size"), int) and isinstance(c.get("num_attention_heads"), int):
            return (c["hidden_size"] // c["num_attention_heads"],
                    f"{self.config_file} hidden_size / num_attention_heads")
        return None

    def eos_token_id(self) -> int | None:
        eos = self.config.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        if eos is None and isinstance(self.config.get("model"), dict):
            eos = self.config["model"].get("eos_token_id")
            eos = eos[0] if isinstance(eos, list) and eos else eos
        return eos if isinstance(eos, int) else None


#: single-graph file names exporters write into their folders, most specific first
SINGLE_GRAPH_NAMES = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx", "model_fp32.onnx")


def find_export(path: str | Path) -> ExportFiles:
    """A model file, or a folder: transformers' `prefill.onnx` + `decode.onnx`, or one graph
    (onnxruntime-genai's `model.onnx` + `genai_config.json`, optimum's `decoder_model_merged.onnx`)."""
    import json  # noqa: PLC0415

    p = Path(path)
    if p.is_file():
        return ExportFiles(decode=p)
    if not p.is_dir():
        raise DecodeInterfaceError(f"{str(p)!r} is neither a model file nor a folder of one")
    config, config_file = {}, ""
    for name in ("genai_config.json", "config.json"):
        if (p / name).is_file():
            try:
                config, config_file = json.loads((p / name).read_text()), name
            except ValueError:
                continue
            break
    if (p / "prefill.onnx").is_file() and (p / "decode.onnx").is_file():
        return ExportFiles(p / "decode.onnx", p / "prefill.onnx", config, config_file, "prefill + decode graphs")
    for name in SINGLE_GRAPH_NAMES:
        if (p / name).is_file():
            return ExportFiles(p / name, None, config, config_file)
    found = sorted(p.glob("*.onnx"))
    if len(found) == 1:
        return ExportFiles(found[0], None, config, config_file)
    raise DecodeInterfaceError(
        f"folder {str(p)!r}: expected prefill.onnx + decode.onnx, or one of {list(SINGLE_GRAPH_NAMES)}, "
        f"or a single .onnx file; found {[f.name for f in found]}"
    )
