"""Which of MLAS's x86-64 kernels onnxruntime takes on this CPU, and the cache size it
tiles by.

onnxruntime's CPU kernels pick their SIMD variant once, from CPUID: the FMA3 / AVX2
kernels where the CPU has AVX2 and FMA but no AVX-512, the AVX-512 ones where it has
AVX512F (softmax's sum of exponentials) or AVX512F/BW/DQ/VL ("AVX-512 core": the int8
MatMulNBits kernels). Each variant sums in its own order, so an emulation that is bit
for bit one of them is only that where onnxruntime takes the same one: the kernels
of `ort_float32`, `mlas_attention` and `nbits_int8` ask here.

The flags come from /proc/cpuinfo (Linux); elsewhere nothing is known and no variant
is claimed.
"""

from __future__ import annotations

import ctypes
import functools

_AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})

#: glibc's _SC_LEVEL2_CACHE_SIZE (bits/confname.h), what onnxruntime's Env asks sysconf for
_SC_LEVEL2_CACHE_SIZE = 191


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (lower case), empty where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def isa() -> str:
    """"avx512" (AVX-512 core), "avx2" (AVX2 and FMA, no AVX512F) or "none" (anything
    else: another architecture, an x86 CPU without FMA, AVX512F without the core set,
    or flags unknown)."""
    flags = cpu_flags()
    if _AVX512_CORE <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags and "avx512f" not in flags:
        return "avx2"
    return "none"


@functools.cache
def l2_cache_bytes() -> int:
    """The L2 cache size as onnxruntime's Env reports it (``sysconf``), 0 where unknown.
    MLAS's flash attention sizes its key/value tiles from it."""
    try:
        value = int(ctypes.CDLL(None).sysconf(_SC_LEVEL2_CACHE_SIZE))
    except (OSError, AttributeError):
        value = 0
    return max(value, 0)
