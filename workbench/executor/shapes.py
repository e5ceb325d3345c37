"""Symbol binding from input shapes, and shape resolution by substitution.

A symbolic dim is a name (`past_sequence_length`) or, as torch's dynamo exporter
writes them, a sum of terms over names (`s53 + s70`, `2*s0 - 1`); an expression
resolves once every name in it is bound. Anything else stays unknown until the
kernel runs (just-in-time shapes). Expressions are parsed, never evaluated as code.
"""

from __future__ import annotations

import operator
import re
from functools import lru_cache
from typing import Any

from ..addresses import items_at
from ..errors import InputError
from ..ir.graph import Graph

_SHAPE = operator.attrgetter("shape")


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


class SymbolBinder:
    """`bind_symbols` for one graph, with its inputs grouped by declared shape. Inputs
    declared alike (a decode step's dozens of KV caches) that arrive with one shape bind
    the same symbols to the same sizes, so each group's shapes are compared in one C
    pass and its first is read. Anything else (an input missing or without a shape, a
    group arriving with unlike shapes, two groups disagreeing) goes to `bind_symbols`,
    which binds or words the error as always; the symbols come out in its order."""

    __slots__ = ("graph", "_get", "_groups")

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        groups: dict[tuple, list[int]] = {}
        for vid in graph.inputs:
            shape = graph.values[vid].shape
            if shape and any(isinstance(d, str) for d in shape):
                groups.setdefault(tuple(shape), []).append(vid)
        self._get = items_at([vid for vids in groups.values() for vid in vids])
        #: (first position, end position, declared rank, ((axis, symbol), ...)) of each group
        self._groups, start = [], 0
        for shape, vids in groups.items():
            axes = tuple((axis, d) for axis, d in enumerate(shape) if isinstance(d, str))
            self._groups.append((start, start + len(vids), len(shape), axes))
            start += len(vids)

    def bind(self, feeds: dict[int, Any]) -> dict[str, int]:
        try:
            shapes = list(map(_SHAPE, self._get(feeds)))
        except (KeyError, AttributeError):
            return bind_symbols(self.graph, feeds)
        bindings: dict[str, int] = {}
        for start, end, rank, axes in self._groups:
            first = shapes[start]
            if end - start > 1 and shapes[start:end].count(first) != end - start:
                return bind_symbols(self.graph, feeds)
            if len(first) != rank:  # bind_symbols skips such an input
                continue
            for axis, dim in axes:
                got = int(first[axis])
                if bindings.setdefault(dim, got) != got:
                    return bind_symbols(self.graph, feeds)
        return bindings


def resolve(shape: tuple | None, bindings: dict[str, int]) -> tuple[int, ...] | None:
    """Substitute bound symbols; None when the rank or any symbol is unknown."""
    if shape is None:
        return None
    out = []
    for d in shape:
        if isinstance(d, str):
            value = bindings.get(d)
            if value is None:
                value = evaluate(d, bindings)
                if value is None:
                    return None
            d = value
        out.append(d)
    return tuple(out)


_NAME = r"[A-Za-z_][\w.]*"
_FACTOR = rf"(?:\d+|{_NAME})"
_TERM = re.compile(rf"\s*([+-])\s*({_FACTOR})(?:\s*\*\s*({_FACTOR}))?\s*")


@lru_cache(maxsize=4096)
def expression_terms(dim: str) -> tuple[tuple[int, str | int, str | int], ...] | None:
    """`s53 + s70` -> ((1, 's53', 1), (1, 's70', 1)); None when `dim` is a plain name
    or not a sum of (optionally scaled) names and integers."""
    text = dim.strip()
    if re.fullmatch(_NAME, text):
        return None
    if not text.startswith(("+", "-")):
        text = "+" + text
    terms, pos = [], 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None:
            return None
        sign, a, b = m.groups()
        terms.append((1 if sign == "+" else -1, _atom(a), _atom(b) if b is not None else 1))
        pos = m.end()
    return tuple(terms)


def _atom(token: str) -> str | int:
    return int(token) if token.isdigit() else token


def evaluate(dim: str, bindings: dict[str, int]) -> int | None:
    """The value of an expression dim under `bindings`, or None."""
    terms = expression_terms(dim)
    if terms is None:
        return None
    total = 0
    for sign, a, b in terms:
        a = bindings.get(a) if isinstance(a, str) else a
        b = bindings.get(b) if isinstance(b, str) else b
        if a is None or b is None:
            return None
        total += sign * a * b
    return total if total >= 0 else None


@lru_cache(maxsize=4096)
def symbols_in(dim: str) -> frozenset[str]:
    """The names a symbolic dim depends on (itself, for a plain name)."""
    terms = expression_terms(dim)
    if terms is None:
        return frozenset((dim,))
    return frozenset(x for _, a, b in terms for x in (a, b) if isinstance(x, str))
