"""If, Loop and Scan: run their subgraphs through nested executors.

Outer-scope values a body reads arrive after the formal inputs (in
`info.outer_read_names` order). Control flow is always an eager seam for capture:
which branch runs, and how often, is decided on the host.
"""

from __future__ import annotations

import numpy as np

from .registry import NodeInfo, declined, host_read, register

CONTROL_FLOW = declined("control_flow", "the executed subgraph is chosen on the host each run")


def _outer_values(info: NodeInfo, inputs: list, n_formal: int) -> dict:
    return dict(zip(info.outer_read_names, inputs[n_formal:]))


def _host_scalar(value) -> object:
    value = host_read(value)
    return value.reshape(-1)[0] if value.size else None


@register("If", since=1, capture=CONTROL_FLOW, data_dependent_shape=True)
def if_(info: NodeInfo):
    # a branch's values are not needed after it ran: it may reuse its buffers
    then_run = info.make_subgraph_runner(info.subgraphs["then_branch"], reusable=True)
    else_run = info.make_subgraph_runner(info.subgraphs["else_branch"], reusable=True)

    def run(inputs, outs):
        branch = then_run if bool(_host_scalar(inputs[0])) else else_run
        return branch([], _outer_values(info, inputs, 1))

    return run


@register("Loop", since=1, capture=CONTROL_FLOW, data_dependent_shape=True)
def loop(info: NodeInfo):
    body_graph = info.subgraphs["body"]
    body = info.make_subgraph_runner(body_graph)
    n_formal = len(info.input_dtypes)
    n_carried = len(body_graph.inputs) - 2
    n_scan = len(body_graph.outputs) - 1 - n_carried
    iter_dtype = np.int64
    xp = info.xp

    def run(inputs, outs):
        trip = inputs[0] if n_formal > 0 else None
        cond = inputs[1] if n_formal > 1 else None
        carried = list(inputs[2:n_formal])
        outer = _outer_values(info, inputs, n_formal)
        max_trips = None if trip is None else int(_host_scalar(trip))
        keep_going = True if cond is None else bool(_host_scalar(cond))
        scans: list[list] = [[] for _ in range(n_scan)]
        it = 0
        while keep_going and (max_trips is None or it < max_trips):
            # the body computes where the backend does: its iteration number and condition
            # are made there (a scalar fill), never handed over as host arrays
            cond_in = xp.full((), keep_going, dtype=np.bool_)
            results = body([xp.full((), it, dtype=iter_dtype), cond_in, *carried], outer)
            keep_going = bool(_host_scalar(results[0]))
            carried = list(results[1:1 + n_carried])
            for k in range(n_scan):
                scans[k].append(results[1 + n_carried + k])
            it += 1
        stacked = [_stack(xp, s, info, n_carried + k) for k, s in enumerate(scans)]
        return [*carried, *stacked]

    return run


def _stack(xp, parts: list, info: NodeInfo, out_index: int):
    if parts:
        return _stack_parts(xp, parts)
    dtype = info.output_dtypes[out_index] if out_index < len(info.output_dtypes) else None
    return np.empty((0,), dtype=dtype or np.float32)


def _stack_parts(xp, parts: list, axis: int = 0):
    """Stack per-iteration results where they live: on the device when every part is a
    device array, on the host when any is a host value (strings stay on the host)."""
    if any(isinstance(p, np.ndarray) for p in parts):  # (every part, on the numpy backend)
        return np.stack([host_read(p) for p in parts], axis=axis)
    return xp.stack(parts, axis=axis)


@register("Scan", since=9, capture=CONTROL_FLOW, data_dependent_shape=True)
def scan(info: NodeInfo):
    body_graph = info.subgraphs["body"]
    body = info.make_subgraph_runner(body_graph)
    n_scan_in = int(info.attr("num_scan_inputs"))
    n_formal = len(info.input_dtypes)
    n_state = n_formal - n_scan_in
    n_scan_out = len(body_graph.outputs) - n_state
    in_axes = list(info.attr("scan_input_axes", [0] * n_scan_in))
    in_dirs = list(info.attr("scan_input_directions", [0] * n_scan_in))
    out_axes = list(info.attr("scan_output_axes", [0] * n_scan_out))
    out_dirs = list(info.attr("scan_output_directions", [0] * n_scan_out))
    xp = info.xp

    def run(inputs, outs):
        states = list(inputs[:n_state])
        seqs = []
        for k, x in enumerate(inputs[n_state:n_formal]):
            mod = np if isinstance(x, np.ndarray) else xp
            x = mod.moveaxis(x, in_axes[k] % max(x.ndim, 1), 0)
            seqs.append(x[::-1] if in_dirs[k] else x)
        outer = _outer_values(info, inputs, n_formal)
        length = seqs[0].shape[0] if seqs else 0
        collected: list[list] = [[] for _ in range(n_scan_out)]
        for t in range(length):
            results = body([*states, *(s[t] for s in seqs)], outer)
            states = list(results[:n_state])
            for k in range(n_scan_out):
                collected[k].append(results[n_state + k])
        outputs = list(states)
        for k, parts in enumerate(collected):
            y = _stack_parts(xp, parts[::-1] if out_dirs[k] else parts)
            mod = np if isinstance(y, np.ndarray) else xp
            outputs.append(mod.moveaxis(y, 0, out_axes[k] % y.ndim))
        return outputs

    return run


@register("Scan", since=8, until=8, capture=CONTROL_FLOW, data_dependent_shape=True)
def scan_batched(info: NodeInfo):
    """Opset-8 Scan: axis 0 is a batch, the sequence is axis 1, optional sequence_lens."""
    body_graph = info.subgraphs["body"]
    body = info.make_subgraph_runner(body_graph)
    n_scan_in = int(info.attr("num_scan_inputs"))
    n_formal = len(info.input_dtypes)
    n_state = n_formal - 1 - n_scan_in
    n_scan_out = len(body_graph.outputs) - n_state
    directions = list(info.attr("directions", [0] * n_scan_in))
    xp = info.xp

    def run(inputs, outs):
        lens = None if inputs[0] is None else host_read(inputs[0])  # trip counts: decided on the host
        states0 = list(inputs[1:1 + n_state])
        seqs = list(inputs[1 + n_state:n_formal])
        outer = _outer_values(info, inputs, n_formal)
        batch = seqs[0].shape[0]
        final_states: list[list] = [[] for _ in range(n_state)]
        scanned: list[list] = [[] for _ in range(n_scan_out)]
        for b in range(batch):
            length = int(lens[b]) if lens is not None else seqs[0].shape[1]
            states = [s[b] for s in states0]
            per_step: list[list] = [[] for _ in range(n_scan_out)]
            for t in range(length):
                xs = [x[b, length - 1 - t] if directions[k] else x[b, t] for k, x in enumerate(seqs)]
                results = body([*states, *xs], outer)
                states = list(results[:n_state])
                for k in range(n_scan_out):
                    per_step[k].append(results[n_state + k])
            for k in range(n_state):
                final_states[k].append(states[k])
            for k in range(n_scan_out):
                scanned[k].append(_stack_parts(xp, per_step[k]))
        return [_stack_parts(xp, s) for s in final_states] + [_stack_parts(xp, s) for s in scanned]

    return run
