"""Resident set size of this process, for `--memory-limit`."""

from __future__ import annotations

import os
import re
import resource
import sys
from pathlib import Path

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'256M', '1.5G', '512MiB', '1048576' → bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a memory size: {text!r} (write e.g. 256M, 1G or a number of bytes)")
    value = float(match[1]) * _UNITS[match[2].upper()]
    if value <= 0:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return int(value)


def rss_bytes() -> int:
    statm = Path("/proc/self/statm")
    if statm.exists():
        resident_pages = int(statm.read_text().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # peak, the best portable figure
    return peak if sys.platform == "darwin" else peak * 1024
