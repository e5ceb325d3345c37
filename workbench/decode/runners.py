"""One decode step on either runtime: workbench's session or onnxruntime's.

The Generator's loop is the same for both, so token-exact comparisons measure the
runtimes and nothing else. Only the I/O-binding calls differ.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np


def is_workbench_session(session: Any) -> bool:
    return hasattr(session, "executor") and hasattr(session, "run_with_iobinding")


def run_step(session: Any, feeds: dict[str, np.ndarray], bound_outputs: dict[str, np.ndarray],
             wanted: list[str], phase: str = "", slot: str = "primary") -> dict[str, np.ndarray]:
    """Run one step; `bound_outputs` are written in place, `wanted` are returned."""
    ours = is_workbench_session(session)
    if ours:
        run_options = _RUN_OPTIONS.get((phase, slot))
        if run_options is None:
            from ..session import RunOptions  # noqa: PLC0415 - decode sits above session

            run_options = _RUN_OPTIONS[phase, slot] = RunOptions(phase=phase, slot=slot)
    if not bound_outputs:
        if ours:
            return dict(zip(wanted, session.run(wanted, feeds, run_options)))
        return dict(zip(wanted, session.run(wanted, feeds)))
    kept = _BINDINGS.get(session)
    if kept is None:
        kept = _BINDINGS[session] = (_WorkbenchBinding if ours else _OnnxruntimeBinding)(session)
    return kept.run(session, feeds, bound_outputs, wanted, run_options if ours else None)


class _KeptBinding:
    """One session's IOBinding, kept from step to step, as a decode loop written for
    onnxruntime keeps it: an input or output is bound again only when its array is
    not the one bound last time, and only the wanted outputs come back. Binding a
    fixed-KV step's sixty caches afresh and copying every output back, the bound
    caches included, cost onnxruntime about 1.5 ms a SmolLM2 token: the benchmarks'
    peer would have been slowed by this loop, not by itself. Both runtimes get the
    same loop; only the binding calls (the subclasses) differ.

    The arrays bound are held here, so an array that is the one bound (same object,
    same shape) is the same memory; its new contents are what the next run reads."""

    def __init__(self, session: Any) -> None:
        self.binding = session.io_binding()
        self.inputs: dict[str, np.ndarray] = {}
        self.outputs: tuple = ()  # ((name, array or None), ...) in the order bound

    def run(self, session: Any, feeds, bound_outputs, wanted, run_options: Any) -> dict[str, np.ndarray]:
        for name, arr in feeds.items():
            arr = self._bindable(arr)
            held = self.inputs.get(name)
            if held is not arr or held.shape != arr.shape:
                self._bind_input(name, arr)
                self.inputs[name] = arr
        outputs = tuple(bound_outputs.items()) + tuple((name, None) for name in wanted)
        if not _same_outputs(outputs, self.outputs):
            self.binding.clear_binding_outputs()
            self._bind_outputs(bound_outputs, wanted)
            self.outputs = outputs
        return self._run(session, bound_outputs, wanted, run_options)


class _WorkbenchBinding(_KeptBinding):
    @staticmethod
    def _bindable(arr: Any) -> Any:
        return arr

    def _bind_input(self, name: str, arr: Any) -> None:
        self.binding.bind_input(name, arr)

    def _bind_outputs(self, bound_outputs: dict, wanted: list[str]) -> None:
        for name, arr in bound_outputs.items():
            self.binding.bind_output(name, arr)
        for name in wanted:
            self.binding.bind_output(name)

    def _run(self, session: Any, bound_outputs: dict, wanted: list[str], run_options: Any) -> dict:
        session.run_with_iobinding(self.binding, run_options)
        return dict(zip(self.binding.outputs, self.binding.get_outputs()))


class _OnnxruntimeBinding(_KeptBinding):
    _bindable = staticmethod(np.ascontiguousarray)

    def _bind_input(self, name: str, arr: Any) -> None:
        self.binding.bind_cpu_input(name, arr)

    def _bind_outputs(self, bound_outputs: dict, wanted: list[str]) -> None:
        for name, arr in bound_outputs.items():
            # present and past share this memory: onnxruntime writes the KV cache in place
            self.binding.bind_output(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)

    def _run(self, session: Any, bound_outputs: dict, wanted: list[str], run_options: Any) -> dict:
        for name in wanted:
            # unallocated again every run: onnxruntime would otherwise reuse the buffer it
            # allocated last run as a preallocated output, of last run's shape
            self.binding.bind_output(name, "cpu")
        session.run_with_iobinding(self.binding)
        results = self.binding.get_outputs()
        first = len(bound_outputs)
        return {name: results[first + i].numpy() for i, name in enumerate(wanted)}


def _same_outputs(now: tuple, then: tuple) -> bool:
    """The same output names in the same order, each bound to the very array it was."""
    return len(now) == len(then) and all(
        n == m and a is b and (a is None or a.shape == b.shape) for (n, a), (m, b) in zip(now, then))


#: (phase, slot) -> the RunOptions saying so (read, never written, by the session)
_RUN_OPTIONS: dict[tuple[str, str], Any] = {}

#: session -> its kept binding (gone with the session)
_BINDINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_proto(session: Any) -> Any:
    """The session's ModelProto (weights' bytes not loaded), when it can be had: workbench's
    prepared (shape-inferred) proto, or the file / bytes an onnxruntime session was made from."""
    if is_workbench_session(session):
        return session.model_proto
    import onnx  # noqa: PLC0415

    path = getattr(session, "_model_path", None)
    raw = getattr(session, "_model_bytes", None)
    try:
        return onnx.load(path, load_external_data=False) if path else onnx.load_from_string(raw) if raw else None
    except Exception:  # noqa: BLE001
        return None


def model_op_types(session: Any) -> set[str] | None:
    """The op types in the session's model, when they can be known."""
    if is_workbench_session(session):
        ops = set()
        stack = [session.graph]
        while stack:
            g = stack.pop()
            for node in g.nodes:
                ops.add(node.op_type)
                stack.extend(node.subgraphs.values())
        return ops
    model = model_proto(session)
    return {n.op_type for n in model.graph.node} if model is not None else None


def model_metadata(session: Any) -> dict[str, str]:
    if is_workbench_session(session):
        return {p.key: p.value for p in session.model_proto.metadata_props}
    try:
        return dict(session.get_modelmeta().custom_metadata_map)
    except Exception:  # noqa: BLE001
        return {}
