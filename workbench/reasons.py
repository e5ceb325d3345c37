"""The reason codes every layer speaks: why a node is not captured, why a captured
graph was retired. The executor decides with them, the trace stores them, reports
and widgets explain them; so they live here, below all of those."""

from __future__ import annotations

#: every reason a node is not captured, with what it means
DECLINE_REASONS = {
    "capture_disabled": "capture is turned off for this session or backend",
    "host_fallback_kernel": "the node runs on the onnx.reference host fallback",
    "host_read": "the kernel reads an input's values on the host (unless they are validated "
                 "shape-fold values, or shape arithmetic computed inside the captured segments, "
                 "which a recording bakes in: see the capture event 'bake')",
    "data_dependent_shape": "the output shape depends on input values",
    "control_flow": "If/Loop/Scan: the subgraph to run is chosen on the host",
    "sequence_value": "a sequence, optional or map value has no fixed device buffer",
    "growing_symbol": "a shape references a KV / sequence length that grows every step",
    "unresolved_shape": "an output shape is unknown before the kernel runs",
    "quarantined_op": "this op type broke a recording earlier and is kept eager",
    "kernel_declined": "the kernel declared itself not capturable",
    "segment_too_short": "the capturable run is shorter than min_segment_nodes",
    "host_only_dtype": "the value's dtype (e.g. strings) lives on the host only",
    "varying_shape": "a value the node reads or writes changed shape between the warm-up steps "
                     "(a mask or position range that grows, a just-in-time size): a graph recorded "
                     "with one shape would be retired the next step",
    "rerecord_limit": "the segment holding the node was retired capture_rerecord_limit times for "
                      "the same reason: it is captured no more in this slot",
}

#: why an installed graph was retired
RETIRE_REASONS = {
    "binding_changed": "a segment input's address, shape or dtype differs from capture time",
    "control_flow_shape_flip": "a control-flow output changed shape (e.g. LongRoPE short<->long)",
    "buffers_reallocated": "the executor re-planned its buffers (shapes changed)",
    "capture_failed": "a kernel read the host while recording (its op type is quarantined)",
    "stale_bake": "a value of shape arithmetic a recording baked in differed, once launched, from "
                  "the warm-up step's (the step ran eagerly; its readers stay seams in this slot)",
    "capture_api_error": "beginning, ending or launching a device graph failed (the step ran eagerly)",
    "kernel_error": "a kernel failed while recording (the step fails with a KernelError naming it)",
}
