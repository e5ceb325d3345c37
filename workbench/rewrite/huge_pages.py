"""Level "all" on the cpu backend: MatMul weights in memory backed by 2 MiB pages
(rule `huge_pages`).

Why. One-token decode streams every weight from memory once a token. In 4 KiB pages
SmolLM2's 530 MB of MatMul weights are 130,000 translations, against the core's TLB
of about 3,000: each product walks the page tables for every page it reads, and leaves
the TLB full of weight pages, so the interpreter and numpy's small kernels that run
between two products (norms, attention, activations, the executor itself) miss on
their own code and data as well. In 2 MiB pages the same weights need about 270
translations. Measured on this project's 2-core machine, SmolLM2, a session with this
rule against one without, alternating (noise here swings single runs by 10%): the
captured fixed-KV launch loops, 300 passes each, 0.980 of the time (the products
20.7 -> 20.0 ms a token); whole decode steps, 40 rounds of 12 tokens, 0.981 (fixed KV)
and 0.980 (growing). Load writes these weights anyway; faulting 2 MiB pages is
usually the cheaper part of that (512 MiB: about 50 ms against 220 in 4 KiB pages), but
on these virtual machines a huge page the host has taken back costs more, and a
SmolLM2 load took 0.29-1.10 s (median 0.61) against 0.39-0.45 s without the rule
(later, 1.46-1.65 s against 0.46-0.52 for a while). So the arena times the faults it
takes (`FaultGate`): a fresh 64 MiB faulted at 0.72 GB/s in 2 MiB pages when the host
had taken them back and at 22-25 GB/s when not, against 3.0-3.3 GB/s in 4 KiB pages;
once a window of faults runs under `MIN_FAULT_RATE`, the arena takes no more weights:
the rules write the rest into 4 KiB pages of their own (numpy's memory would be advised
for huge pages too, where 4 MiB or more), with fewer `huge_pages` rows
(`WeightArena.stopped` says why).

How. A `WeightArena` hands out arrays from private anonymous mappings advised
MADV_HUGEPAGE and aligned to 2 MiB, filled one after another. The rules that write a
weight at load anyway (`matmul_siblings`, `matvec_layout`, `matvec_threads`) allocate
it there through `new_weight` while `placing_weights(arena)` is in effect, and this
rule copies in the MatMul weights no rule rewrote (a wide lm_head kept row-major,
still mapped from its file). The invariant: nothing about a weight changes but where
its bytes live: the same values in the same layout (and so the same strides). A padded weight's zero tail
(`matvec_threads`) begins a 2 MiB page of their own that is never written, so it
still reads as the kernel's shared zero page, resident nowhere; a padding with zero
columns between two halves stays in the 4 KiB `ZeroPages` it was written to (a huge
page would be written whole).

Only where the kernel backs such memory with huge pages: Linux, transparent huge
pages not "never".
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from ..addresses import address
from ..ir.graph import Graph
from .graph_edit import Rewrite, matmul_weights, replace_weight, weight_rewrite
from .weight_sharing import once

HUGE_PAGE = 2 << 20
#: chunks are mapped this large (a bigger weight gets a chunk of its own)
CHUNK = 64 << 20
#: weights smaller than this stay where they are (a few pages: nothing to gain)
MIN_BYTES = 1 << 20
#: bytes a second under which faulting 2 MiB pages costs load more than the 4 KiB pages
#: they replace fault at (3.0-3.3 GB/s measured), a token's 2% notwithstanding
MIN_FAULT_RATE = 2e9
#: the span of faults each judgement of the rate covers
FAULT_WINDOW = 32 << 20
_ALIGN = 4096
_THP_SETTINGS = "/sys/kernel/mm/transparent_hugepage/"


def huge_pages_available() -> bool:
    """Whether anonymous memory advised MADV_HUGEPAGE gets 2 MiB pages here."""
    if not all(hasattr(mmap, name) for name in ("MADV_HUGEPAGE", "MAP_PRIVATE", "MAP_ANONYMOUS")):
        return False
    try:
        with open(_THP_SETTINGS + "enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def _zero_page_on_read() -> bool:
    """Whether reading an untouched huge page maps the shared huge zero page (else the
    kernel gives it 2 MiB of zeroed memory of its own)."""
    try:
        with open(_THP_SETTINGS + "use_zero_page") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


class WeightArena:
    """A bump allocator over 2 MiB-aligned, MADV_HUGEPAGE chunks. A chunk's memory goes
    when the last array in it does (each array keeps its chunk's map alive)."""

    def __init__(self) -> None:
        self._chunks: list[tuple[int, int]] = []  # (first address, end address) of each chunk's usable span
        self._memory: _Span | None = None  # the current chunk's usable span
        self._used = 0
        self._zero_page = _zero_page_on_read()
        self._faults = FaultGate()

    @property
    def stopped(self) -> str | None:
        """Why the arena takes no more weights (huge pages faulting too slowly), else None."""
        return self._faults.stopped

    def empty(self, shape: tuple[int, ...], dtype: np.dtype, order: str = "C",
              zero_tail: int = 0) -> np.ndarray:
        """An uninitialised array in huge pages. `zero_tail` bytes at its end are left
        unwritten and start a huge page no other array uses, so they read as zeros from
        the shared zero page (the caller must not write them)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        head = nbytes - zero_tail
        start = -(-self._used // _ALIGN) * _ALIGN
        if zero_tail:
            start = -(-(start + head) // HUGE_PAGE) * HUGE_PAGE - head  # the tail on a huge page boundary
        end = start + nbytes
        if zero_tail:
            end = -(-end // HUGE_PAGE) * HUGE_PAGE  # nothing else in the tail's last huge page
        if self._memory is None or end > len(self._memory):
            self._new_chunk(max(CHUNK, nbytes + 2 * HUGE_PAGE))
            return self.empty(shape, dtype, order, zero_tail)
        memory = self._memory
        if zero_tail and not self._zero_page:
            tail_at = start + head  # 4 KiB zero pages instead of a zeroed huge page of its own
            memory.base.madvise(mmap.MADV_NOHUGEPAGE, memory.offset + tail_at, end - tail_at)
        self._used = end
        self._faults.fault(memory.view, start, start + head)
        return np.ndarray(shape, dtype, buffer=memory.view[start:start + nbytes], order=order)

    def copy(self, array: np.ndarray, order: str) -> np.ndarray:
        """`array`'s values in the arena, in `order` ("C" or "F")."""
        placed = self.empty(array.shape, array.dtype, order)
        write_weight(placed, array)
        return placed

    def holds(self, array: np.ndarray) -> bool:
        at = address(array)
        return any(lo <= at < hi for lo, hi in self._chunks)

    def _new_chunk(self, size: int) -> None:
        size = -(-size // HUGE_PAGE) * HUGE_PAGE
        chunk = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        chunk.madvise(mmap.MADV_HUGEPAGE)
        whole = np.frombuffer(chunk, np.uint8)
        skip = -address(whole) % HUGE_PAGE
        self._memory = _Span(chunk, skip, whole[skip:skip + size])
        self._chunks.append((address(whole) + skip, address(whole) + skip + size))
        self._used = 0


class FaultGate:
    """Faults a new weight's huge pages before it is written (a zero into each: the
    caller overwrites them) and times them, `FAULT_WINDOW` bytes at a time; `stopped`
    says why, once a window ran under `MIN_FAULT_RATE`."""

    __slots__ = ("stopped", "_bytes", "_seconds")

    def __init__(self) -> None:
        self.stopped: str | None = None
        self._bytes, self._seconds = 0, 0.0

    def fault(self, view: np.ndarray, start: int, end: int) -> None:
        if end <= start:
            return
        # `start` itself, then the first byte of each huge page after it: none before
        # `start`, whose page may hold the end of the weight before
        later = np.arange(-(-(start + 1) // HUGE_PAGE) * HUGE_PAGE, end, HUGE_PAGE)
        began = time.perf_counter()
        view[start] = 0
        view[later] = 0
        self._seconds += time.perf_counter() - began
        self._bytes += end - start
        if self._bytes >= FAULT_WINDOW:
            rate = self._bytes / max(self._seconds, 1e-9)
            if rate < MIN_FAULT_RATE:
                self.stopped = (f"2 MiB pages faulted at {rate / 1e9:.2f} GB/s, under "
                                f"{MIN_FAULT_RATE / 1e9:.1f}: the later weights stay in 4 KiB pages")
            self._bytes, self._seconds = 0, 0.0


class _Span:
    """A chunk's 2 MiB-aligned usable bytes: the map, where they start in it, the view."""

    __slots__ = ("base", "offset", "view")

    def __init__(self, base: mmap.mmap, offset: int, view: np.ndarray) -> None:
        self.base, self.offset, self.view = base, offset, view

    def __len__(self) -> int:
        return len(self.view)


_ARENA: ContextVar[WeightArena | None] = ContextVar("workbench_weight_arena", default=None)


@contextmanager
def placing_weights(arena: WeightArena | None) -> Iterator[None]:
    """While in effect, `new_weight` allocates in `arena` (None: numpy's memory)."""
    token = _ARENA.set(arena)
    try:
        yield
    finally:
        _ARENA.reset(token)


def new_weight(shape: tuple[int, ...], dtype: np.dtype, order: str = "C", zero_tail: int = 0) -> np.ndarray:
    """An array for a weight a load-time rule is about to write (uninitialised but for
    `zero_tail` bytes at its end, zeros the caller must not write): in the arena of the
    optimization in progress when it is of a size worth a huge page, else numpy's."""
    arena = _ARENA.get()
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if arena is not None and nbytes >= MIN_BYTES:
        if arena.stopped is None:
            return arena.empty(shape, dtype, order, zero_tail)
        if not zero_tail:  # numpy advises a big array's memory for huge pages too
            return _own_small_pages(shape, dtype, order, mmap.mmap)
    if zero_tail:
        return zero_tail_array(shape, dtype, order)
    return np.empty(shape, dtype, order=order)


#: bytes of source rows each block of `write_weight` copies (at least `_BLOCK_ROWS` rows)
_BLOCK_BYTES = 256 << 10
_BLOCK_ROWS = 16  # 16 float32 of a column-major destination's column: one cache line


def write_weight(dst: np.ndarray, src: np.ndarray) -> None:
    """`dst[...] = src`, a block of rows at a time. A load-time rule writes a row-major
    weight into a column-major array (relaid, fused, padded); done whole, the copy walks
    one of the two across rows and misses cache on every element; in blocks of about
    256 KiB both stay in cache (measured here, float32 C to F: 576x49152 1.1 -> 2.5 GB/s,
    576x3072 1.7 -> 5.6, 576x960 6.2 -> 14.7), and a SmolLM2 load took 0.44-0.77 s
    against 0.74-1.11 with its relayout done whole."""
    row_bytes = max(int(np.prod(src.shape[1:])) * src.itemsize, 1)
    rows = max(_BLOCK_ROWS, _BLOCK_BYTES // row_bytes // _BLOCK_ROWS * _BLOCK_ROWS)
    for at in range(0, src.shape[0], rows):
        dst[at:at + rows] = src[at:at + rows]


class ZeroPages(mmap.mmap):
    """Private anonymous memory in 4 KiB pages whose unwritten pages are meant to stay
    the kernel's shared zero page (`zero_tail_array`): the `huge_pages` rule leaves an
    array in it where it is, since copying it would write those zeros."""


def zero_tail_array(shape: tuple[int, ...], dtype: np.dtype, order: str) -> np.ndarray:
    """An array of zeros in private anonymous memory of its own (where the platform has
    it): pages nobody writes stay the kernel's shared zero page, read from cache and
    resident nowhere, so only what the caller fills costs memory and bandwidth; 4 KiB
    pages, so that a zero range inside the array stays unwritten when the rest is
    filled. Elsewhere plain `np.zeros`, the same values."""
    return _own_small_pages(shape, dtype, order, ZeroPages)


def _own_small_pages(shape: tuple[int, ...], dtype: np.dtype, order: str, kind: type[mmap.mmap]) -> np.ndarray:
    """Zeros in a private anonymous map of type `kind` of their own, in 4 KiB pages
    (where the platform has such maps; elsewhere `np.zeros`)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    private = getattr(mmap, "MAP_PRIVATE", None)
    if private is None or nbytes == 0:
        return np.zeros(shape, dtype, order=order)
    memory = kind(-1, nbytes, flags=private | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)  # a huge page would be written whole at the first write
    return np.ndarray(shape, dtype, buffer=memory, order=order)  # keeps the map alive through .base


def keeps_zero_pages(array: np.ndarray) -> bool:
    """Whether `array` lives in `ZeroPages` memory (its zeros must stay unwritten)."""
    return isinstance(array.base, ZeroPages)


def move_matvec_weights(graph: Graph, arena: WeightArena, release: dict | None) -> list[Rewrite]:
    """Rule `huge_pages`: every 2-D float weight only MatMul reads, as B, of at least
    `MIN_BYTES`, in the arena (copied in unless a rule already wrote it there), in its
    own layout. One row per weight."""
    rewrites = []
    for vid, uses in matmul_weights(graph):
        array = graph.initializers[vid]
        if array.nbytes < MIN_BYTES or keeps_zero_pages(array):
            continue
        if not arena.holds(array):
            if arena.stopped is not None:
                continue
            order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
            placed = once(("huge_pages", order), (array,), arena.copy, array, order)
            replace_weight(graph, vid, placed, release)
        del array
        rewrites.append(weight_rewrite("huge_pages", graph, vid, uses))
    return rewrites
