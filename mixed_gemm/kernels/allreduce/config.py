"""``AllReduceConfig``: one all-reduce kernel (templates/allreduce/allreduce.cuh) for one element
type and world size, and the buffer layout every rank's peer-mapped buffer follows.

Algorithms (``algo``): ``one_shot`` (every rank pushes its whole message to every peer, then sums
all of them), ``two_shot`` (reduce-scatter, then all-gather of the sums: for larger messages over
more than two ranks) and ``rms_norm`` (one-shot, then the decoder layer's residual add and RMSNorm
on each row). Compiled identity ``mg_allreduce_<algo>_<dtype>_w<world>_t<threads>``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ..common import CUDA_ELEMENTS, ELEMENT_NAMES, OwnKernel, raise_on

ALGOS = ("one_shot", "two_shot", "rms_norm")
# dtype name -> (C++ element type, bytes); torch dtype name -> dtype name
ELEMENTS, TORCH_DTYPES = CUDA_ELEMENTS, ELEMENT_NAMES  # kernels/common.py

# Mirrors of templates/allreduce/allreduce.cuh (rendered sources static_assert them).
MAX_RANKS = 8           # kArMaxRanks
MAX_BLOCKS = 64         # kArMaxBlocks: the grid of every launch
FLAGS_OFFSET = 0        # kArFlagsOffset
COUNTERS_OFFSET = MAX_BLOCKS * MAX_RANKS * 8  # kArCountersOffset (64-bit flags: they never wrap)
# The GEMM-fused all-reduce's flags and counters, per chunk of CHUNK output columns
# (templates/allreduce/gemv_allreduce.cuh).
CHUNK = 16              # kArChunk: a gemv strip, so it divides every gemv CTA's rows
MAX_CHUNKS = 1024       # kArMaxChunks: N <= 16384
FUSED_ROW = MAX_CHUNKS * CHUNK  # kArFusedRow: a token's row in a fused slot, whatever N
CHUNK_FLAGS_OFFSET = 8192                                         # kArChunkFlagsOffset
CHUNK_COUNTERS_OFFSET = CHUNK_FLAGS_OFFSET + MAX_CHUNKS * MAX_RANKS * 8  # kArChunkCountersOffset
DATA_OFFSET = CHUNK_COUNTERS_OFFSET + 2 * MAX_CHUNKS * 8          # kArDataOffset: 90112, the header's end
VECTOR_BYTES = 16       # kArVectorBytes
THREADS = 512


def constant_checks() -> List[Tuple[str, int]]:
    """``(C++ expression, Python value)`` pairs that must be equal."""
    return [("mixed_gemm::kArMaxRanks", MAX_RANKS), ("mixed_gemm::kArMaxBlocks", MAX_BLOCKS),
            ("mixed_gemm::kArFlagsOffset", FLAGS_OFFSET), ("mixed_gemm::kArCountersOffset", COUNTERS_OFFSET),
            ("mixed_gemm::kArChunk", CHUNK), ("mixed_gemm::kArMaxChunks", MAX_CHUNKS),
            ("mixed_gemm::kArFusedRow", FUSED_ROW),
            ("mixed_gemm::kArChunkFlagsOffset", CHUNK_FLAGS_OFFSET),
            ("mixed_gemm::kArChunkCountersOffset", CHUNK_COUNTERS_OFFSET),
            ("mixed_gemm::kArDataOffset", DATA_OFFSET), ("mixed_gemm::kArVectorBytes", VECTOR_BYTES)]


def buffer_bytes(world_size: int, slot_bytes: int) -> int:
    """Bytes of one rank's buffer: header (flags, counters; zeroed at creation), then two parities
    of ``world_size`` slots of ``slot_bytes`` (a multiple of 16) for the all-reduce kernels, and two
    more for the GEMM-fused all-reduce (its own parity sequence)."""
    return DATA_OFFSET + 4 * world_size * slot_bytes


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class AllReduceConfig(OwnKernel):
    """One all-reduce kernel: ``algo`` for ``world_size`` ranks of ``dtype`` values, ``threads``
    per block."""

    algo: str = "one_shot"
    dtype: str = "f16"
    world_size: int = 2
    threads: int = THREADS

    family = "allreduce"

    def __post_init__(self) -> None:
        raise_on([(self.algo in ALGOS, f"algo must be one of {ALGOS}"),
                  (self.dtype in ELEMENTS, f"dtype must be one of {tuple(ELEMENTS)}"),
                  (isinstance(self.world_size, int) and 2 <= self.world_size <= MAX_RANKS,
                   f"world_size must be an int in [2, {MAX_RANKS}]"),
                  (self.threads in (128, 256, 512, 1024), "threads must be 128, 256, 512 or 1024")],
                 "AllReduceConfig")

    @property
    def kernel_name(self) -> str:
        return f"mg_allreduce_{self.algo}_{self.dtype}_w{self.world_size}_t{self.threads}"

    @property
    def schedule(self) -> str:
        return f"{self.algo}_t{self.threads}"

    @property
    def element(self) -> str:
        return ELEMENTS[self.dtype][0]

    @property
    def element_bytes(self) -> int:
        return ELEMENTS[self.dtype][1]

    @property
    def vector_elements(self) -> int:
        return VECTOR_BYTES // self.element_bytes

    def active_blocks(self, numel: int, rows: int = 1) -> int:
        """Blocks with work for a message of ``numel`` values (``rows`` rows for ``rms_norm``): about
        one 16-byte vector per thread (each block moves its part, then meets the peers' same block
        at the barrier), at most MAX_BLOCKS. The same on every rank (sizes are)."""
        if self.algo == "rms_norm":
            return max(1, min(rows, MAX_BLOCKS))
        vectors = _ceil_div(numel, self.vector_elements)
        if self.algo == "two_shot":
            vectors = _ceil_div(vectors, self.world_size)  # each block does its piece of every segment
        return max(1, min(MAX_BLOCKS, _ceil_div(vectors, self.threads)))

    @classmethod
    def from_schedule(cls, schedule: str, *, dtype: str = "f16", world_size: int = 2) -> "AllReduceConfig":
        algo, sep, threads = schedule.rpartition("_t")
        if not sep or algo not in ALGOS or not threads.isdigit():
            raise ValueError(f"schedule: expected '<algo>_t<threads>' with algo one of {ALGOS}, got {schedule!r}")
        return cls(algo=algo, dtype=dtype, world_size=world_size, threads=int(threads))
