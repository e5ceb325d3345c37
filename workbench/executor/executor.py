"""Runs a Plan: binds symbols, resolves shapes, preallocates outputs, dispatches kernels."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError, WorkbenchError
from ..ir.graph import Graph
from .plan import KernelCache, Plan, build_plan
from .shapes import bind_symbols, input_symbols, resolve

_NO_OUTS: list = []


def _bound_signature(bound: dict[int, Any]) -> tuple:
    """Identity of the caller's output buffers: value, address, shape, strides, dtype."""
    return tuple(
        (vid, arr.__array_interface__["data"][0] if hasattr(arr, "__array_interface__") else id(arr),
         arr.shape, arr.strides, arr.dtype.str)
        for vid, arr in bound.items()
    )


class Executor:
    """Executes one graph. Owner buffers persist across runs while their shape holds.

    `jit_only` executors (subgraph bodies) never preallocate: each run's values are
    fresh arrays, so a Loop can keep every iteration's outputs.
    """

    def __init__(self, graph: Graph, backend: Any, *, cache: KernelCache | None = None,
                 jit_only: bool = False):
        self.graph = graph
        self.backend = backend
        self.cache = cache or KernelCache()
        self.jit_only = jit_only
        self.plan: Plan = build_plan(graph, backend.xp, self.cache, self._subgraph_runner)
        self._env: list[Any] = [None] * len(graph.values)
        for vid, arr in graph.initializers.items():
            self._env[vid] = backend.from_host(arr)
        self._input_symbols = input_symbols(graph)
        self._untrusted: set[str] = set()  # inferred symbols that proved inconsistent
        self._buffers: dict[int, Any] = {}  # value id -> owner buffer, reused while shape holds
        self._bound_key: Any = object()
        self._outs: list[list] = []  # per plan node: preallocated output slots
        self._dynamic: list[tuple] = []  # per plan node: slots resolved at dispatch time
        #: plan indices whose preallocated outputs had to be dropped (shape inference disagreed)
        self.jit_forced: set[int] = set()
        self.last_bindings: dict[str, int] = {}

    # -- shapes and buffers ---------------------------------------------------------

    def _buffer(self, vid: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        buf = self._buffers.get(vid)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._buffers[vid] = self.backend.allocate(shape, dtype)
        return buf

    def _prepare_outputs(self, bindings: dict[str, int], bound: dict[int, Any]) -> None:
        """Preallocate every output whose shape the bindings resolve; bound outputs are the caller's."""
        values = self.graph.values
        self._outs, self._dynamic = [], []
        for p in self.plan.nodes:
            outs: list = []
            dynamic = []
            for j, vid in enumerate(p.outputs):
                v = values[vid] if vid >= 0 else None
                if vid in bound:
                    outs.append(bound[vid])
                    continue
                if (v is None or v.dtype is None or v.shape is None or self.jit_only
                        or p.spec.kind == "host_fallback" or p.index in self.jit_forced):
                    outs.append(None)
                    continue
                shape = resolve(v.shape, bindings)
                if shape is not None:
                    outs.append(self._buffer(vid, shape, v.dtype))
                else:
                    outs.append(None)
                    if not any(isinstance(d, str) and d in self._untrusted for d in v.shape):
                        dynamic.append((j, vid))
            self._outs.append(outs)
            self._dynamic.append(tuple(dynamic))

    # -- running --------------------------------------------------------------------

    def run(self, feeds: dict[int, Any], bound_outputs: dict[int, Any] | None = None) -> list[Any]:
        """Run the plan on `feeds` (value id -> array); returns the value environment.

        `bound_outputs` (value id -> array) are written in place: the caller's arrays
        become those values' buffers for this run.
        """
        env = self._env
        for vid, arr in feeds.items():
            env[vid] = arr
        bound = bound_outputs or {}
        if self.jit_only:
            bindings: dict[str, int] = {}
            if self._bound_key is not None:
                self._prepare_outputs(bindings, bound)
                self._bound_key = None
        else:
            bindings = bind_symbols(self.graph, feeds)
            key = (tuple(bindings.items()), _bound_signature(bound))
            if key != self._bound_key:
                self._prepare_outputs(bindings, bound)
                self._bound_key = key
            bindings = dict(bindings)  # just-in-time symbols join it during this run
        self.last_bindings = bindings
        values = self.graph.values
        for p, outs, dynamic in zip(self.plan.nodes, self._outs, self._dynamic):
            ins = [env[i] if i >= 0 else None for i in p.inputs]
            if dynamic:
                outs = list(outs)
                for j, vid in dynamic:
                    shape = resolve(values[vid].shape, bindings)
                    if shape is not None:
                        outs[j] = self._buffer(vid, shape, values[vid].dtype)
            try:
                res = p.fn(ins, outs)
            except WorkbenchError:
                raise
            except Exception as e:  # noqa: BLE001 - every kernel failure is reported the same way
                res = self._retry_unallocated(p, ins, outs, e)
            for j, vid in enumerate(p.outputs):
                if vid < 0:
                    continue
                r = res[j]
                o = outs[j]
                if r is o:
                    env[vid] = r
                elif o is not None and getattr(r, "shape", None) == o.shape:
                    o[...] = r
                    env[vid] = o
                else:
                    env[vid] = self._adopt(p, vid, r, bindings)
        if bound:
            self._fill_bound(env, bound)
        return env

    def _fill_bound(self, env: list, bound: dict[int, Any]) -> None:
        for vid, arr in bound.items():
            value = env[vid]
            if value is arr:
                continue
            if getattr(value, "shape", None) != arr.shape:
                raise KernelError(
                    f"bound output {self.graph.values[vid].name!r} has shape {tuple(arr.shape)} but the "
                    f"model produced {tuple(getattr(value, 'shape', ()))}"
                )
            arr[...] = value
            env[vid] = arr

    def _retry_unallocated(self, p: Any, ins: list, outs: list, error: Exception) -> Any:
        """A kernel failed: if we had preallocated, shape inference may be wrong; retry once."""
        if any(o is not None for o in outs):
            try:
                res = p.fn(ins, [None] * len(outs))
            except Exception:  # noqa: BLE001 - report the original failure below
                pass
            else:
                self.jit_forced.add(p.index)
                self._bound_key = object()  # re-plan buffers next run
                return res
        shapes = ", ".join(
            f"{self.graph.values[i].name}{tuple(getattr(a, 'shape', ()))}:{getattr(a, 'dtype', type(a).__name__)}"
            for i, a in zip(p.inputs, ins) if i >= 0
        )
        raise KernelError(
            f"{p.node.label} failed on inputs [{shapes}]: {type(error).__name__}: {error}"
        ) from error

    def _adopt(self, p: Any, vid: int, r: Any, bindings: dict[str, int]) -> Any:
        """Take a just-in-time result: fix its dtype and bind the symbols its shape reveals."""
        value = self.graph.values[vid]
        if r is None and value.kind in ("optional", "unknown"):
            return r  # an empty optional
        if r is None:
            raise KernelError(f"{p.node.label} produced no value for output {value.name!r}")
        if value.kind != "tensor" or isinstance(r, (list, dict)):
            return r
        if not isinstance(r, np.ndarray) and not hasattr(r, "__cuda_array_interface__"):
            r = np.asarray(r)
        if value.dtype is not None and r.dtype != value.dtype:
            r = r.astype(value.dtype)
        if value.shape is not None and len(value.shape) == r.ndim:
            for d, got in zip(value.shape, r.shape):
                if isinstance(d, str) and d not in self._input_symbols:
                    have = bindings.get(d)
                    if have is None:
                        bindings[d] = got
                    elif have != got:
                        self._untrusted.add(d)
                        self._bound_key = object()
        return r

    # -- control flow -----------------------------------------------------------------

    def _subgraph_runner(self, graph: Graph):
        child = Executor(graph, self.backend, cache=self.cache, jit_only=True)
        formal = list(graph.inputs)
        outer = {graph.values[v].name: v for v in graph.outer_inputs}
        outputs = list(graph.outputs)

        def run(inputs: list, captures: dict[str, Any]) -> list:
            feeds = {vid: arr for vid, arr in zip(formal, inputs)}
            for name, vid in outer.items():
                feeds[vid] = captures[name]
            env = child.run(feeds)
            return [env[o] for o in outputs]

        run.executor = child  # type: ignore[attr-defined]
        return run
