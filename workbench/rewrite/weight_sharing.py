"""One rewritten weight for every graph that rewrites the same source the same way.

The weight rules (sibling fusion, padding, column-major layout, huge pages) run once
per If branch (`branch_weights`), and optimum's two branches read the very same weight
arrays and rewrite them alike: without this each branch would hold its own copy of
every rewritten weight. While `sharing_weights()` is in effect a rule makes a weight
through `once(key, sources, make, *args)`: the key names the rule and its parameters, the
sources are the arrays it reads (held until the context ends, so that their ids keep
naming them); `made_before` says whether `once` would hand back an earlier result.
Outside the context `once` just calls `make(*args)`.

The invariant: a result is handed back only for the same key and the very same source
arrays (by identity, held alive so an id cannot name another array), and a rule's
result is a function of exactly those: its parameters and the bytes of the sources,
which no rule writes. So the second branch gets the array it would have made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


def once(key: tuple, sources: tuple, make: Callable[..., T], *args: Any) -> T:
    """What `make(*args)` made from these very `sources` under `key` earlier in this
    context (the other If branch's), else `make(*args)`, remembered."""
    made = _MADE.get()
    if made is None:
        return make(*args)
    at = (key, tuple(map(id, sources)))
    if at not in made:
        made[at] = (sources, make(*args))
    return made[at][1]


def made_before(key: tuple, sources: tuple) -> bool:
    made = _MADE.get()
    return made is not None and (key, tuple(map(id, sources))) in made
