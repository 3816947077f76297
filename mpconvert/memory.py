"""How much memory this machine has free: what .npz reading and the batch's worker count plan by."""

from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes of memory available now, or None where it cannot be told."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None
