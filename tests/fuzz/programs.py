"""Random multi-step ONNX programs for the differential fuzzer.

A `Program` is a small description: graph inputs with their contents for every
step, a list of ops over named values, the outputs, and how to run it (switches,
slot schedule, io binding). `build_model` turns it into an ONNX model. Every op
records the shape it produces (ints, or symbols such as the growing KV length
"T"), so later ops only pick operands they are valid on; the description, not
the ONNX graph, is what the shrinker edits.

Choices come from a `Draw`: `RandomDraw` (seeded, for long campaigns) or
`HypothesisDraw` (so hypothesis can generate and shrink the same programs).
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # accepted by every onnxruntime >= 1.14
INT_MAX = 2**31 - 1
#: operands above this magnitude are not fed to ops that multiply (keeps fp32 well-conditioned)
BIG = 20.0
SWITCHES = ("capture", "decode_memo", "view_plan", "views", "compute_in_place", "release_dead_values")
#: where a case runs: the numpy backend, or backend="cuda" on the device-discipline double
#: (tests/cuda_double: CUDA's record-only capture, CuPy's host/device rules)
BACKENDS = ("cpu", "cuda")
SCHEDULES = ("primary", "verify", "alternate", "blocks", "random")

_DTYPES = {"f": TensorProto.FLOAT, "i": TensorProto.INT64, "b": TensorProto.BOOL}


# -- choices ------------------------------------------------------------------------------


class RandomDraw:
    """Choices from a seeded `random.Random` (no example limit, no shrinking)."""

    def __init__(self, seed: int):
        self._r = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self._r.randint(lo, hi)

    def bool(self, p: float = 0.5) -> bool:
        return self._r.random() < p

    def choice(self, seq):
        return seq[self.int(0, len(seq) - 1)]


class HypothesisDraw(RandomDraw):
    """Choices drawn from hypothesis's `st.data()`: each shrinks towards its low end
    (so `bool` shrinks to False and `choice` to the first, simplest item)."""

    def __init__(self, data: Any):
        from hypothesis import strategies as st

        self._data, self._st = data, st

    def int(self, lo: int, hi: int) -> int:
        # hypothesis's integers() favour small values; a small range is sampled uniformly
        # instead, so switches and features are drawn at the rates the generator asks for
        if hi - lo < 64:
            return self._data.draw(self._st.sampled_from(range(lo, hi + 1)))
        return self._data.draw(self._st.integers(lo, hi))

    def bool(self, p: float = 0.5) -> bool:
        return self.int(0, 19) >= round(20 * (1 - p))


# -- the description ----------------------------------------------------------------------


@dataclass
class Value:
    name: str
    dims: tuple  # each an int or a symbol (str)
    dtype: str = "f"  # "f" float32, "i" int64, "b" bool
    bound: float = 2.0  # an upper bound of |value|
    private: bool = False  # an io-bound state: only its own update op reads it


@dataclass
class Input:
    value: Value
    role: str  # "data" | "index" | "cond" | "past" | "state"
    steps: list  # contents per step (a fed-back input: only the first step's)


@dataclass
class Op:
    kind: str
    ins: list[str]
    outs: list[Value]
    attrs: dict = field(default_factory=dict)


@dataclass
class Program:
    inputs: list[Input]
    ops: list[Op]
    outputs: list[str]
    steps: int
    options: dict
    slots: list[str]
    iobinding: bool = False
    #: input -> output: the next step feeds this step's output (a growing KV cache)
    feedback: dict = field(default_factory=dict)
    #: input -> output bound to the very same array (io binding, a state updated in place)
    aliased: dict = field(default_factory=dict)
    #: symbol -> (smallest, largest) size over the steps
    sym_range: dict = field(default_factory=dict)

    def values(self) -> dict[str, Value]:
        vals = {i.value.name: i.value for i in self.inputs}
        for op in self.ops:
            vals.update({v.name: v for v in op.outs})
        return vals

    def summary(self) -> str:
        ops = ", ".join(f"{op.kind}{'/' + op.attrs['op'] if 'op' in op.attrs else ''}" for op in self.ops)
        on = [k for k, v in self.options.items() if v is True]
        return (f"{len(self.ops)} ops [{ops}], {self.steps} steps, slots={''.join(s[0] for s in self.slots[:self.steps])}, "
                f"iobinding={self.iobinding}, backend={self.options.get('backend', 'cpu')}, on={on}")


# -- shape helpers ------------------------------------------------------------------------


def broadcast(a: tuple, b: tuple) -> tuple | None:
    """numpy broadcasting of two symbolic shapes, or None where it is not certain."""
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


def numel_max(dims: tuple, sym_range: dict) -> int:
    return math.prod(d if isinstance(d, int) else sym_range[d][1] for d in dims)


def _factors(n: int) -> list[int]:
    return [f for f in range(2, n) if n % f == 0]


# -- the generator ------------------------------------------------------------------------


class _Gen:
    """Builds one Program from a Draw; every `_op_*` returns an Op or None (no operand fits)."""

    def __init__(self, draw: RandomDraw, backend: str | None = None):
        self.d = draw
        self.backend = backend
        self.rng = np.random.default_rng(draw.int(0, 2**31 - 1))
        self.steps = draw.int(6, 9)
        self.n = 0
        self.pool: list[Value] = []
        self.inputs: list[Input] = []
        self.ops: list[Op] = []
        self.sym_range: dict[str, tuple[int, int]] = {}

    def fresh(self, prefix: str = "v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def new_sym(self, lo: int, hi: int) -> str:
        name = self.fresh("s")
        self.sym_range[name] = (lo, hi)
        return name

    def lo(self, d) -> int:
        return d if isinstance(d, int) else self.sym_range[d][0]

    def hi(self, d) -> int:
        return d if isinstance(d, int) else self.sym_range[d][1]

    def floats(self, shape, lo=-2.0, hi=2.0) -> np.ndarray:
        return self.rng.uniform(lo, hi, size=shape).astype(np.float32)

    def add_input(self, role: str, dims: tuple, dtype: str, steps: list, bound: float = 2.0,
                  private: bool = False, prefix: str | None = None) -> Value:
        v = Value(self.fresh(prefix or role), dims, dtype, bound, private)
        self.inputs.append(Input(v, role, steps))
        if dtype == "f" and not private:
            self.pool.append(v)
        return v

    def index_input(self, shape: tuple, lo: int, hi: int) -> Value:
        """An int64 input whose contents change from step to step (or, sometimes, never)."""
        if self.d.bool(0.25):
            fixed = self.rng.integers(lo, hi + 1, size=shape)
            steps = [fixed.copy() for _ in range(self.steps)]
        else:
            steps = [self.rng.integers(lo, hi + 1, size=shape) for _ in range(self.steps)]
        return self.add_input("index", shape, "i", [s.astype(np.int64) for s in steps], prefix="idx")

    def pick(self, want=lambda v: True) -> Value | None:
        cands = [v for v in self.pool if v.dtype == "f" and not v.private and want(v)]
        if not cands:
            return None
        # prefer recent values: programs become chains more than flat fans
        return cands[-1 - min(self.d.int(0, 3), len(cands) - 1)] if self.d.bool(0.6) else self.d.choice(cands)

    def emit(self, kind: str, ins: list[str], outs: list[Value], **attrs) -> Op:
        op = Op(kind, ins, outs, attrs)
        self.ops.append(op)
        self.pool.extend(o for o in outs if o.dtype == "f")
        return op

    def out(self, dims: tuple, bound: float) -> Value:
        return Value(self.fresh(), tuple(dims), "f", min(bound, 1e6))

    # -- program skeleton -----------------------------------------------------------------

    def generate(self) -> Program:
        for _ in range(self.d.int(1, 2)):
            dims = self._random_dims()
            self.add_input("data", dims, "f", [self.floats(dims) for _ in range(self.steps)], prefix="x")
        kv = self.d.bool(0.6)
        feedback, aliased, outputs = {}, {}, []
        n_ops = self.d.int(3, 12)
        kv_at = self.d.int(0, n_ops) if kv else -1
        for k in range(n_ops + 1):
            if k == kv_at:
                feedback.update(self._kv_cache())
            if k < n_ops:
                self._random_op()
        iobinding = self.d.bool(0.4)
        if iobinding and self.d.bool(0.5):
            aliased.update(self._state_update())
        outputs = self._sinks() + list(feedback.values()) + list(aliased.values())
        options = {s: self.d.bool() for s in SWITCHES}
        options["trace"] = self.d.bool()
        options["graph_optimization"] = self.d.bool()  # "all" (load-time folding) or "disabled"
        prog = Program(self.inputs, self.ops, outputs, self.steps, options, [],
                       iobinding, feedback, aliased, self.sym_range)
        prog.slots = schedule(self.d.choice(SCHEDULES), self.steps, self.d)
        # drawn last, so that a seed's program is the one it was before backends were drawn
        prog.options["backend"] = self.backend or self.d.choice(BACKENDS)
        return prune(prog)

    def _random_dims(self) -> tuple:
        while True:
            dims = tuple(self.d.choice((1, 2, 3, 4, 6)) for _ in range(self.d.int(1, 3)))
            if math.prod(dims) <= 48:
                return dims

    def _kv_cache(self) -> dict:
        """past [1, T, D] -> present = Concat(past, rows, axis=1): T grows by one each step."""
        width = self.d.choice((2, 3, 4))
        t0 = self.d.int(1, 3)
        self.sym_range["T"] = (t0, t0 + self.steps)
        self.sym_range["T1"] = (t0 + 1, t0 + self.steps + 1)
        past = self.add_input("past", (1, "T", width), "f", [self.floats((1, t0, width))], prefix="past")
        rows = self.pick(lambda v: v.dims == (1, 1, width)) if self.d.bool(0.5) else None
        if rows is None:
            rows = self.add_input("data", (1, 1, width), "f",
                                  [self.floats((1, 1, width)) for _ in range(self.steps)], prefix="new")
        # the cache may grow large over the steps: every step adds |rows| <= bound
        present = self.out((1, "T1", width), max(past.bound, rows.bound))
        present.bound = 2.0 + rows.bound
        self.emit("kv_concat", [past.name, rows.name], [present])
        return {past.name: present.name}

    def _state_update(self) -> dict:
        """state_out = state * a + tanh(state * other): written over the state's own array."""
        dims = self._random_dims()
        state = self.add_input("state", dims, "f", [self.floats(dims)], bound=4.0, private=True,
                               prefix="state")
        other = self.pick(lambda v: broadcast(dims, v.dims) == dims and v.bound <= BIG)
        ins = [state.name] + ([other.name] if other is not None else [])
        out = Value(self.fresh(), dims, "f", 4.0)
        self.emit("state_update", ins, [out], a=np.float32(self.d.choice((0.5, 0.75, -0.5))),
                  c=self.floats(dims))
        return {state.name: out.name}

    def _sinks(self) -> list[str]:
        used = {i for op in self.ops for i in op.ins}
        sinks = [v.name for op in self.ops for v in op.outs
                 if v.name not in used and v.dtype == "f" and op.kind not in ("kv_concat", "state_update")]
        if not sinks:
            sinks = [self.pool[-1].name]
        return sinks[-4:]

    def _random_op(self) -> None:
        makers = [(self._op_unary, 3), (self._op_binary, 4), (self._op_div, 1), (self._op_reshape, 3),
                  (self._op_transpose, 2), (self._op_slice, 2), (self._op_slice_runtime, 3),
                  (self._op_squeeze, 1), (self._op_unsqueeze, 1), (self._op_expand, 1), (self._op_concat, 2),
                  (self._op_split, 1), (self._op_gather, 2), (self._op_reduce, 2), (self._op_matmul, 2),
                  (self._op_softmax, 1), (self._op_if, 2), (self._op_flatten, 1), (self._op_pattern, 2),
                  (self._op_sibling_matmuls, 1)]
        flat = [m for m, w in makers for _ in range(w)]
        for _ in range(8):
            if self.d.choice(flat)() is not None:
                return

    # -- elementwise --------------------------------------------------------------------

    def _op_unary(self):
        v = self.pick()
        if v is None:
            return None
        names = ["Neg", "Relu", "Tanh", "Sigmoid", "Abs"] + (["Exp"] if v.bound <= 3 else [])
        name = self.d.choice(names)
        # (math.exp only for Exp: other operands' bounds may be far beyond exp's range)
        bound = math.exp(v.bound) if name == "Exp" else {"Tanh": 1.0, "Sigmoid": 1.0}.get(name, v.bound)
        return self.emit("unary", [v.name], [self.out(v.dims, bound)], op=name)

    def _op_binary(self):
        a = self.pick()
        if a is None:
            return None
        name = self.d.choice(("Add", "Sub", "Mul"))
        small = (lambda v: v.bound <= BIG) if name == "Mul" else (lambda v: True)
        if name == "Mul" and a.bound > BIG:
            return None
        b = None
        if self.d.bool(0.6):
            b = self.pick(lambda v: v is not a and small(v) and broadcast(a.dims, v.dims) is not None
                          and numel_max(broadcast(a.dims, v.dims), self.sym_range) <= 64)
        const = None
        if b is None:
            const = self.floats(self._broadcastable_const(a.dims))
        other_bound = b.bound if b is not None else 2.0
        dims = broadcast(a.dims, b.dims) if b is not None else broadcast(a.dims, const.shape)
        bound = a.bound * other_bound if name == "Mul" else a.bound + other_bound
        ins = [a.name] + ([b.name] if b is not None else [])
        return self.emit("binary", ins, [self.out(dims, bound)], op=name, const=const, swap=self.d.bool())

    def _broadcastable_const(self, dims: tuple) -> tuple:
        """A shape that broadcasts onto `dims` (symbolic dims become 1)."""
        keep = self.d.int(0, len(dims))
        tail = dims[len(dims) - keep:]
        return tuple(d if isinstance(d, int) and self.d.bool(0.6) else 1 for d in tail)

    def _op_div(self):
        a = self.pick(lambda v: v.bound <= 1e4)
        if a is None:
            return None
        den = self.pick(lambda v: v is not a and broadcast(a.dims, v.dims) == a.dims) if self.d.bool() else None
        if den is None:  # a constant denominator kept away from zero
            mag = self.rng.uniform(0.5, 2.0, size=self._broadcastable_const(a.dims))
            sign = self.rng.choice([-1.0, 1.0], size=mag.shape)
            return self.emit("div", [a.name], [self.out(a.dims, a.bound * 2)],
                             const=(mag * sign).astype(np.float32))
        # a computed denominator: sigmoid(den) + 0.5 lies in [0.5, 1.5]
        return self.emit("div", [a.name, den.name], [self.out(a.dims, a.bound * 2)], const=None)

    # -- layout -------------------------------------------------------------------------

    def _reshape_target(self, dims: tuple) -> list | None:
        """1-2 random merges/splits/inserted or removed 1s; each element is (source axis | None, dim)."""
        elems = [(i, d) for i, d in enumerate(dims)]
        for _ in range(self.d.int(1, 2)):
            move = self.d.choice(("merge", "split", "insert1", "remove1"))
            if move == "merge":
                pairs = [i for i in range(len(elems) - 1)
                         if isinstance(elems[i][1], int) and isinstance(elems[i + 1][1], int)]
                if pairs:
                    i = self.d.choice(pairs)
                    elems[i:i + 2] = [(None, elems[i][1] * elems[i + 1][1])]
            elif move == "split":
                cands = [i for i, (_, d) in enumerate(elems) if isinstance(d, int) and _factors(d)]
                if cands and len(elems) < 5:
                    i = self.d.choice(cands)
                    f = self.d.choice(_factors(elems[i][1]))
                    elems[i:i + 1] = [(None, f), (None, elems[i][1] // f)]
            elif move == "insert1" and len(elems) < 5:
                elems.insert(self.d.int(0, len(elems)), (None, 1))
            elif move == "remove1":
                ones = [i for i, (_, d) in enumerate(elems) if d == 1]
                if ones and len(elems) > 1:
                    del elems[self.d.choice(ones)]
        return elems if elems else None

    def _shape_values(self, elems: list, allow_zero: bool = True) -> list | None:
        """The Reshape shape tensor for `elems`: symbols via 0 (same position) or one -1."""
        syms = [k for k, (_, d) in enumerate(elems) if not isinstance(d, int)]
        out = []
        for k, (src, d) in enumerate(elems):
            if isinstance(d, int):
                out.append(0 if allow_zero and src == k and self.d.bool(0.2) else d)
            elif allow_zero and src == k:
                out.append(0)
            elif len(syms) == 1:
                out.append(-1)
            else:
                return None
        if not syms and -1 not in out and self.d.bool(0.3):
            out[self.d.int(0, len(out) - 1)] = -1
        return out

    def _op_reshape(self):
        v = self.pick()
        if v is None:
            return None
        elems = self._reshape_target(v.dims)
        if elems is None:
            return None
        dims = tuple(d for _, d in elems)
        mode = self.d.choice(("const", "shape_chain", "input"))
        if mode == "shape_chain":  # shape = Concat(Gather(Shape(v), [axis]) | const, ...)
            parts = [("axis", src) if src is not None else ("const", d) for src, d in elems]
            return self.emit("reshape", [v.name], [self.out(dims, v.bound)], mode=mode, parts=parts)
        shape = self._shape_values(elems)
        if shape is None:
            return None
        if mode == "const" or any(not isinstance(d, int) for d in v.dims):
            return self.emit("reshape", [v.name], [self.out(dims, v.bound)], mode="const",
                             shape=np.array(shape, np.int64))
        # an int64 graph input holds the shape; sometimes it alternates between two targets
        other = self._reshape_target(v.dims) if self.d.bool(0.5) else None
        alt = [d for _, d in other] if other is not None and len(other) == len(elems) else list(dims)
        steps = [np.array(shape if self.d.bool() else alt, np.int64) for _ in range(self.steps)]
        out_dims = tuple(a if a == b else self.new_sym(min(a, b), max(a, b)) for a, b in zip(dims, alt))
        shp = self.add_input("index", (len(dims),), "i", steps, prefix="shape")
        return self.emit("reshape", [v.name, shp.name], [self.out(out_dims, v.bound)], mode="input")

    def _op_transpose(self):
        v = self.pick(lambda v: len(v.dims) >= 2)
        if v is None:
            return None
        perm = list(range(len(v.dims)))
        while perm == sorted(perm):
            self.rng.shuffle(perm)
        perm = [int(p) for p in perm]
        return self.emit("transpose", [v.name], [self.out(tuple(v.dims[p] for p in perm), v.bound)], perm=perm)

    def _slice_axis(self, d) -> tuple[int, int, int, Any]:
        """(start, end, step, output length) of a valid constant slice of an axis of size d."""
        if not isinstance(d, int):  # a window of known length, or everything
            m = self.lo(d)
            if self.d.bool(0.3):
                return 0, INT_MAX, 1, d
            length = self.d.int(1, m)
            if self.d.bool():
                start = self.d.int(0, m - length)
                return start, start + length, 1, length
            k = self.d.int(length, m)  # counted from the end: the newest rows
            return -k, (-k + length) if k > length else INT_MAX, 1, length
        step = self.d.choice((1, 1, 1, 2, -1, -2))
        for _ in range(10):
            start = self.d.int(-d, d - 1)
            end = self.d.int(start + 1, d + 1) if step > 0 else self.d.int(-d - 1, start - 1)
            if end == d + 1:
                end = INT_MAX
            n = len(range(d)[slice(start, end, step)])
            if n:
                return start, end, step, n
        return 0, d, 1, d

    def _op_slice(self):
        v = self.pick(lambda v: len(v.dims) >= 1)
        if v is None:
            return None
        rank = len(v.dims)
        axes = sorted(set(self.d.int(0, rank - 1) for _ in range(self.d.int(1, 2))))
        starts, ends, steps, dims = [], [], [], list(v.dims)
        for a in axes:
            s, e, st, n = self._slice_axis(v.dims[a])
            starts.append(s)
            ends.append(e)
            steps.append(st)
            dims[a] = n
        axes = [a - rank if self.d.bool(0.3) else a for a in axes]
        return self.emit("slice", [v.name], [self.out(tuple(dims), v.bound)], starts=starts, ends=ends,
                         axes=axes, steps=steps)

    def _op_slice_runtime(self):
        """starts from an int64 graph input that changes per step (optionally plus a constant):
        a fixed-length window, or everything from there on (a length that changes)."""
        v = self.pick(lambda v: any(self.lo(d) >= 2 for d in v.dims))
        if v is None:
            return None
        axis = self.d.choice([a for a, d in enumerate(v.dims) if self.lo(d) >= 2])
        m = self.lo(v.dims[axis])
        window = self.d.bool(0.7)
        length = self.d.int(1, m - 1) if window else 0
        room = m - length if window else m - 1  # the largest start that keeps a full window
        base = self.d.int(0, room // 2) if self.d.bool() else 0
        idx = self.index_input((1,), 0, room - base)
        dims = list(v.dims)
        if window:
            dims[axis] = length
        else:
            lo_len = m - room
            dims[axis] = self.new_sym(lo_len, self.hi(v.dims[axis]))
        return self.emit("slice_runtime", [v.name, idx.name], [self.out(tuple(dims), v.bound)], axis=axis,
                         base=base, length=length)

    def _op_squeeze(self):
        v = self.pick(lambda v: 1 in v.dims)
        if v is None:
            return None
        ones = [a for a, d in enumerate(v.dims) if d == 1]
        axes = sorted(set(self.d.choice(ones) for _ in range(self.d.int(1, len(ones)))))
        dims = tuple(d for a, d in enumerate(v.dims) if a not in axes)
        axes = [a - len(v.dims) if self.d.bool(0.3) else a for a in axes]
        return self.emit("squeeze", [v.name], [self.out(dims, v.bound)], axes=axes)

    def _op_unsqueeze(self):
        v = self.pick(lambda v: len(v.dims) <= 3)
        if v is None:
            return None
        rank = len(v.dims) + self.d.int(1, 2)
        axes = sorted(int(a) for a in self.rng.choice(rank, size=rank - len(v.dims), replace=False))
        it = iter(v.dims)
        dims = tuple(1 if a in axes else next(it) for a in range(rank))
        return self.emit("unsqueeze", [v.name], [self.out(dims, v.bound)], axes=axes)

    def _op_expand(self):
        v = self.pick(lambda v: 1 in v.dims or len(v.dims) < 3)
        if v is None:
            return None
        if self.d.bool(0.4):  # Expand(v, Shape(y)): the shape is computed at run time
            y = self.pick(lambda y: y is not v and broadcast(y.dims, v.dims) == y.dims
                          and numel_max(y.dims, self.sym_range) <= 64)
            if y is not None:
                return self.emit("expand", [v.name, y.name], [self.out(y.dims, v.bound)], shape=None)
        lead = tuple(self.d.int(1, 3) for _ in range(self.d.int(0, 1)))
        target = lead + tuple(self.d.int(1, 3) if d == 1 else d for d in v.dims)
        if numel_max(target, self.sym_range) > 64:
            return None
        shape = [d if isinstance(d, int) else 1 for d in target]
        return self.emit("expand", [v.name], [self.out(target, v.bound)], shape=np.array(shape, np.int64))

    def _op_concat(self):
        a = self.pick(lambda v: len(v.dims) >= 1 and numel_max(v.dims, self.sym_range) <= 32)
        if a is None:
            return None
        axis = self.d.int(0, len(a.dims) - 1)

        def fits(b):
            return len(b.dims) == len(a.dims) and all(x == y for k, (x, y) in enumerate(zip(a.dims, b.dims))
                                                      if k != axis)
        b = self.pick(fits) if self.d.bool(0.6) else None
        const = None
        if b is None and all(isinstance(d, int) for k, d in enumerate(a.dims) if k != axis):
            shape = list(a.dims)
            shape[axis] = self.d.int(1, 2)
            const = self.floats(tuple(shape))
        parts = [a.dims[axis], b.dims[axis] if b is not None else (const.shape[axis] if const is not None
                                                                      else a.dims[axis])]
        if self.d.bool(0.2):
            parts.append(a.dims[axis])
        dims = list(a.dims)
        if all(isinstance(p, int) for p in parts):
            dims[axis] = sum(parts)
        else:
            dims[axis] = self.new_sym(sum(self.lo(p) for p in parts), sum(self.hi(p) for p in parts))
        ins = [a.name] + ([b.name] if b is not None else [])
        bound = max(a.bound, b.bound if b is not None else 2.0)
        return self.emit("concat", ins, [self.out(tuple(dims), bound)], axis=axis - len(a.dims)
                         if self.d.bool(0.3) else axis, const=const, triple=len(parts) == 3)

    def _op_split(self):
        v = self.pick(lambda v: any(isinstance(d, int) and d >= 2 for d in v.dims))
        if v is None:
            return None
        axis = self.d.choice([a for a, d in enumerate(v.dims) if isinstance(d, int) and d >= 2])
        d = v.dims[axis]
        n = self.d.int(2, min(3, d))
        runtime = self.d.bool(0.4)

        def partition():
            cuts = sorted(self.rng.choice(np.arange(1, d), size=n - 1, replace=False).tolist())
            return [b - a for a, b in zip([0] + cuts, cuts + [d])]
        first = partition()
        steps = [np.array(first if not runtime or self.d.bool() else partition(), np.int64)
                 for _ in range(self.steps)]
        outs = []
        for k in range(n):
            sizes = {int(s[k]) for s in steps}
            dims = list(v.dims)
            dims[axis] = sizes.pop() if len(sizes) == 1 else self.new_sym(min(s[k] for s in steps),
                                                                          max(s[k] for s in steps))
            outs.append(self.out(tuple(dims), v.bound))
        ins = [v.name]
        if runtime:
            ins.append(self.add_input("index", (n,), "i", steps, prefix="split").name)
        return self.emit("split", ins, outs, axis=axis, split=None if runtime else np.array(first, np.int64))

    def _op_gather(self):
        v = self.pick(lambda v: len(v.dims) >= 1)
        if v is None:
            return None
        axis = self.d.int(0, len(v.dims) - 1)
        m = self.lo(v.dims[axis])
        shape = self.d.choice(((), (1,), (2,), (2, 2), (3,)))
        dims = v.dims[:axis] + shape + v.dims[axis + 1:]
        if len(dims) > 5 or numel_max(dims, self.sym_range) > 64:
            return None
        if self.d.bool():
            idx = self.index_input(shape, -m, m - 1)
            return self.emit("gather", [v.name, idx.name], [self.out(dims, v.bound)], axis=axis, indices=None)
        indices = self.rng.integers(-m, m, size=shape).astype(np.int64)
        return self.emit("gather", [v.name], [self.out(dims, v.bound)], axis=axis, indices=indices)

    def _op_flatten(self):
        v = self.pick(lambda v: all(isinstance(d, int) for d in v.dims))
        if v is None:
            return None
        axis = self.d.int(0, len(v.dims))
        dims = (math.prod(v.dims[:axis]), math.prod(v.dims[axis:]))
        return self.emit("flatten", [v.name], [self.out(dims, v.bound)], axis=axis)

    # -- reductions, linear algebra -----------------------------------------------------

    def _op_reduce(self):
        v = self.pick(lambda v: len(v.dims) >= 1)
        if v is None:
            return None
        name = self.d.choice(("ReduceSum", "ReduceMean", "ReduceMax"))
        rank = len(v.dims)
        axes = sorted(set(self.d.int(0, rank - 1) for _ in range(self.d.int(1, rank))))
        keep = self.d.bool()
        dims = tuple(1 if a in axes else d for a, d in enumerate(v.dims)) if keep else \
            tuple(d for a, d in enumerate(v.dims) if a not in axes)
        n = math.prod(self.hi(v.dims[a]) for a in axes)
        bound = v.bound * n if name == "ReduceSum" else v.bound
        axes = [a - rank if self.d.bool(0.3) else a for a in axes]
        return self.emit("reduce", [v.name], [self.out(dims, bound)], op=name, axes=axes, keepdims=int(keep))

    def _op_matmul(self):
        a = self.pick(lambda v: len(v.dims) >= 2 and v.bound <= BIG)
        if a is None:
            return None
        k = a.dims[-1]

        def fits(b):
            return (len(b.dims) >= 2 and b.dims[-2] == k and b.bound <= BIG
                    and broadcast(a.dims[:-2], b.dims[:-2]) is not None)
        b = self.pick(fits) if self.d.bool(0.5) else None
        const = None
        if b is None:
            if not isinstance(k, int):
                return None
            const = self.floats((k, self.d.int(1, 4)), -1.0, 1.0)
            dims, other = a.dims[:-1] + (const.shape[1],), 1.0
        else:
            dims, other = broadcast(a.dims[:-2], b.dims[:-2]) + (a.dims[-2], b.dims[-1]), b.bound
        if numel_max(dims, self.sym_range) > 96:
            return None
        ins = [a.name] + ([b.name] if b is not None else [])
        # a constant weight sometimes arrives transposed (tied embeddings do): the
        # load-time optimizer folds Transpose(initializer) into a new initializer
        return self.emit("matmul", ins, [self.out(dims, a.bound * other * self.hi(k))], const=const,
                         fold=const is not None and self.d.bool(0.4))

    def _op_sibling_matmuls(self):
        """Two or three MatMuls of one value, each with its own constant weight (Q/K/V,
        gate/up): the load-time optimizer fuses them into one MatMul and a Split."""
        a = self.pick(lambda v: len(v.dims) >= 2 and v.bound <= BIG and isinstance(v.dims[-1], int))
        if a is None:
            return None
        k = a.dims[-1]
        weights = [self.floats((k, self.d.int(1, 4)), -1.0, 1.0) for _ in range(self.d.int(2, 3))]
        outs = [self.out(a.dims[:-1] + (w.shape[1],), a.bound * self.hi(k)) for w in weights]
        if any(numel_max(o.dims, self.sym_range) > 96 for o in outs):
            return None
        return self.emit("sibling_matmuls", [a.name], outs, weights=weights)

    def _op_softmax(self):
        v = self.pick(lambda v: len(v.dims) >= 1)
        if v is None:
            return None
        axis = self.d.int(-len(v.dims), len(v.dims) - 1)
        return self.emit("softmax", [v.name], [self.out(v.dims, 1.0)], axis=axis)

    # -- what the load-time fusion rules match (rewrite/fusion_patterns.py) -------------

    def _op_pattern(self):
        """An RMSNorm, LayerNorm, GELU (erf / tanh) or SiLU written out op by op, in one
        of the forms exporters use; `leak` also reads one of its intermediates outside
        the chain (which must block the fusion), `eps_outside` puts epsilon outside the
        sqrt (not an RMSNorm: must not be fused)."""
        pattern = self.d.choice(("rms_norm", "layer_norm", "gelu_erf", "gelu_tanh", "silu"))
        norm = pattern in ("rms_norm", "layer_norm")
        v = self.pick(lambda v: v.bound <= (1e4 if pattern != "gelu_tanh" else BIG)
                      and (not norm or (len(v.dims) >= 1 and isinstance(v.dims[-1], int))))
        if v is None:
            return None
        leak = self.d.int(0, 5) if self.d.bool(0.3) else None
        attrs = {"pattern": pattern, "leak": leak, "form": self.d.int(0, 2), "eps_outside": False}
        bound = v.bound * 1.2 + 1.0
        if norm:
            width = v.dims[-1]
            attrs.update(weight=self.floats((width,), 0.5, 1.5), bias=self.floats((width,), -0.5, 0.5),
                         eps=np.float32(self.d.choice((1e-5, 1e-6, 0.1))), axis=-1 if self.d.bool() else len(v.dims) - 1,
                         with_bias=self.d.bool(), eps_outside=pattern == "rms_norm" and self.d.bool(0.15))
            bound = 1.5 * math.sqrt(width) + 0.5  # |x_i| <= sqrt(width) * rms(x)
        if leak is not None:
            bound += 1.0  # the leaked intermediate enters the output through a Sigmoid
        return self.emit("pattern", [v.name], [self.out(v.dims, bound)], **attrs)

    # -- control flow -------------------------------------------------------------------

    def _op_if(self):
        """If with a predicate that changes between steps, or one that never does; the
        branches are constants (skippable) or computations on an outer value."""
        pred = self.d.choice(("cond_fixed", "cond_changing", "index_less", "data_always"))
        ins: list[str] = []
        attrs: dict[str, Any] = {"pred": pred}
        if pred.startswith("cond"):
            flags = [self.d.bool() for _ in range(self.steps)] if pred == "cond_changing" else \
                [self.d.bool()] * self.steps
            c = self.add_input("cond", (1,), "b", [np.array([f], np.bool_) for f in flags], prefix="cond")
            ins.append(c.name)
        elif pred == "index_less":
            idx = self.index_input((1,), 0, 3)
            ins.append(idx.name)
            attrs["threshold"] = np.array([self.d.int(0, 3)], np.int64)
        else:
            src = self.pick()
            if src is None:
                return None
            ins.append(src.name)
        if self.d.bool():  # branches of constants: the predicate alone decides the outputs
            dims = self._random_dims()
            attrs.update(branch="const", then=self.floats(dims), els=self.floats(dims))
            return self.emit("if", ins, [self.out(dims, 2.0)], **attrs)
        outer = self.pick()
        if outer is None:
            return None
        attrs.update(branch="outer", then_op=self.d.choice(("Neg", "Relu", "Tanh")),
                     else_op=self.d.choice(("Sigmoid", "Abs", "Identity")))
        return self.emit("if", ins + [outer.name], [self.out(outer.dims, outer.bound)], **attrs)


def schedule(kind: str, steps: int, draw: RandomDraw) -> list[str]:
    if kind in ("primary", "verify"):
        return [kind] * steps
    if kind == "alternate":
        return ["primary" if k % 2 == 0 else "verify" for k in range(steps)]
    if kind == "blocks":
        size = draw.int(2, 3)
        return ["primary" if (k // size) % 2 == 0 else "verify" for k in range(steps)]
    return [draw.choice(("primary", "verify")) for _ in range(steps)]


def generate(draw: RandomDraw, backend: str | None = None) -> Program:
    """A random program; `backend` fixes where it runs (else it is drawn from BACKENDS)."""
    return _Gen(draw, backend).generate()


# -- editing (the shrinker's moves) --------------------------------------------------------


def prune(prog: Program) -> Program:
    """Drop ops nothing reads and inputs nothing reads (keeping fed-back pairs whole)."""
    outputs = [o for o in dict.fromkeys(prog.outputs)]
    live = set(outputs)
    keep = []
    for op in reversed(prog.ops):
        if any(o.name in live for o in op.outs):
            keep.append(op)
            live.update(op.ins)
    prog.ops = list(reversed(keep))
    prog.outputs = outputs
    prog.feedback = {i: o for i, o in prog.feedback.items() if o in outputs and i in live}
    prog.aliased = {i: o for i, o in prog.aliased.items() if o in outputs and i in live}
    prog.inputs = [i for i in prog.inputs if i.value.name in live]
    return prog


def without_op(prog: Program, k: int) -> Program | None:
    """`prog` with op k removed: its readers rewired to an earlier value of the same shape
    (its own inputs first). None when some reader cannot be rewired."""
    p = copy.deepcopy(prog)
    op = p.ops.pop(k)
    vals = {i.value.name: i.value for i in p.inputs}
    for earlier in p.ops[:k]:
        vals.update({v.name: v for v in earlier.outs})
    rename = {}
    for out in op.outs:
        same = [n for n in op.ins if n in vals and vals[n].dims == out.dims and vals[n].dtype == out.dtype
                and not vals[n].private]
        same += [n for n, v in vals.items() if v.dims == out.dims and v.dtype == out.dtype and not v.private]
        if same:
            rename[out.name] = same[0]
    readers = [o for o in p.ops[k:] for n in o.ins if n in {v.name for v in op.outs}]
    if any(n not in rename for o in readers for n in o.ins if n in {v.name for v in op.outs}):
        return None
    if op.kind in ("kv_concat", "state_update"):
        return None  # fed-back and aliased pairs are removed through `without_output`
    for o in p.ops[k:]:
        o.ins = [rename.get(n, n) for n in o.ins]
    p.outputs = [rename.get(n, n) for n in p.outputs if n not in {v.name for v in op.outs} or n in rename]
    p.outputs = [n for n in p.outputs if n not in vals or not any(i.value.name == n for i in p.inputs)]
    if not p.outputs:
        return None
    return prune(p)


def without_output(prog: Program, name: str) -> Program | None:
    p = copy.deepcopy(prog)
    p.outputs = [o for o in p.outputs if o != name]
    if not p.outputs:
        return None
    pairs = {**prog.feedback, **prog.aliased}
    p = prune(p)
    if any(pairs.get(i.value.name) == name for i in p.inputs):
        return None  # a fed-back pair goes whole (its input unread too), or not at all
    return p


# -- ONNX ---------------------------------------------------------------------------------


class _Builder:
    def __init__(self):
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"_{prefix}{self.n}"

    def const(self, array) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, ins: list, outs: list | None = None, **attrs) -> list[str]:
        outs = outs or [self.name("t")]
        self.nodes.append(helper.make_node(op_type, ins, outs, name=self.name(op_type), **attrs))
        return outs


def value_info(v: Value):
    dims = [d if isinstance(d, int) else (d if d == "T" else None) for d in v.dims]
    return helper.make_tensor_value_info(v.name, _DTYPES[v.dtype], dims)


def _build_op(op: Op, b: _Builder) -> None:
    a = op.attrs
    out = [v.name for v in op.outs]
    ins = op.ins
    kind = op.kind
    if kind == "unary":
        b.node(a["op"], ins, out)
    elif kind == "binary":
        operands = ins + ([b.const(a["const"])] if a["const"] is not None else [])
        b.node(a["op"], operands[::-1] if a["swap"] else operands, out)
    elif kind == "div":
        if a["const"] is not None:
            b.node("Div", [ins[0], b.const(a["const"])], out)
        else:
            sig = b.node("Sigmoid", [ins[1]])
            den = b.node("Add", [sig[0], b.const(np.float32(0.5))])
            b.node("Div", [ins[0], den[0]], out)
    elif kind == "reshape":
        if a["mode"] == "const":
            b.node("Reshape", [ins[0], b.const(a["shape"])], out)
        elif a["mode"] == "input":
            b.node("Reshape", ins, out)
        else:
            shape = b.node("Shape", [ins[0]])[0]
            parts = [b.node("Gather", [shape, b.const(np.array([x], np.int64))], axis=0)[0] if how == "axis"
                     else b.const(np.array([x], np.int64)) for how, x in a["parts"]]
            target = b.node("Concat", parts, axis=0)[0] if len(parts) > 1 else parts[0]
            b.node("Reshape", [ins[0], target], out)
    elif kind == "transpose":
        b.node("Transpose", ins, out, perm=a["perm"])
    elif kind == "slice":
        consts = [b.const(np.array(a[k], np.int64)) for k in ("starts", "ends", "axes", "steps")]
        b.node("Slice", [ins[0]] + consts, out)
    elif kind == "slice_runtime":
        starts = ins[1] if a["base"] == 0 else b.node("Add", [b.const(np.array([a["base"]], np.int64)), ins[1]])[0]
        ends = b.node("Add", [starts, b.const(np.array([a["length"]], np.int64))])[0] if a["length"] \
            else b.const(np.array([INT_MAX], np.int64))
        b.node("Slice", [ins[0], starts, ends, b.const(np.array([a["axis"]], np.int64))], out)
    elif kind == "squeeze":
        b.node("Squeeze", [ins[0], b.const(np.array(a["axes"], np.int64))], out)
    elif kind == "unsqueeze":
        b.node("Unsqueeze", [ins[0], b.const(np.array(a["axes"], np.int64))], out)
    elif kind == "expand":
        shape = b.node("Shape", [ins[1]])[0] if a["shape"] is None else b.const(a["shape"])
        b.node("Expand", [ins[0], shape], out)
    elif kind == "concat":
        second = ins[1] if len(ins) > 1 else (b.const(a["const"]) if a["const"] is not None else ins[0])
        parts = [ins[0], second] + ([ins[0]] if a["triple"] else [])
        b.node("Concat", parts, out, axis=a["axis"])
    elif kind == "split":
        split = ins[1] if a["split"] is None else b.const(a["split"])
        b.node("Split", [ins[0], split], out, axis=a["axis"])
    elif kind == "gather":
        indices = ins[1] if a["indices"] is None else b.const(a["indices"])
        b.node("Gather", [ins[0], indices], out, axis=a["axis"])
    elif kind == "flatten":
        b.node("Flatten", ins, out, axis=a["axis"])
    elif kind == "reduce":
        if a["op"] == "ReduceSum":  # opset 13+: axes is an input for ReduceSum only
            b.node("ReduceSum", [ins[0], b.const(np.array(a["axes"], np.int64))], out, keepdims=a["keepdims"])
        else:
            b.node(a["op"], ins, out, axes=a["axes"], keepdims=a["keepdims"])
    elif kind == "matmul":
        if a["const"] is None:
            weight = ins[1]
        elif a.get("fold"):
            weight = b.node("Transpose", [b.const(np.ascontiguousarray(a["const"].T))])[0]
        else:
            weight = b.const(a["const"])
        b.node("MatMul", [ins[0], weight], out)
    elif kind == "sibling_matmuls":
        for weight, name in zip(a["weights"], out, strict=True):
            b.node("MatMul", [ins[0], b.const(weight)], [name])
    elif kind == "softmax":
        b.node("Softmax", ins, out, axis=a["axis"])
    elif kind == "kv_concat":
        b.node("Concat", ins, out, axis=1)
    elif kind == "state_update":
        scaled = b.node("Mul", [ins[0], b.const(a["a"])])[0]
        mixed = b.node("Mul", [ins[0], ins[1] if len(ins) > 1 else b.const(a["c"])])[0]
        b.node("Add", [scaled, b.node("Tanh", [mixed])[0]], out)
    elif kind == "if":
        _build_if(op, b)
    elif kind == "pattern":
        _build_pattern(op, b)
    else:
        raise ValueError(f"unknown op kind {kind!r}")


def _build_pattern(op: Op, b: _Builder) -> None:
    """The chain, its intermediates in order; a leaked one is added to the output
    through a Sigmoid (so the output still depends on the whole chain)."""
    a = op.attrs
    x, form = op.ins[0], a["form"]
    f = np.float32
    made: list[str] = []

    def node(op_type, ins, **attrs):
        out = b.node(op_type, ins, **attrs)[0]
        made.append(out)
        return out

    if a["pattern"] in ("rms_norm", "layer_norm"):
        def mean(v):  # ReduceMean over the last axis (opset 17: axes is an attribute)
            return node("ReduceMean", [v], axes=[a["axis"]], keepdims=1)

        def square(v):
            return node("Mul", [v, v]) if form == 1 else node("Pow", [v, b.const(f(2.0))])

        src = x
        if a["pattern"] == "layer_norm":
            src = node("Sub", [x, mean(x)])
        var = mean(square(src))
        if a["eps_outside"]:
            root = node("Add", [node("Sqrt", [var]), b.const(a["eps"])])
        else:
            root = node("Sqrt", [node("Add", [var, b.const(a["eps"])])])
        if a["pattern"] == "layer_norm" or form == 2:
            normed = node("Div", [src, root])
        elif form == 1:
            normed = node("Mul", [node("Reciprocal", [root]), src])
        else:
            normed = node("Mul", [src, node("Div", [b.const(f(1.0)), root])])
        out = node("Mul", [b.const(a["weight"]), normed])
        if a["pattern"] == "layer_norm" and a["with_bias"]:
            out = node("Add", [out, b.const(a["bias"])])
    elif a["pattern"] == "silu":
        s = node("Sigmoid", [x])
        out = node("Mul", [s, x] if form == 1 else [x, s])
    else:
        if a["pattern"] == "gelu_erf":
            scaled = node("Div", [x, b.const(f(math.sqrt(2.0)))]) if form != 1 else \
                node("Mul", [x, b.const(f(1 / math.sqrt(2.0)))])
            e = node("Erf", [scaled])
        else:
            cube = node("Mul", [node("Pow", [x, b.const(f(3.0))]), b.const(f(0.044715))])
            e = node("Tanh", [node("Mul", [node("Add", [x, cube]), b.const(f(math.sqrt(2 / math.pi)))])])
        t = node("Add", [e, b.const(f(1.0))])
        if form == 0:
            out = node("Mul", [node("Mul", [x, t]), b.const(f(0.5))])
        elif form == 1:
            out = node("Mul", [node("Mul", [x, b.const(f(0.5))]), t])
        else:
            out = node("Mul", [node("Mul", [t, b.const(f(0.5))]), x])
    name = op.outs[0].name
    if a["leak"] is not None and len(made) > 1:
        leaked = made[a["leak"] % (len(made) - 1)]
        b.node("Add", [out, b.node("Sigmoid", [leaked])[0]], [name])
    else:
        b.node("Identity", [out], [name])


def _build_if(op: Op, b: _Builder) -> None:
    a = op.attrs
    ins = op.ins
    if a["pred"].startswith("cond"):
        pred = ins[0]
    elif a["pred"] == "index_less":
        pred = b.node("Less", [ins[0], b.const(a["threshold"])])[0]
    else:  # a sum of bounded values is never below this: the predicate never changes
        total = b.node("ReduceSum", [ins[0]], keepdims=0)[0]
        pred = b.node("Greater", [total, b.const(np.float32(-1e6))])[0]
    out = op.outs[0]
    info = helper.make_tensor_value_info(out.name + "_b", TensorProto.FLOAT,
                                         [d if isinstance(d, int) else None for d in out.dims])

    def branch(tag: str, make) -> onnx.GraphProto:
        node = make(out.name + "_b")
        return helper.make_graph([node], f"{out.name}_{tag}", [], [info])

    if a["branch"] == "const":
        then = branch("then", lambda o: helper.make_node("Constant", [], [o],
                                                         value=numpy_helper.from_array(a["then"])))
        els = branch("else", lambda o: helper.make_node("Constant", [], [o],
                                                        value=numpy_helper.from_array(a["els"])))
    else:
        outer = ins[-1]
        then = branch("then", lambda o: helper.make_node(a["then_op"], [outer], [o]))
        els = branch("else", lambda o: helper.make_node(a["else_op"], [outer], [o]))
    b.node("If", [pred], [out.name], then_branch=then, else_branch=els)


def build_model(prog: Program) -> onnx.ModelProto:
    b = _Builder()
    for op in prog.ops:
        _build_op(op, b)
    vals = prog.values()
    graph = helper.make_graph(b.nodes, "fuzz", [value_info(i.value) for i in prog.inputs],
                              [value_info(vals[o]) for o in prog.outputs], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
