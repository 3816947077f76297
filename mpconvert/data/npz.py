"""Reading an .npz without trusting it: keys from the zip directory, each member checked before it is read.

A member whose header declares more data than it holds, or more than this
machine has free memory for, is refused with its key and declared shape
before anything is allocated; `allow_pickle=False` always, so an .npz can
never run code.
"""

from __future__ import annotations

import contextlib
import math
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from mpconvert.system.errors import MpconvertError
from mpconvert.system.memory import available_memory

SMALLER_SPLIT = "store a smaller validation split, e.g. a few thousand rows"
_NPY_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


@contextlib.contextmanager
def open_npz(path: Path) -> Iterator[_NpzArrays]:
    if not path.is_file():
        raise MpconvertError(f"data file not found: {path}", hint="pass an existing .npz file with --data")
    try:
        archive = zipfile.ZipFile(path)
    except Exception as exc:  # any failure to parse the zip directory is the file's
        raise _unreadable(path, exc) from exc
    with archive:
        yield _NpzArrays(path, archive)


class _NpzArrays(Mapping):
    """The arrays of an open .npz by key, each read only when looked up.

    Keys come from the zip directory (members are `KEY.npy`, as np.savez
    writes them), so listing or testing keys reads no data and members that
    are never looked up are never decompressed. Nothing is cached: a looked-up
    array is freed as soon as the caller drops it.
    """

    def __init__(self, path: Path, archive: zipfile.ZipFile):
        self._path = path
        self._archive = archive
        self._members = {name.removesuffix(".npy"): name for name in archive.namelist()}

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members  # Mapping's default would read the array

    def __getitem__(self, key: str) -> np.ndarray:
        info = self._archive.getinfo(self._members[key])
        shape, dtype = self._checked_header(key, info)
        try:
            with self._archive.open(info) as fp:
                # allow_pickle=False: an .npz can carry pickled objects, which
                # would run code on load; labelled data never needs them.
                return np.lib.format.read_array(fp, allow_pickle=False)
        except MemoryError:
            raise MpconvertError(
                f"ran out of memory reading {key!r} {shape} {dtype} from {self._path}", hint=SMALLER_SPLIT
            ) from None
        except Exception as exc:  # zlib, CRC, EOF, ...: whatever a damaged member raises
            raise _unreadable(self._path, exc) from exc

    def _checked_header(self, key: str, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype]:
        """The member's declared shape and dtype, refused before any data is read
        if the data could not be there or could not fit in memory."""
        try:
            with self._archive.open(info) as fp:
                version = np.lib.format.read_magic(fp)
                if version not in _NPY_HEADER_READERS:
                    raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
                shape, _, dtype = _NPY_HEADER_READERS[version](fp)
                header_bytes = fp.tell()
        except Exception as exc:  # a bad header, or a damaged zip entry
            raise _unreadable(self._path, exc) from exc
        declared = f"{key!r} declares shape {shape} {dtype}"
        if dtype.hasobject:
            raise MpconvertError(
                f"{self._path} holds object arrays ({key!r}), which could only be read by unpickling them",
                hint="save plain arrays: numbers, e.g. x.astype('float32'), and text as fixed-width strings, "
                "e.g. np.array(list_of_str) (dtype '<U..'), not dtype=object",
            )
        size = math.prod(shape) * dtype.itemsize
        stored = info.file_size - header_bytes
        if size > stored:
            raise MpconvertError(
                f"data file {self._path}: {declared} ({_bytes(size)}) but holds only {_bytes(stored)}: "
                "the file is truncated or its header does not match its data",
                hint="write the file again with np.savez or np.savez_compressed",
            )
        available = available_memory()
        if available is not None and size > available:
            raise MpconvertError(
                f"data file {self._path}: {declared} ({_bytes(size)}), "
                f"more than the {_bytes(available)} of memory available",
                hint=SMALLER_SPLIT,
            )
        return shape, dtype


def _bytes(n: int) -> str:
    """Like "64.0 TiB", in integers: a header may declare more than a float holds."""
    units = ("KiB", "MiB", "GiB", "TiB")
    power = min(len(units), max(0, (n.bit_length() - 1) // 10))
    if power == 0:
        return f"{n} bytes"
    tenths = n * 10 >> (10 * power)
    return f"{tenths // 10}.{tenths % 10} {units[power - 1]}"


def _unreadable(path: Path, exc: Exception) -> MpconvertError:
    return MpconvertError(
        f"cannot read data file {path}: {exc}",
        hint="write it with np.savez or np.savez_compressed",
    )
