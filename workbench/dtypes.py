"""ONNX element types <-> numpy dtypes <-> onnxruntime's type strings."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

# onnxruntime's spelling of tensor element types, e.g. "tensor(float)".
_ORT_NAMES = {
    onnx.TensorProto.FLOAT: "float",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.STRING: "string",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "double",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.COMPLEX64: "complex64",
    onnx.TensorProto.COMPLEX128: "complex128",
    onnx.TensorProto.BFLOAT16: "bfloat16",
}


def numpy_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype that holds an ONNX element type (ml_dtypes for bfloat16/float8/int4)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def ort_type_string(elem_type: int) -> str:
    name = _ORT_NAMES.get(elem_type)
    if name is None:
        name = onnx.TensorProto.DataType.Name(elem_type).lower()
    return f"tensor({name})"


def elem_type_name(elem_type: int) -> str:
    return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "undefined"


FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))
SIGNED_INTS = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
UNSIGNED_INTS = frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
INTS = SIGNED_INTS | UNSIGNED_INTS
NUMERIC = FLOATS | INTS
BOOL = frozenset({np.dtype(np.bool_)})
ALL_PLAIN = NUMERIC | BOOL
