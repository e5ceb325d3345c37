"""One rewritten weight for every graph that rewrites the same source the same way.

The weight rules (sibling fusion, padding, column-major layout, huge pages) run once
per If branch (`branch_weights`), and optimum's two branches read the very same weight
arrays and rewrite them alike: without this each branch would hold its own copy of
every rewritten weight. While `sharing_weights()` is in effect a rule asks `reuse(key,
sources)` before it makes a weight and hands what it made to `keep(key, sources, made)`:
the key names the rule and its parameters, the sources are the arrays it read (held
until the context ends, so that their ids keep naming them). Outside it, both do nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

_MADE: ContextVar[dict | None] = ContextVar("workbench_shared_weights", default=None)
T = TypeVar("T")


@contextmanager
def sharing_weights() -> Iterator[None]:
    token = _MADE.set({})
    try:
        yield
    finally:
        _MADE.reset(token)


def reuse(key: tuple, sources: tuple) -> Any | None:
    """What a rule made before from these very `sources` under `key`, else None."""
    made = _MADE.get()
    if made is None:
        return None
    hit = made.get((key, tuple(map(id, sources))))
    return None if hit is None else hit[1]


def keep(key: tuple, sources: tuple, result: T) -> T:
    """`result`, remembered as made from `sources` under `key` (while sharing)."""
    made = _MADE.get()
    if made is not None:
        made[(key, tuple(map(id, sources)))] = (sources, result)
    return result
