"""Symbol binding from input shapes, and shape resolution by substitution."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..ir.graph import Graph


def input_symbols(graph: Graph) -> set[str]:
    """Symbols a run binds from the caller's input shapes."""
    out: set[str] = set()
    for vid in graph.inputs:
        shape = graph.values[vid].shape
        if shape:
            out.update(d for d in shape if isinstance(d, str))
    return out


def bind_symbols(graph: Graph, feeds: dict[int, Any]) -> dict[str, int]:
    """Bind every symbolic input dim; two inputs disagreeing on one symbol is an InputError."""
    bindings: dict[str, int] = {}
    bound_by: dict[str, str] = {}
    for vid in graph.inputs:
        value = graph.values[vid]
        if not value.shape or vid not in feeds:
            continue
        actual = getattr(feeds[vid], "shape", None)
        if actual is None or len(actual) != len(value.shape):
            continue
        for axis, (dim, got) in enumerate(zip(value.shape, actual)):
            if not isinstance(dim, str):
                continue
            prev = bindings.get(dim)
            if prev is None:
                bindings[dim] = int(got)
                bound_by[dim] = f"{value.name!r} axis {axis}"
            elif prev != got:
                raise InputError(
                    f"inputs disagree on symbol {dim!r}: {bound_by[dim]} is {prev} but "
                    f"{value.name!r} axis {axis} is {got}"
                )
    return bindings


def resolve(shape: tuple | None, bindings: dict[str, int]) -> tuple[int, ...] | None:
    """Substitute bound symbols; None when the rank or any symbol is unknown."""
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, str):
            d = bindings.get(d)
            if d is None:
                return None
        out.append(d)
    return tuple(out)
