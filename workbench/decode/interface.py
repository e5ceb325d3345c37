"""Find a decoder's decode interface by its input and output names.

Real exporters name the KV cache `past_key_values.{i}.key` / `present.{i}.key`
(optimum, torch, onnxruntime-genai) or `past.{i}.key` / `present.{i}.key`, or
`past_key_{i}` / `present_key_{i}`; this module maps every one to (layer, kind).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import WorkbenchError

_PAST = [
    re.compile(r"^past_key_values\.(\d+)\.(key|value)$"),
    re.compile(r"^past\.(\d+)\.(key|value)$"),
    re.compile(r"^past_(key|value)_(\d+)$"),
    re.compile(r"^past_key_values_(\d+)_(key|value)$"),
]
_PRESENT = [
    re.compile(r"^present\.(\d+)\.(key|value)$"),
    re.compile(r"^present_key_values\.(\d+)\.(key|value)$"),
    re.compile(r"^present_(key|value)_(\d+)$"),
    re.compile(r"^present_(\d+)_(key|value)$"),
]


class DecodeInterfaceError(WorkbenchError):
    """The model does not look like a decoder this Generator can drive, or was misused."""


def _match(name: str, patterns: list[re.Pattern]) -> tuple[int, str] | None:
    for pat in patterns:
        m = pat.match(name)
        if m:
            a, b = m.groups()
            return (int(a), b) if a.isdigit() else (int(b), a)
    return None


@dataclass
class KvSlot:
    layer: int
    kind: str  # "key" | "value"
    past: str
    present: str
    dtype: np.dtype
    shape: list  # declared shape of the past input (ints and symbol names)
    seq_axis: int


@dataclass
class DecodeInterface:
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    kv: list[KvSlot] = field(default_factory=list)
    other_inputs: list[str] = field(default_factory=list)


def _np_dtype(ort_type: str) -> np.dtype:
    name = ort_type[len("tensor("):-1] if ort_type.startswith("tensor(") else ort_type
    return np.dtype({"float": "float32", "double": "float64"}.get(name, name))


def discover(session: Any) -> DecodeInterface:
    """Inspect an ORT-shaped session (workbench's or onnxruntime's)."""
    inputs = {a.name: a for a in session.get_inputs()}
    outputs = {a.name: a for a in session.get_outputs()}
    if "input_ids" not in inputs:
        raise DecodeInterfaceError(f"the model has no 'input_ids' input (inputs: {sorted(inputs)})")
    logits = "logits" if "logits" in outputs else next(iter(outputs))
    presents = {}
    for name in outputs:
        key = _match(name, _PRESENT)
        if key:
            presents[key] = name
    kv = []
    used = {"input_ids", "attention_mask", "position_ids"}
    for name, arg in inputs.items():
        key = _match(name, _PAST)
        if key is None:
            continue
        if key not in presents:
            raise DecodeInterfaceError(f"past input {name!r} has no matching present output")
        present_arg = outputs[presents[key]]
        past_dtype, present_dtype = _np_dtype(arg.type), _np_dtype(present_arg.type)
        if past_dtype != present_dtype:
            raise DecodeInterfaceError(
                f"KV dtype mismatch: past input {name!r} is {past_dtype} but present output "
                f"{presents[key]!r} is {present_dtype}"
            )
        shape = list(arg.shape or [None, None, None, None])
        seq_axis = _seq_axis(shape)
        kv.append(KvSlot(key[0], key[1], name, presents[key], past_dtype, shape, seq_axis))
        used.add(name)
    kv.sort(key=lambda s: (s.layer, s.kind))
    return DecodeInterface(
        input_ids="input_ids",
        attention_mask="attention_mask" if "attention_mask" in inputs else None,
        position_ids="position_ids" if "position_ids" in inputs else None,
        logits=logits,
        kv=kv,
        other_inputs=[n for n in inputs if n not in used],
    )


def _seq_axis(shape: list) -> int:
    """The KV length axis: the symbolic dim named like a past/sequence length (else axis 2)."""
    for axis, d in enumerate(shape):
        if isinstance(d, str) and ("past" in d or "seq" in d or "total" in d or "len" in d):
            return axis
    return 2 if len(shape) == 4 else len(shape) - 2
