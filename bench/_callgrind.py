"""Valgrind client requests from Python, so that a benchmark counts the instructions of one region only.

Callgrind is driven from inside the measured program by *client requests*: a fixed sequence of
instructions that does nothing on a real CPU and that Valgrind's translator recognises (valgrind.h,
``VALGRIND_DO_CLIENT_REQUEST``).  Python cannot emit it, so the sequence is put in an executable page
and called through ctypes.  Outside Valgrind the call costs a few instructions and returns 0.

Used by ``bench/append_instructions.py``: run under ``valgrind --tool=callgrind --instr-atstart=no``,
the setup (imports, opening the WAL, warm-up appends) runs uninstrumented and fast; the measured region
is bracketed by ``start()`` (instrumentation on, counters zeroed) and ``stop()`` (counters dumped to a
file, instrumentation off).  Only x86-64 is supported (the sequence differs per architecture).
"""

from __future__ import annotations

import ctypes
import mmap
import platform

# amd64 client request: rdi carries the address of (request, arg1..arg5); the four rotations of rdi by
# 3+13+61+51 = 128 bits leave it unchanged, and ``xchg rbx,rbx`` after them is the request itself; the
# answer comes back in rdx (0 outside Valgrind, set by ``xor edx, edx`` first).
_CODE = bytes.fromhex(
    "4889f8"  # mov rax, rdi
    "31d2"  # xor edx, edx
    "48c1c703" "48c1c70d" "48c1c73d" "48c1c733"  # rol rdi, 3 / 13 / 61 / 51 (the preamble)
    "4887db"  # xchg rbx, rbx
    "4889d0"  # mov rax, rdx
    "c3"  # ret
)

_RUNNING_ON_VALGRIND = 0x1001
_CALLGRIND_BASE = (ord("C") << 24) | (ord("T") << 16)
_DUMP_STATS_AT = _CALLGRIND_BASE + 3
_ZERO_STATS = _CALLGRIND_BASE + 1
_START_INSTRUMENTATION = _CALLGRIND_BASE + 4
_STOP_INSTRUMENTATION = _CALLGRIND_BASE + 5


class ClientRequests:
    """The requests this benchmark needs; ``running_on_valgrind`` is False outside Valgrind."""

    def __init__(self) -> None:
        if platform.machine() not in ("x86_64", "AMD64"):
            raise RuntimeError(f"Valgrind client requests are implemented for x86-64 only, not {platform.machine()}")
        self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._page.write(_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._call = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)(address)
        self._args = (ctypes.c_size_t * 6)()
        self._label = ctypes.create_string_buffer(64)
        self.running_on_valgrind = self._request(_RUNNING_ON_VALGRIND) > 0

    def _request(self, code: int, arg1: int = 0) -> int:
        self._args[0] = code
        self._args[1] = arg1
        return int(self._call(ctypes.addressof(self._args)))

    def start(self) -> None:
        """Instrument from here on (everything before ran uninstrumented), with every counter at zero."""
        self._request(_START_INSTRUMENTATION)
        self._request(_ZERO_STATS)

    def stop(self, label: str) -> None:
        """Write the counters since ``start`` to a dump file (named with a ``.1`` suffix and ``label``
        inside), then stop instrumenting."""
        self._label.value = label.encode()[:63]
        self._request(_DUMP_STATS_AT, ctypes.addressof(self._label))
        self._request(_STOP_INSTRUMENTATION)
