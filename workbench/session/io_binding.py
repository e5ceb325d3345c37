"""onnxruntime-shaped I/O binding: caller-owned buffers used in place, never copied."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError


class IOBinding:
    """Inputs and outputs bound to the caller's arrays for `run_with_iobinding`.

    A bound input is read where it lies; a bound output is written in place (so a
    KV cache bound as both past input and present output never moves).
    """

    def __init__(self, session: Any):
        self._session = session
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Any | None] = {}
        self._results: dict[str, Any] = {}

    def bind_input(self, name: str, array: Any) -> None:
        if name not in self._session._input_ids:
            raise InputError(f"cannot bind unknown input {name!r}; inputs are {sorted(self._session._input_ids)}")
        self.inputs[name] = array

    def bind_output(self, name: str, array: Any | None = None) -> None:
        """Bind an output to `array` (written in place), or to a buffer the session allocates."""
        if name not in self._session._output_ids:
            raise InputError(f"cannot bind unknown output {name!r}; outputs are {sorted(self._session._output_ids)}")
        if array is not None:
            value = self._session.graph.values[self._session._output_ids[name]]
            if value.dtype is not None and array.dtype != value.dtype:
                raise InputError(f"output {name!r} is {value.dtype}, cannot bind a {array.dtype} array")
            backend = self._session.backend
            if not backend.buffers_are_host and isinstance(array, np.ndarray) \
                    and not isinstance(backend.from_host(np.empty(0, array.dtype)), np.ndarray):
                # kernels write a bound output in place, on the device: a host array cannot be one
                raise InputError(f"output {name!r}: backend={backend.name!r} writes bound outputs in place on "
                                 f"the device; bind a device array ({backend.xp.__name__}.ndarray), or bind "
                                 "no array and read the session's with get_outputs()")
        self.outputs[name] = array

    def clear_binding_inputs(self) -> None:
        self.inputs.clear()

    def clear_binding_outputs(self) -> None:
        self.outputs.clear()
        self._results.clear()

    def get_outputs(self) -> list[Any]:
        """The bound outputs after a run: the caller's arrays, or session-made copies."""
        return [self._results[name] for name in self.outputs]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [np.array(self._session.backend.to_host(v)) for v in self.get_outputs()]
