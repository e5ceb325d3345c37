"""Rotary embedding of a one-token decode step as one matrix product (numpy backend).

The non-interleaved rotation of a row x of `head` features at position p is
x[:h]·cos − x[h:]·sin, x[h:]·cos + x[:h]·sin (h = head / 2). That is x @ R_p, where
R_p holds cos on its diagonal, −sin at (i + h, i) and sin at (i, i + h), zeros
elsewhere. One product rotates every query and key head of the step, where the
elementwise form takes three numpy calls (and those calls, each starting cold after
a weight product, are what a decode step's attention costs on the CPU).

Every GroupQueryAttention node of a model reads the same cos/sin cache initializers
at the same position within a step, so one `RotationMatrix` per pair of caches is
shared by all of them (`rotation_matrix`) and refilled only when the position moves:
once per step, not once per layer.

Values: the product adds the two nonzero terms with the BLAS kernel's rounding (a
fused multiply-add where the CPU has one) and head - 2 exact zeros, so a result may
differ from the elementwise form in its last bit, as onnxruntime's own rotary
kernel may. A non-finite feature (inf times the zeros) turns its whole rotated head
row to NaN, where the elementwise form leaves NaN or inf in two places: a head that
overflowed is garbage either way, and the attention over it is NaN in both.
"""

from __future__ import annotations

import weakref

import numpy as np

#: (id(cos), id(sin)) -> the matrix of those caches, while some kernel holds it (it
#: holds the caches, so neither id can be reused meanwhile)
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class RotationMatrix:
    """R_p for one pair of (positions, head / 2) cos/sin caches, refilled as p moves."""

    __slots__ = ("cos", "sin", "matrix", "position", "_diagonal", "_minus_sin", "_plus_sin", "__weakref__")

    def __init__(self, cos: np.ndarray, sin: np.ndarray) -> None:
        half = cos.shape[1]
        head = 2 * half
        self.cos, self.sin = cos, sin
        self.matrix = np.zeros((head, head), cos.dtype)
        flat = self.matrix.reshape(-1)
        step = head + 1  # from (i, j) to (i + 1, j + 1)
        self._diagonal = flat[::step].reshape(2, half)  # (i, i): cos[i mod h]
        self._minus_sin = flat[head * half::step]  # (i + h, i), i < h
        self._plus_sin = flat[half::step][:half]  # (i, i + h), i < h
        self.position = -1

    def at(self, position: int) -> np.ndarray:
        """R_position (the same array every call: valid until the next call)."""
        if position != self.position:
            self._diagonal[...] = self.cos[position]
            np.negative(self.sin[position], out=self._minus_sin)
            self._plus_sin[...] = self.sin[position]
            self.position = position
        return self.matrix


def rotation_matrix(cos: np.ndarray, sin: np.ndarray) -> RotationMatrix | None:
    """The shared matrix of these caches (constant ones: the model's initializers,
    whose contents never change), or None where they are not two 2-D float tables of
    one shape and dtype."""
    if (not isinstance(cos, np.ndarray) or not isinstance(sin, np.ndarray) or cos.ndim != 2
            or cos.shape != sin.shape or cos.dtype != sin.dtype or cos.dtype not in (np.float32, np.float64)):
        return None
    key = (id(cos), id(sin))
    found = _SHARED.get(key)
    if found is None:
        found = _SHARED[key] = RotationMatrix(cos, sin)
    return found
