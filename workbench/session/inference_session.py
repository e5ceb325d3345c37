"""InferenceSession: onnxruntime's API over the workbench executor."""

from __future__ import annotations

import contextlib
import operator
import threading
from typing import Any

import numpy as np

from ..backend import get_backend
from ..dtypes import ort_type_string
from ..errors import InputError, SessionBusyError
from ..executor import Executor
from ..executor.describe import plan_rows, value_rows
from ..ir import load_graph
from ..ir.graph import Value
from ..rewrite.optimize import optimize, rewrite_rows
from ..trace import Recording
from .io_binding import IOBinding
from .options import RunOptions, SessionOptions


class NodeArg:
    """Name, shape and type of a model input or output, as onnxruntime reports them.
    Made once per session (a decode loop asks for them every step); `shape` is a new
    list at each read, as onnxruntime's, so a caller's edit changes nothing here."""

    __slots__ = ("name", "_shape", "type")

    def __init__(self, name: str, shape: list[int | str] | tuple | None, type: str) -> None:
        self.name, self.type = name, type
        self._shape = tuple(shape) if shape is not None else None

    @property
    def shape(self) -> list[int | str] | None:
        return list(self._shape) if self._shape is not None else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeArg) and (self.name, self._shape, self.type) == (
            other.name, other._shape, other.type)

    def __hash__(self) -> int:
        return hash((self.name, self._shape, self.type))

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, shape={self.shape!r}, type={self.type!r})"


def _node_arg(v: Value) -> NodeArg:
    type_ = ort_type_string(v.elem_type) if v.kind == "tensor" else f"{v.kind}"
    return NodeArg(v.name, v.shape, type_)


class InferenceSession:
    """Load a model once, run it many times.

    `model` is a path, an `os.PathLike`, the model's bytes or an `onnx.ModelProto`.
    """

    def __init__(self, model: Any, options: SessionOptions | None = None, backend: str = "cpu"):
        # one run at a time: the executor's buffers, memo and captured graphs are the
        # session's (concurrent `run` calls wait their turn, as onnxruntime allows them);
        # one decode at a time (`decoding`)
        self._run_lock = threading.RLock()
        self._decode_lock = threading.Lock()
        self._decoding_now = ""
        self.options = options or SessionOptions()
        self.backend = get_backend(backend)
        #: the graph as loaded from the model, before load-time rewrites (its structure;
        #: weights live in `graph`)
        self.loaded_graph, self.model_proto = load_graph(model)
        #: the graph that runs: `loaded_graph` after `options.graph_optimization_level`
        self.graph, self.rewrites = optimize(self.loaded_graph, self.options.graph_optimization_level,
                                             release=True, backend=self.backend.name,
                                             wide_weights=self.options.wide_weight_layout)
        if self.graph is not self.loaded_graph:
            # the loaded graph stays for its structure (what the rewrites replaced); its
            # weights would only hold memory the rewritten ones have taken over
            self.loaded_graph.initializers = {}
        with self.backend.work_scope():  # weights go to the device on the session's stream
            self.executor = Executor(self.graph, self.backend, options=self.options)
        #: the live Recording of every run (None when `options.trace` is off)
        self.recording: Recording | None = None
        if self.options.trace:
            self.new_recording()
        values = self.graph.values
        self._inputs = [values[v] for v in self.graph.inputs]
        self._outputs = [values[v] for v in self.graph.outputs]
        self._input_ids = {v.name: v.id for v in self._inputs}
        #: per input, what an array that needs no conversion looks like (`_check_inputs`)
        self._input_forms = [_input_form(v) for v in self._inputs]
        self._output_ids = {v.name: v.id for v in self._outputs}
        self._input_args = tuple(map(_node_arg, self._inputs))
        self._output_args = tuple(map(_node_arg, self._outputs))

    # -- onnxruntime-shaped API ---------------------------------------------------------

    def get_inputs(self) -> list[NodeArg]:
        return list(self._input_args)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._output_args)

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any],
            run_options: RunOptions | None = None) -> list[Any]:
        names = list(output_names) if output_names else [v.name for v in self._outputs]
        for name in names:
            if name not in self._output_ids:
                raise InputError(
                    f"unknown output {name!r}; the model's outputs are {sorted(self._output_ids)}"
                )
        ro = run_options or RunOptions()
        with self._run_lock, self.backend.work_scope():
            feeds = self._check_inputs(input_feed)
            self.executor.run(feeds, slot=ro.slot, phase=ro.phase)
            return [self._output(self._output_ids[n]) for n in names]

    def io_binding(self) -> IOBinding:
        return IOBinding(self)

    def run_with_iobinding(self, binding: IOBinding, run_options: RunOptions | None = None) -> None:
        """Run with bound inputs; bound output arrays are written in place."""
        caller_outputs = {self._output_ids[n]: a for n, a in binding.outputs.items() if a is not None}
        ro = run_options or RunOptions()
        with self._run_lock, self.backend.work_scope():
            feeds = self._check_inputs(binding.inputs)
            self.executor.run(feeds, caller_outputs, slot=ro.slot, phase=ro.phase)
            binding._results = {
                name: (array if array is not None else self._output(self._output_ids[name]))
                for name, array in binding.outputs.items()
            }

    @contextlib.contextmanager
    def decoding(self, who: str = "a decode"):
        """Hold the session for one decode (`Generator.generate` does): a second decode
        started meanwhile, from another thread or a re-run notebook cell, raises
        SessionBusyError instead of interleaving its steps with this one's."""
        if not self._decode_lock.acquire(blocking=False):
            raise SessionBusyError(
                f"this InferenceSession is already running {self._decoding_now}; it runs one decode at a time "
                "(wait for it, stop it, or give the second decode a session of its own)")
        self._decoding_now = who
        try:
            yield self
        finally:
            self._decode_lock.release()

    # -- introspection --------------------------------------------------------------------

    @property
    def plan(self):
        return self.executor.plan

    def new_recording(self) -> Recording:
        """Record the following runs into a fresh Recording (plan, values and load-time
        rewrites filled in); the previous one is left as it was for whoever holds it.
        This is how one decode becomes one recording."""
        rec = Recording(memory=self.options.trace_memory)
        rec.set_static(plan_rows(self.plan), value_rows(self.graph))
        for row in rewrite_rows(self.rewrites):
            rec.add_row("rewrites", step=-1, **row)
        self.recording = self.executor.recording = rec
        return rec

    def stop_recording(self) -> Recording | None:
        """Run untraced from now on (until `new_recording`); returns the Recording that
        was being written, as it stands. Tracing a window of a long decode, or timing
        one session with and without its trace, is these two calls."""
        rec, self.recording = self.recording, None
        self.executor.recording = None
        return rec

    def memo_stats(self) -> dict:
        """Counters of the decode-plan memo: primed, rebuilt, replayed, views reused, ..."""
        return self.executor.memo_stats.as_dict()

    def fallback_nodes(self) -> list[tuple[str, str, str]]:
        """(node name, domain, op_type) of every node that runs on the host fallback."""
        return [(p.node.name, p.node.domain, p.node.op_type) for p in self.plan.fallback_nodes()]

    # -- helpers ----------------------------------------------------------------------------

    def _output(self, vid: int) -> Any:
        """What the caller gets for graph output `vid`: nothing the next run overwrites."""
        value = self.executor.arrays[vid]
        if value is None or isinstance(value, list):
            return self._to_caller(value)
        return self.executor.output_for_caller(vid)

    def _to_caller(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._to_caller(v) for v in value]
        if value is None:
            return None
        return self.backend.to_host(value)

    def _check_inputs(self, input_feed: dict[str, Any]) -> dict[int, Any]:
        """The feeds by value id, each checked (dtype, rank, fixed dims) and on the backend.

        A decode step feeds dozens of caches: an array that is already a plain numpy
        array of the declared dtype, rank and fixed dims is taken after one comparison
        of each; anything else goes through `_check_one`, which converts or says why not."""
        if not isinstance(input_feed, dict):
            raise InputError(f"input_feed must be a dict of name -> array, got {type(input_feed).__name__}")
        if len(input_feed) != len(self._inputs):
            self._refuse_names(input_feed)
        feeds: dict[int, Any] = {}
        from_host = self.backend.from_host
        for v, (dtype, ndim, fixed_at, fixed) in zip(self._inputs, self._input_forms):
            arr = input_feed.get(v.name, _MISSING)
            if type(arr) is np.ndarray and arr.dtype == dtype and arr.ndim == ndim \
                    and (fixed_at is None or fixed_at(arr.shape) == fixed):
                feeds[v.id] = from_host(arr)
            elif arr is _MISSING:
                self._refuse_names(input_feed)
            else:
                feeds[v.id] = self._check_one(v, arr)
        return feeds

    def _refuse_names(self, input_feed: dict[str, Any]) -> None:
        """The InputError for a feed whose names are not the model's inputs: an unknown
        name first (a misspelt one is missing too), else the first missing input."""
        unknown = [n for n in input_feed if n not in self._input_ids]
        if unknown:
            raise InputError(
                f"unknown input {unknown[0]!r}; the model's inputs are {sorted(self._input_ids)}"
            )
        for v in self._inputs:
            if v.name not in input_feed:
                raise InputError(
                    f"missing input {v.name!r} (expected {_describe(v)})"
                )

    def _check_one(self, v: Value, arr: Any) -> Any:
        if v.kind != "tensor":
            return arr
        if not isinstance(arr, np.ndarray) and not isinstance(arr, self.backend.xp.ndarray):
            if isinstance(arr, (list, tuple, int, float, bool, np.generic)):
                arr = np.asarray(arr, dtype=v.dtype)
            else:
                raise InputError(f"input {v.name!r}: expected a numpy array, got {type(arr).__name__}")
        if v.dtype is not None and arr.dtype != v.dtype:
            if not (v.dtype.hasobject and arr.dtype.kind in "UO"):
                raise InputError(
                    f"input {v.name!r}: expected dtype {ort_type_string(v.elem_type)} "
                    f"({v.dtype}), got {arr.dtype}"
                )
            arr = arr.astype(object)
        if v.shape is not None:
            if arr.ndim != len(v.shape):
                raise InputError(
                    f"input {v.name!r}: expected rank {len(v.shape)} shape {_shape_str(v.shape)}, "
                    f"got rank {arr.ndim} shape {tuple(arr.shape)}"
                )
            for axis, (want, got) in enumerate(zip(v.shape, arr.shape)):
                if isinstance(want, int) and want != got:
                    raise InputError(
                        f"input {v.name!r}: dim {axis} must be {want} (shape {_shape_str(v.shape)}), "
                        f"got {got} (shape {tuple(arr.shape)})"
                    )
        return self.backend.from_host(arr)


_MISSING = object()


def _input_form(v: Value) -> tuple:
    """(dtype, rank, getter of the fixed dims, their sizes) an input's array must have
    to be taken as it is; a rank of -1 where the input is not a plain tensor of known
    dtype and rank (then every array is checked in full)."""
    if v.kind != "tensor" or v.dtype is None or v.dtype.hasobject or v.shape is None:
        return (None, -1, None, None)
    axes = [axis for axis, d in enumerate(v.shape) if isinstance(d, int)]
    if not axes:
        return (v.dtype, len(v.shape), None, None)
    getter = operator.itemgetter(*axes)
    return (v.dtype, len(v.shape), getter, getter(v.shape))


def _shape_str(shape: tuple) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _describe(v: Value) -> str:
    shape = _shape_str(v.shape) if v.shape is not None else "any shape"
    return f"{ort_type_string(v.elem_type)} {shape}"
