"""What the process's page tables say about an array's memory (Linux /proc)."""

from __future__ import annotations

import mmap

import numpy as np


def pages_present(region: np.ndarray) -> list[bool]:
    """For each whole 4 KiB page of a contiguous array, whether the process has it mapped
    (/proc/self/pagemap bit 63): a page never written nor read has none."""
    first = -(-region.ctypes.data // mmap.PAGESIZE)
    last = (region.ctypes.data + region.nbytes) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first) * 8), np.uint64)
    return [bool(e >> np.uint64(63)) for e in entries]


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * mmap.PAGESIZE


def anon_huge_kib(array: np.ndarray) -> int:
    """AnonHugePages of the mapping that holds `array` (/proc/self/smaps)."""
    at, inside = array.ctypes.data, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= at < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0
