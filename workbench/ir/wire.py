"""Large embedded weights found in a serialized ModelProto without parsing them.

Parsing a model file with protobuf copies every weight's bytes into the message (and
reading them out copies them again), so a model with embedded weights peaks at two
to three times its size while it loads. `lift_weights` walks the protobuf wire format
instead: it finds each main-graph initializer's `raw_data` field and returns the model's
bytes without those fields, plus where each one lies in the file. The loader parses
the (small) rest and maps the weights from the file, as it maps external data.

Only the plain layout is handled: one `graph` field, initializers as length-delimited
TensorProtos with at most one `raw_data` field each. Anything else (or malformed
bytes) returns None and the loader parses the file as a whole, which reports the
error or handles the unusual layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# field numbers, from onnx.proto
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class _Unplain(Exception):
    """The bytes are malformed or not in the layout `lift_weights` handles."""


@dataclass(frozen=True)
class LiftedBytes:
    """Where one initializer's raw_data lies: `index` in graph.initializer order."""

    index: int
    offset: int
    length: int


def lift_weights(buf: memoryview, min_bytes: int) -> tuple[bytes, list[LiftedBytes]] | None:
    """(the model without the lifted raw_data fields, what was lifted), or None.

    Initializers whose raw_data is longer than `min_bytes` are lifted; None also when
    nothing is (then there is nothing to gain over a plain parse)."""
    try:
        return _lift(buf, min_bytes)
    except _Unplain:
        return None


def _lift(buf: memoryview, min_bytes: int) -> tuple[bytes, list[LiftedBytes]] | None:
    pieces: list[bytes] = []
    lifted: list[LiftedBytes] = []
    graphs = 0
    for number, wire, start, value, end in _fields(buf, 0, len(buf)):
        if number == _MODEL_GRAPH:
            if wire != _LENGTH:
                raise _Unplain
            graphs += 1
            pieces.append(_length_field(number, _graph_without_weights(buf, value, end, min_bytes, lifted)))
        else:
            pieces.append(bytes(buf[start:end]))
    if graphs != 1 or not lifted:  # two graph fields merge when parsed: left to protobuf
        return None
    return b"".join(pieces), lifted


def _graph_without_weights(buf: memoryview, start: int, end: int, min_bytes: int,
                           lifted: list[LiftedBytes]) -> bytes:
    pieces: list[bytes] = []
    index = 0
    for number, wire, field_start, value, field_end in _fields(buf, start, end):
        if number == _GRAPH_INITIALIZER and wire == _LENGTH:
            kept = _tensor_without_raw_data(buf, value, field_end, min_bytes)
            if kept is None:
                pieces.append(bytes(buf[field_start:field_end]))
            else:
                tensor, offset, length = kept
                lifted.append(LiftedBytes(index, offset, length))
                pieces.append(_length_field(number, tensor))
            index += 1
        else:
            pieces.append(bytes(buf[field_start:field_end]))
    return b"".join(pieces)


def _tensor_without_raw_data(buf: memoryview, start: int, end: int,
                             min_bytes: int) -> tuple[bytes, int, int] | None:
    """The TensorProto's bytes without its raw_data field, and that field's span; None
    when its raw_data is small or absent."""
    pieces: list[bytes] = []
    span = None
    for number, wire, field_start, value, field_end in _fields(buf, start, end):
        if number == _TENSOR_RAW_DATA and wire == _LENGTH:
            if span is not None:
                raise _Unplain  # repeated: protobuf keeps the last one
            span = (value, field_end - value)
            continue
        pieces.append(bytes(buf[field_start:field_end]))
    if span is None or span[1] <= min_bytes:
        return None
    return b"".join(pieces), span[0], span[1]


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, field end) of each field."""
    while pos < end:
        start = pos
        tag, pos = _varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        value = pos
        if wire == _VARINT:
            _, pos = _varint(buf, pos, end)
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        elif wire == _LENGTH:
            length, pos = _varint(buf, pos, end)
            value = pos
            pos += length
        else:  # groups (deprecated) or garbage
            raise _Unplain
        if number == 0 or pos > end:
            raise _Unplain
        yield number, wire, start, value, pos


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise _Unplain


def _length_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LENGTH) + _encode_varint(len(payload)) + payload


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
