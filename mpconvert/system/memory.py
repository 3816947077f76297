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


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def resident() -> int | None:
    """This process's resident memory now (VmRSS), in bytes; None where /proc does not tell."""
    return _status_kib("VmRSS")


def reset_peak() -> bool:
    """Start this process's peak resident memory (VmHWM) again from now; False where Linux cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # "5": reset the peak RSS, and nothing else (Linux 4.0 and later)
        return True
    except OSError:
        return False


def peak_resident() -> int | None:
    """This process's peak resident memory (VmHWM) since it started or since `reset_peak`, in bytes."""
    found = _status_kib("VmHWM")
    if found is not None:
        return found
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    except (ImportError, OSError):
        return None
