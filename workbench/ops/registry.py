"""Kernel registry: what each native kernel is, and how to find one for a node.

A kernel is registered as a *builder*: a function that receives a `NodeInfo`
(attributes, opset, dtypes, symbolic shapes of one node) and returns a `KernelFn`.
Building happens once per (node, dtypes, shapes) key, so attribute parsing and
any precomputation stays out of the per-run dispatch loop.

The calling contract of a `KernelFn` is

    results = fn(inputs, outs)

- `inputs`: one array per node input, `None` for an omitted optional input;
  control-flow ops also receive the outer-scope values their subgraphs read after the formal inputs.
- `outs`: one entry per node output: a preallocated array of the exact output
  shape and dtype when the executor could resolve it, else `None`.
- `results`: a sequence with one array per output. For a preallocated slot the
  kernel should write into it and return that same array (numpy's `out=`); for a
  `None` slot it returns a fresh array (its shape is resolved just in time). A
  kernel may return `None` for an output whose name is empty (not requested).

A `KernelFn` may also carry `fixed_arrays_form(inputs, outs)` (`with_fixed_arrays_form`):
the kernel reduced to what is left to do when a caller will call it again and again
with exactly these arrays (its checks of the arrays' shapes and addresses made once,
there), or None where that is not settled (the plain kernel is called then). It may
depend on the arrays' geometry only, never on their contents, and must return what
the plain kernel would. Who calls it so is the executor's business (a recorded launch
passes the very same arrays at every replay).

Kernels never know about capture or memoisation: they only *declare* properties
(`produces_view`, `may_run_in_place`, `capture`) and the executor decides. Nor do they
ask which backend they run on: a form that only holds for numpy arrays in host memory
(a compiled kernel, onnxruntime's exact float32 arithmetic, a view numpy alone can
make) is registered as the op's *host variant* (`register(..., host=True)`, or both
at once with `register_with_host_variant` for a builder taking `host`), which
`find_native` chooses over the generic kernel where the plan's arrays are numpy's
(`NodeInfo.host_arrays`), and never elsewhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KernelFn = Callable[[list, list], Sequence[Any]]


@dataclass(frozen=True)
class CaptureVerdict:
    """Whether a kernel can be recorded into a device graph, and if not why."""

    supported: bool
    reason: str | None = None  # a reason code, e.g. "host_read", "data_dependent_shape"
    detail: str = ""
    #: for "host_read": the input positions whose values the kernel reads on the host
    #: (a recording may take those values as constants where they are proven so)
    host_inputs: tuple[int, ...] = ()


CAPTURE_SUPPORTED = CaptureVerdict(True)


def declined(reason: str, detail: str, host_inputs: tuple[int, ...] = ()) -> CaptureVerdict:
    return CaptureVerdict(False, reason, detail, host_inputs)


@dataclass
class NodeInfo:
    """Everything a kernel builder may know about the node it implements."""

    name: str
    op_type: str
    domain: str
    opset: int
    attrs: dict[str, Any]
    input_dtypes: tuple[np.dtype | None, ...]
    output_dtypes: tuple[np.dtype | None, ...]
    #: symbolic shapes: tuple of int | str (symbol) per dim, or None if rank unknown
    input_shapes: tuple[tuple | None, ...] = ()
    output_shapes: tuple[tuple | None, ...] = ()
    #: False where the output name is empty (an optional output nobody asked for)
    output_used: tuple[bool, ...] = ()
    #: False where the input name is empty (an optional input left out); an input of
    #: unknown dtype (shape inference left it untyped) is present all the same
    input_present: tuple[bool, ...] = ()
    #: array module of the backend (numpy on the CPU, cupy on CUDA)
    xp: Any = np
    #: subgraphs (If/Loop/Scan bodies) by attribute name, as workbench.ir Graphs
    subgraphs: dict[str, Any] = field(default_factory=dict)
    #: small constant inputs known at build time (initializers of <= 64 elements, e.g.
    #: shapes and axes a builder parses once), by input position
    constant_inputs: dict[int, np.ndarray] = field(default_factory=dict)
    #: every input that is an initializer, whatever its size (weights a builder may lay
    #: out once, e.g. dequantized), by input position; shared, never to be written
    initializer_inputs: dict[int, np.ndarray] = field(default_factory=dict)
    #: names of the outer-scope values a control-flow node's subgraphs read; their
    #: arrays arrive after the formal inputs, in this order
    outer_read_names: tuple[str, ...] = ()
    #: control flow only: `make_subgraph_runner(graph, reusable=False)` returns
    #: `run(inputs: list, outer: dict[name, array]) -> list[outputs]`
    make_subgraph_runner: Any = None
    #: round float32 on the host as onnxruntime's CPU kernels do, bit for bit, where a
    #: kernel has such a form (`ort_float32`: costlier than numpy's own arithmetic). The
    #: plan asks for it where a model requantizes activations at run time, which turns
    #: one ulp into another int8 value (`SessionOptions.onnxruntime_rounding`)
    onnxruntime_rounding: bool = True
    #: onnxruntime's rounding allowed where a kernel's compiled form of it is also its
    #: fastest form (`SessionOptions.onnxruntime_rounding` not "never")
    faster_onnxruntime_rounding: bool = True

    def __post_init__(self) -> None:
        if not self.input_present:  # built by hand (tests): the inputs of a known dtype
            self.input_present = tuple(dt is not None for dt in self.input_dtypes)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    @property
    def host_arrays(self) -> bool:
        """Whether the node's arrays are numpy's, in host memory: where the registry
        takes an op's host variant (`KernelSpec.host`)."""
        return self.xp is np

    def has_input(self, pos: int) -> bool:
        """Whether input `pos` is given (named), whatever is known of its dtype."""
        return pos < len(self.input_present) and self.input_present[pos]


@dataclass(frozen=True)
class KernelSpec:
    """One registered native kernel."""

    domain: str
    op_type: str
    since: int
    until: int | None
    build: Callable[[NodeInfo], KernelFn]
    #: dtypes accepted for the inputs named by `dtype_inputs` (None: any)
    dtypes: frozenset | None = None
    dtype_inputs: tuple[int, ...] = (0,)
    produces_view: bool = False
    may_run_in_place: bool = False
    capture: CaptureVerdict | Callable[[NodeInfo], CaptureVerdict] = CAPTURE_SUPPORTED
    #: the output shape depends on input *values* (resolved just in time)
    data_dependent_shape: bool = False
    #: "native" or "host_fallback"
    kind: str = "native"
    #: extra admission test beyond opset and input dtypes (e.g. Cast's target dtype)
    accept: Callable[[NodeInfo], bool] | None = None
    #: input positions the kernel needs C-contiguous; the executor materialises (and
    #: records) a copy of a strided view there
    contiguous_inputs: tuple[int, ...] = ()
    #: the kernel keeps what it worked out about its last call's arrays (`SameArrays`):
    #: each node gets a build of its own, not one shared with look-alike nodes (which
    #: would take turns overwriting it)
    per_node: bool = False
    #: a host variant: its kernel takes numpy arrays in host memory only (a compiled
    #: form, onnxruntime's exact arithmetic); chosen over the op's generic kernel where
    #: the plan's arrays are numpy's, never elsewhere (`find_native`)
    host: bool = False

    def accepts(self, info: NodeInfo) -> bool:
        if self.host and not info.host_arrays:
            return False
        if not (self.since <= info.opset and (self.until is None or info.opset <= self.until)):
            return False
        if self.accept is not None and not self.accept(info):
            return False
        if self.dtypes is None:
            return True
        for i in self.dtype_inputs:
            if i < len(info.input_dtypes):
                dt = info.input_dtypes[i]
                if dt is not None and dt not in self.dtypes:
                    return False
        return True

    def capture_verdict(self, info: NodeInfo) -> CaptureVerdict:
        return self.capture(info) if callable(self.capture) else self.capture


_REGISTRY: dict[tuple[str, str], list[KernelSpec]] = {}


def register(
    op_type: str,
    *,
    domain: str = "",
    since: int = 1,
    until: int | None = None,
    dtypes: frozenset | None = None,
    dtype_inputs: tuple[int, ...] = (0,),
    produces_view: bool = False,
    may_run_in_place: bool = False,
    capture: CaptureVerdict | Callable[[NodeInfo], CaptureVerdict] = CAPTURE_SUPPORTED,
    data_dependent_shape: bool = False,
    accept: Callable[[NodeInfo], bool] | None = None,
    contiguous_inputs: tuple[int, ...] = (),
    per_node: bool = False,
    host: bool = False,
) -> Callable[[Callable[[NodeInfo], KernelFn]], Callable[[NodeInfo], KernelFn]]:
    """Decorator registering a kernel builder for `domain::op_type`, opsets since..until;
    `host`: the op's host variant (`KernelSpec.host`)."""

    def wrap(build: Callable[[NodeInfo], KernelFn]) -> Callable[[NodeInfo], KernelFn]:
        spec = KernelSpec(
            domain=_canonical_domain(domain), op_type=op_type, since=since, until=until,
            build=build, dtypes=dtypes, dtype_inputs=dtype_inputs,
            produces_view=produces_view, may_run_in_place=may_run_in_place,
            capture=capture, data_dependent_shape=data_dependent_shape, accept=accept,
            contiguous_inputs=contiguous_inputs, per_node=per_node, host=host,
        )
        _REGISTRY.setdefault((spec.domain, op_type), []).append(spec)
        return build

    return wrap


def register_with_host_variant(op_type: str, **kwargs: Any) -> Callable[[Callable[..., KernelFn]], Callable[..., KernelFn]]:
    """Decorator registering `build(info, host)` twice for `op_type` (`register`'s
    keywords): as the generic kernel (`host=False`) and as the op's host variant
    (`host=True`, `KernelSpec.host`), for a builder whose host forms share the rest."""

    def wrap(build: Callable[..., KernelFn]) -> Callable[..., KernelFn]:
        register(op_type, **kwargs)(functools.partial(build, host=False))
        register(op_type, host=True, **kwargs)(functools.partial(build, host=True))
        return build

    return wrap


def _canonical_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def find_native(info: NodeInfo) -> KernelSpec | None:
    """The native kernel for this node, or None: the newest `since` that accepts it, a
    host variant before a generic kernel of the same `since` (`KernelSpec.host`)."""
    specs = _REGISTRY.get((_canonical_domain(info.domain), info.op_type), ())
    best = None
    for spec in specs:
        if spec.accepts(info) and (best is None or (spec.since, spec.host) > (best.since, best.host)):
            best = spec
    return best


def native_op_types(domain: str = "") -> set[str]:
    return {op for (d, op) in _REGISTRY if d == _canonical_domain(domain)}


# --- reading device values on the host ----------------------------------------------


class CaptureViolation(RuntimeError):
    """A kernel read a value on the host while its launch was being recorded."""


_capturing: list[str] = []  # node labels currently being recorded (a stack)
_baked: list[dict[int, tuple[Any, Any]]] = []  # the arrays each of those recordings may bake


def host_read(array: Any) -> np.ndarray:
    """Every device-to-host read a kernel makes goes through here.

    While a device graph is being recorded a host read cannot be captured (the
    value would be baked in), so it raises `CaptureViolation`; the executor then
    quarantines the op type and re-plans. The one exception is an array the
    recording was handed as baked (`recording_launches`): a value proven the same
    for every replay, whose host copy is returned without touching the device.
    """
    if _capturing:
        baked = _baked[-1].get(id(array))
        if baked is not None and baked[0] is array:
            return baked[1]
        raise CaptureViolation(f"host read of a {getattr(array, 'shape', '?')} value while capturing "
                               f"{_capturing[-1]}")
    get = getattr(array, "get", None)  # CuPy arrays copy to the host with .get()
    return get() if get is not None and not isinstance(array, np.ndarray) else np.asarray(array)


def baked_copy(array: Any) -> np.ndarray | None:
    """The host copy the recording under way bakes for `array`, or None (not recording,
    or not baked): for a guard that must read a value without touching the device."""
    if _capturing:
        baked = _baked[-1].get(id(array))
        if baked is not None and baked[0] is array:
            return baked[1]
    return None


def numpy_first_int(array: np.ndarray) -> int:
    """The first value of a host (numpy) integer array, for a host variant's kernel.

    A host variant is called anew whenever its work is done (`KernelSpec.host`), so the
    value is read at every call, never kept; a value in device memory is no host
    variant's input, and is refused here (device reads go through `host_read`)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"numpy_first_int takes a numpy array, got {type(array).__name__}")
    return int(array.item(0))  # host-ok: a numpy array in host memory


def numpy_any(array: np.ndarray) -> bool:
    """Whether any element of a host (numpy) array is true, for a host variant's kernel
    (a rare exact branch), read at every call as `numpy_first_int`'s value is."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"numpy_any takes a numpy array, got {type(array).__name__}")
    return bool(array.any())  # host-ok: a numpy array in host memory


class recording_launches:
    """Context manager marking that kernel launches are being recorded for `label`.

    `baked` (id -> (array, its host copy)): arrays whose values the recording may take
    as constants, because whoever records proved them the same at every replay; a
    host read of one returns its host copy (see `host_read`)."""

    def __init__(self, label: str, baked: dict[int, tuple[Any, Any]] | None = None):
        self.label = label
        self.baked = {} if baked is None else baked  # the caller's own dict: it may add to it while recording

    def __enter__(self) -> None:
        _capturing.append(self.label)
        _baked.append(self.baked)

    def __exit__(self, *exc: Any) -> None:
        _capturing.pop()
        _baked.pop()


# --- small helpers kernel modules share -------------------------------------------


def with_fixed_arrays_form(run: KernelFn, form: Callable[[list, list], KernelFn | None]) -> KernelFn:
    """`run`, carrying `form` as its `fixed_arrays_form` (see the module docstring)."""
    run.fixed_arrays_form = form  # type: ignore[attr-defined]
    return run


def settled_call(fn: Callable[..., Any], args: tuple, results: tuple) -> KernelFn:
    """A fixed-arrays form that is one call: `fn(*args)` on the views and scratch worked
    out for the settled arrays, handing back `results` (the output arrays it writes)."""
    def call(inputs: list, outs: list) -> tuple:
        fn(*args)
        return results
    call.target = fn  # type: ignore[attr-defined] - what a recorded launch calls, for a reader to see
    return call


def fixed_arrays_kernel(fn: KernelFn, inputs: list, outs: list) -> KernelFn:
    """What to call in place of `fn` where every call passes exactly these arrays: the
    kernel's fixed-arrays form for them where it offers one, else `fn` itself."""
    form = getattr(fn, "fixed_arrays_form", None)
    reduced = form(inputs, outs) if form is not None else None
    return fn if reduced is None else reduced


def ufunc_kernel(fn: Callable[..., Any], arity: int) -> KernelFn:
    """A KernelFn calling one (numpy or CuPy) ufunc with `out=`, unary or binary."""
    if arity == 1:
        def unary(inputs: list, outs: list) -> tuple:
            return (fn(inputs[0], out=outs[0]),)
        return unary

    def binary(inputs: list, outs: list) -> tuple:
        return (fn(inputs[0], inputs[1], out=outs[0]),)
    return binary
