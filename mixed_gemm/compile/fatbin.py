"""Minimal reader for NVIDIA fatbin containers, so tests and callers can check which targets a
fatbin holds without cuobjdump (which a bare CUDA toolkit install may lack).

Layout (little-endian, not officially documented, stable since CUDA 4): a 16-byte header
``magic u32 = 0xBA55ED50, version u16, header_size u16, payload_size u64`` followed by entries
``kind u16 (1 = PTX, 2 = ELF/cubin), version u16, header_size u32, padded_size u64, ..., arch u32
at byte 28``; the next entry starts ``header_size + padded_size`` bytes later.
"""
from __future__ import annotations

import struct

FATBIN_MAGIC = 0xBA55ED50
FATBIN_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)  # b"\x50\xed\x55\xba"

_KINDS = {1: "compute", 2: "sm"}


def fatbin_targets(data: bytes) -> list[str]:
    """Targets in a fatbin, in file order: ``"sm_90"`` for machine code, ``"compute_90"`` for PTX.

    Raises ``ValueError`` for data that is not a well-formed fatbin (bad magic, entries running
    past the end), which also makes it a cheap integrity check.
    """
    if len(data) < 16:
        raise ValueError(f"not a fatbin: {len(data)} bytes")
    magic, _version, header_size, payload_size = struct.unpack_from("<IHHQ", data, 0)
    if magic != FATBIN_MAGIC:
        raise ValueError(f"not a fatbin: magic {magic:#010x}, expected {FATBIN_MAGIC:#010x}")
    end = header_size + payload_size
    if end > len(data):
        raise ValueError(f"truncated fatbin: header promises {end} bytes, file has {len(data)}")
    targets = []
    off = header_size
    while off < end:
        if off + 32 > end:
            raise ValueError(f"truncated fatbin entry header at byte {off}")
        kind, _ver, entry_header_size, padded_size = struct.unpack_from("<HHIQ", data, off)
        (arch,) = struct.unpack_from("<I", data, off + 28)
        if entry_header_size == 0 or off + entry_header_size + padded_size > end:
            raise ValueError(f"malformed fatbin entry at byte {off}")
        targets.append(f"{_KINDS.get(kind, f'kind{kind}')}_{arch}")
        off += entry_header_size + padded_size
    return targets
