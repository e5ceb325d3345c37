"""Layout kernels: ops that rearrange or re-view data without computing on it.

Reshape Flatten Squeeze Unsqueeze Identity Transpose Split Expand declare
`produces_view`: their result can be a zero-copy view of input 0. Until the
executor takes those views itself, a kernel writes into a preallocated output
when it is given one, and otherwise returns the (zero-copy) view.

Several ops take their shape / axes / sizes as an input tensor (Reshape, Expand,
Tile, Split-13, Squeeze-13, Unsqueeze-13). When that input is a small initializer
it arrives in `info.constant_inputs` and is parsed once in the builder; otherwise
the kernel reads its values on the host each run, so it declines capture
(`host_read`).

The helpers in the first section are shared with :mod:`.indexing`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .registry import (
    CAPTURE_SUPPORTED,
    CaptureVerdict,
    KernelFn,
    NodeInfo,
    declined,
    host_read,
    register,
    register_with_host_variant,
)

INT64 = np.dtype(np.int64)

# --- helpers shared by the layout and indexing kernels ---------------------------------


def is_omitted(info: NodeInfo, pos: int) -> bool:
    """Whether optional input `pos` is absent (its name empty, or past the last)."""
    return not info.has_input(pos)


def is_static(info: NodeInfo, positions: tuple[int, ...]) -> bool:
    """Whether every input in `positions` is a build-time constant or omitted."""
    return all(p in info.constant_inputs or is_omitted(info, p) for p in positions)


def constant_ints(info: NodeInfo, pos: int) -> list[int] | None:
    """The values of constant input `pos` as Python ints; None when it is omitted."""
    if pos not in info.constant_inputs:
        return None
    return host_ints(info.constant_inputs[pos])


def host_ints(array: Any) -> list[int]:
    """An integer tensor's values on the host (`tolist` also copies a CuPy array back)."""
    values = host_read(array).tolist()
    return [int(values)] if not isinstance(values, list) else [int(v) for v in values]


def host_read_verdict(positions: tuple[int, ...], what: str) -> Callable[[NodeInfo], CaptureVerdict]:
    """Capture verdict: supported when the inputs at `positions` are constant, else host_read."""

    def verdict(info: NodeInfo) -> CaptureVerdict:
        if is_static(info, positions):
            return CAPTURE_SUPPORTED
        return declined("host_read", f"reads the {what} input's values on the host", positions)

    return verdict


def place(out: Any, value: Any) -> Any:
    """Write `value` into the preallocated `out`, or return `value` itself (maybe a view).

    A shape mismatch raises ValueError (not a WorkbenchError) so the executor
    retries without preallocation: its shape inference was wrong for this node.
    """
    if out is None:
        return value
    if out.shape != value.shape:
        raise ValueError(f"preallocated output has shape {out.shape}, the result has {value.shape}")
    out[...] = value
    return out


def shape_memo(compute: Callable[[tuple], Any], limit: int = 64) -> Callable[[tuple], Any]:
    """Cache `compute(shape)` per input shape; cleared when a growing dim fills it."""
    cache: dict[tuple, Any] = {}

    def get(shape: tuple) -> Any:
        got = cache.get(shape)
        if got is None:
            if len(cache) >= limit:
                cache.clear()
            got = cache[shape] = compute(shape)
        return got

    return get


def unary(fn: Callable[[Any], Any]) -> KernelFn:
    """A KernelFn computing `fn(inputs[0])` (a view or fresh array) and placing it."""

    def run(inputs: list, outs: list) -> tuple:
        return (place(outs[0], fn(inputs[0])),)

    return run


# --- Reshape ---------------------------------------------------------------------------


def reshape_target(in_shape: tuple, spec: list[int], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape: 0 copies the input dim (unless allowzero), -1 is inferred."""
    dims = list(spec) if allowzero else [
        in_shape[i] if d == 0 else d for i, d in enumerate(spec)]
    if -1 in dims:
        at = dims.index(-1)
        known = math.prod(d for i, d in enumerate(dims) if i != at)
        size = math.prod(in_shape)
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape {in_shape} into {tuple(spec)}")
        dims[at] = size // known
    return tuple(dims)


def _reshape_kernel(spec: list[int] | None, allowzero: bool) -> KernelFn:
    """`spec`: the constant shape input (or attribute); None reads input 1 every run."""
    if spec is None:

        def run_dynamic(inputs: list, outs: list) -> tuple:
            x = inputs[0]
            target = reshape_target(x.shape, host_ints(inputs[1]), allowzero)
            return (place(outs[0], x.reshape(target)),)

        return run_dynamic
    if -1 not in spec and (allowzero or 0 not in spec):
        fixed = tuple(spec)
        return unary(lambda x: x.reshape(fixed))
    target_of = shape_memo(lambda s: reshape_target(s, spec, allowzero))
    return unary(lambda x: x.reshape(target_of(x.shape)))


@register("Reshape", since=1, until=4, produces_view=True)
def reshape_1(info: NodeInfo) -> KernelFn:
    return _reshape_kernel([int(d) for d in info.attr("shape", [])], False)


@register("Reshape", since=5, produces_view=True, data_dependent_shape=True,
          capture=host_read_verdict((1,), "shape"))
def reshape_5(info: NodeInfo) -> KernelFn:
    allowzero = info.opset >= 14 and bool(info.attr("allowzero", 0))
    return _reshape_kernel(constant_ints(info, 1), allowzero)


# --- Flatten / Squeeze / Unsqueeze -----------------------------------------------------


@register("Flatten", since=1, produces_view=True)
def flatten(info: NodeInfo) -> KernelFn:
    axis = int(info.attr("axis", 1))

    def target(shape: tuple) -> tuple[int, int]:
        at = axis + len(shape) if axis < 0 else axis
        return (math.prod(shape[:at]), math.prod(shape[at:]))

    target_of = shape_memo(target)
    return unary(lambda x: x.reshape(target_of(x.shape)))


def _squeeze_kernel(axes: list[int] | None) -> KernelFn:
    if not axes:  # no axes: every size-1 dim goes
        return unary(lambda x: x.squeeze())
    axis = tuple(axes)
    return unary(lambda x: x.squeeze(axis=axis))


@register("Squeeze", since=1, until=12, produces_view=True)
def squeeze_1(info: NodeInfo) -> KernelFn:
    return _squeeze_kernel(info.attr("axes"))


@register("Squeeze", since=13, produces_view=True, data_dependent_shape=True,
          capture=host_read_verdict((1,), "axes"))
def squeeze_13(info: NodeInfo) -> KernelFn:

    def run_dynamic(inputs: list, outs: list) -> tuple:
        x, axes = inputs[0], inputs[1] if len(inputs) > 1 else None
        # onnx.reference: an empty axes tensor squeezes nothing; an omitted one squeezes all
        y = x.squeeze() if axes is None else x.squeeze(axis=tuple(host_ints(axes)))
        return (place(outs[0], y),)

    if not is_static(info, (1,)):
        return run_dynamic
    axes = constant_ints(info, 1)
    if axes is None:
        static = unary(lambda x: x.squeeze())
    else:
        axis = tuple(axes)
        static = unary(lambda x: x.squeeze(axis=axis))
    return static


def _unsqueezed(shape: tuple, axes: tuple[int, ...]) -> tuple[int, ...]:
    """Insert 1s at `axes`, negative ones counted against the output rank."""
    return _with_ones(shape, _unsqueeze_positions(len(shape), axes))


def _with_ones(shape: tuple, positions: tuple[int, ...]) -> tuple[int, ...]:
    """`shape` with a 1 inserted at each of the ascending output `positions`."""
    for at in positions:
        shape = shape[:at] + (1,) + shape[at:]
    return shape


def _unsqueeze_positions(rank: int, axes: tuple[int, ...]) -> tuple[int, ...]:
    """Where the 1s go in the output, ascending (each inserted in turn lands there)."""
    out_rank = rank + len(axes)
    ones = {a + out_rank if a < 0 else a for a in axes}
    if len(ones) != len(axes) or not all(0 <= a < out_rank for a in ones):
        raise ValueError(f"Unsqueeze axes {axes} are invalid for an input of rank {rank}")
    return tuple(sorted(ones))


def _unsqueeze_kernel(axes: list[int]) -> KernelFn:
    axis = tuple(axes)
    # the positions per input rank: a decode's growing dim misses any per-shape memo
    # every step, and the positions do not depend on the dims
    positions: dict[int, tuple[int, ...]] = {}

    def target_of(shape: tuple) -> tuple:
        at = positions.get(len(shape))
        if at is None:
            at = positions[len(shape)] = _unsqueeze_positions(len(shape), axis)
        return _with_ones(shape, at)

    return unary(lambda x: x.reshape(target_of(x.shape)))


@register("Unsqueeze", since=1, until=12, produces_view=True)
def unsqueeze_1(info: NodeInfo) -> KernelFn:
    return _unsqueeze_kernel(list(info.attr("axes", [])))


@register("Unsqueeze", since=13, produces_view=True, data_dependent_shape=True,
          capture=host_read_verdict((1,), "axes"))
def unsqueeze_13(info: NodeInfo) -> KernelFn:
    axes = constant_ints(info, 1)
    if axes is not None:
        return _unsqueeze_kernel(axes)

    def run_dynamic(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        return (place(outs[0], x.reshape(_unsqueezed(x.shape, tuple(host_ints(inputs[1]))))),)

    return run_dynamic


# --- Identity / Transpose ----------------------------------------------------------------


@register("Identity", since=1, produces_view=True)
def identity(info: NodeInfo) -> KernelFn:

    def run(inputs: list, outs: list) -> tuple:
        x, out = inputs[0], outs[0]
        # sequences (lists) and optionals (None or their content) pass through untouched
        if out is None or not hasattr(x, "shape"):
            return (x,)
        return (place(out, x),)

    return run


@register("Transpose", since=1, produces_view=True)
def transpose(info: NodeInfo) -> KernelFn:
    perm = info.attr("perm")
    if perm is None:  # default: reverse the dims
        return unary(lambda x: x.transpose())
    axes = tuple(int(p) for p in perm)
    return unary(lambda x: x.transpose(axes))


# --- Concat / Split ----------------------------------------------------------------------


@register("Concat", since=1)
def concat(info: NodeInfo) -> KernelFn:
    axis = int(info.attr("axis", 1))  # Concat-1 defaulted to 1; later opsets require it
    xp = info.xp

    def run(inputs: list, outs: list) -> tuple:
        out = outs[0]
        if out is None:
            return (xp.concatenate(inputs, axis=axis),)
        return (xp.concatenate(inputs, axis=axis, out=out),)

    return run


def split_sizes(dim: int, parts: int) -> list[int]:
    """Equal chunks of ceil(dim / parts); the last one takes what is left (Split-18)."""
    if dim % parts == 0:
        return [dim // parts] * parts
    chunk = dim // parts + 1
    return [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]


def _split_index(axis: int, sizes: list[int]) -> list[tuple]:
    """One index tuple per output; Ellipsis keeps negative axes rank-independent."""
    index, start = [], 0
    for size in sizes:
        part = slice(start, start + size)
        if axis >= 0:
            index.append((slice(None),) * axis + (part,))
        else:
            index.append((Ellipsis, part) + (slice(None),) * (-axis - 1))
        start += size
    return index


def _split_into(x: Any, index: list[tuple], outs: list) -> list:
    if len(index) != len(outs):
        raise ValueError(f"Split makes {len(index)} parts for {len(outs)} outputs")
    return [place(out, x[idx]) for out, idx in zip(outs, index, strict=True)]


def _split_builder(info: NodeInfo, split_input: bool) -> KernelFn:
    """Split; `split_input`: the chunk sizes may come as input 1 (Split-1, Split-13+)."""
    axis = int(info.attr("axis", 0))
    parts = int(info.attr("num_outputs", 0)) or len(info.output_dtypes)  # num_outputs: Split-18
    sizes = constant_ints(info, 1) if split_input else info.attr("split")
    if sizes:  # known at build time
        fixed = _split_index(axis, [int(s) for s in sizes])
        return lambda inputs, outs: _split_into(inputs[0], fixed, outs)

    equal_index = shape_memo(lambda dim: _split_index(axis, split_sizes(dim[0], parts)))

    def run_equal(inputs: list, outs: list) -> list:
        x = inputs[0]
        return _split_into(x, equal_index((x.shape[axis],)), outs)

    if not split_input:
        return run_equal

    def run_dynamic(inputs: list, outs: list) -> list:
        split = inputs[1] if len(inputs) > 1 else None
        if split is None:
            return run_equal(inputs, outs)
        return _split_into(inputs[0], _split_index(axis, host_ints(split)), outs)

    return run_equal if is_omitted(info, 1) else run_dynamic


def _split_1_capture(info: NodeInfo) -> CaptureVerdict:
    """Split-1 reads its sizes on the host when they come as a non-constant input 1."""
    if info.attr("split") is not None:
        return CAPTURE_SUPPORTED  # the attribute wins: input 1 is never read
    return host_read_verdict((1,), "split")(info)


@register("Split", since=1, until=1, produces_view=True, capture=_split_1_capture)
def split_1(info: NodeInfo) -> KernelFn:
    if info.attr("split") is None and not is_omitted(info, 1):
        return _split_builder(info, True)  # Split-1 could take the sizes as input 1
    return _split_builder(info, False)


@register("Split", since=2, until=12, produces_view=True)
def split_2(info: NodeInfo) -> KernelFn:
    return _split_builder(info, False)


@register("Split", since=13, produces_view=True, data_dependent_shape=True,
          capture=host_read_verdict((1,), "split"))
def split_13(info: NodeInfo) -> KernelFn:
    return _split_builder(info, True)


# --- Expand / Tile -----------------------------------------------------------------------


def _broadcast_shape(in_shape: tuple, shape: list[int]) -> tuple[int, ...]:
    """Expand broadcasts both ways: a 1 in `shape` keeps the input's dim. (numpy's
    broadcasting rule, written out: `np.broadcast_shapes` costs several microseconds,
    and a decode's growing dim asks again every step.)"""
    a, b = tuple(in_shape), tuple(shape)
    if len(a) < len(b):
        a = (1,) * (len(b) - len(a)) + a
    elif len(b) < len(a):
        b = (1,) * (len(a) - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shape mismatch: objects cannot be broadcast to a single shape: {in_shape} and "
                             f"{tuple(shape)}")
        out.append(y if x == 1 else x)
    return tuple(out)


def _broadcast_plan(in_shape: tuple, target: tuple, itemsize: int) -> tuple[tuple, tuple]:
    """(target, byte strides of a C-contiguous input of `in_shape` viewed as `target`):
    0 along every broadcast dim."""
    strides, step = [0] * len(target), itemsize
    lead = len(target) - len(in_shape)
    for j in range(len(in_shape) - 1, -1, -1):
        if in_shape[j] != 1:
            strides[lead + j] = step
        step *= in_shape[j]
    return target, tuple(strides)


@register_with_host_variant("Expand", since=8, produces_view=True, data_dependent_shape=True,
                            capture=host_read_verdict((1,), "shape"))
def expand(info: NodeInfo, host: bool) -> KernelFn:
    """A read-only zero-copy view where no output is preallocated; the host variant
    makes it with numpy's constructor on x's buffer."""
    xp = info.xp
    shape = constant_ints(info, 1)

    def expanded(x: Any, plan: tuple, out: Any) -> Any:
        target, strides = plan
        if out is None:  # a read-only zero-copy view
            if host and x.flags.c_contiguous and x.size:
                # numpy's constructor on x's buffer: a tenth of broadcast_to's cost, the same view
                view = np.ndarray(target, x.dtype, x, 0, strides)
                view.flags.writeable = False
                return view
            return xp.broadcast_to(x, target)
        if out.shape != target:
            raise ValueError(f"preallocated output has shape {out.shape}, Expand gives {target}")
        out[...] = x
        return out

    if shape is None:
        # the view's plan per (input shape, requested shape, item size): a decode step asks the same again
        plan_of_all = shape_memo(lambda key: _broadcast_plan(key[0], _broadcast_shape(key[0], list(key[1])), key[2]))

        def run_dynamic(inputs: list, outs: list) -> tuple:
            x = inputs[0]
            return (expanded(x, plan_of_all((x.shape, tuple(host_ints(inputs[1])), x.itemsize)), outs[0]),)

        return run_dynamic
    plan_of = shape_memo(lambda key: _broadcast_plan(key[0], _broadcast_shape(key[0], shape), key[1]))

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        return (expanded(x, plan_of((x.shape, x.itemsize)), outs[0]),)

    return run


def _tile_plan(in_shape: tuple, repeats: list[int]) -> tuple[tuple, tuple, tuple]:
    """(output shape, interleaved (repeat, dim) shape, input viewed with 1 per repeat)."""
    if len(repeats) != len(in_shape):
        raise ValueError(f"Tile: {len(repeats)} repeats for an input of rank {len(in_shape)}")
    out_shape = tuple(d * r for d, r in zip(in_shape, repeats, strict=True))
    interleaved = tuple(v for r, d in zip(repeats, in_shape, strict=True) for v in (r, d))
    source = tuple(v for d in in_shape for v in (1, d))
    return out_shape, interleaved, source


@register("Tile", since=6, data_dependent_shape=True,
          capture=host_read_verdict((1,), "repeats"))
def tile(info: NodeInfo) -> KernelFn:
    xp = info.xp

    def tiled(x: Any, plan: tuple, out: Any) -> Any:
        out_shape, interleaved, source = plan
        if out is None:
            out = xp.empty(out_shape, dtype=x.dtype)
        elif out.shape != out_shape:
            raise ValueError(f"preallocated output has shape {out.shape}, Tile gives {out_shape}")
        # one broadcast copy: view the (contiguous) output as (r0, d0, r1, d1, ...)
        out.reshape(interleaved)[...] = x.reshape(source)
        return out

    repeats = constant_ints(info, 1)
    if repeats is None:

        def run_dynamic(inputs: list, outs: list) -> tuple:
            x = inputs[0]
            return (tiled(x, _tile_plan(x.shape, host_ints(inputs[1])), outs[0]),)

        return run_dynamic
    plan_of = shape_memo(lambda s: _tile_plan(s, repeats))

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        return (tiled(x, plan_of(x.shape), outs[0]),)

    return run


# --- Shape / Size ------------------------------------------------------------------------


@register("Shape", since=1)
def shape(info: NodeInfo) -> KernelFn:
    xp = info.xp
    # Shape-15 start/end: Python slicing clamps exactly as the spec does
    dims = slice(int(info.attr("start", 0)), info.attr("end")) if info.opset >= 15 else slice(None)

    def run(inputs: list, outs: list) -> tuple:
        values = tuple(int(d) for d in inputs[0].shape[dims])
        out = outs[0]
        if out is None:
            out = xp.empty((len(values),), dtype=INT64)
        # one scalar fill per dim: the value travels as a kernel parameter, so this is
        # device work (recordable) and never a host->device copy of a numpy array, which
        # CuPy refuses (`device[...] = host` is a fill of a non-scalar)
        for i, d in enumerate(values):
            out[i] = d
        return (out,)

    return run


@register("Size", since=1)
def size(info: NodeInfo) -> KernelFn:
    xp = info.xp

    def run(inputs: list, outs: list) -> tuple:
        out = outs[0]
        if out is None:
            return (xp.full((), inputs[0].size, dtype=INT64),)
        out[...] = inputs[0].size
        return (out,)

    return run
