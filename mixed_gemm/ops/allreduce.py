"""The tensor-parallel all-reduce: our one-shot / two-shot kernels over peer-mapped buffers for
the small messages of decode, NCCL (``torch.distributed``) for everything else.

A :class:`Communicator` per (process group, device) owns one buffer per rank, allocated and
exchanged with ``torch.distributed._symmetric_memory`` (``empty`` + ``rendezvous``; its peers'
addresses are ``buffer_ptrs``), and the loaded kernels (:mod:`mixed_gemm.kernels.allreduce`). It
is built once, collectively (every rank of the group in the same order, outside CUDA-graph
capture): :func:`prepare_all_reduce` at load time, else on the first call. It serves a call only
where every rank of the group agreed at creation that it can (same host, every pair of GPUs
peer-accessible, 2-8 ranks, NCCL backend, compute capability 8.0+, the buffers mapped); per call
the size and mode pick one-shot, two-shot or NCCL (:func:`mixed_gemm.kernels.allreduce.choose`),
from sizes only, so ranks never disagree.

NVLink multicast is never used: this module sets ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` (unless already set) when
imported and before it creates buffers, and the kernels use plain peer loads and stores only.
NCCL reads its variable when a communicator starts: import this module (or set the variables)
before the process group's first collective.

``torch.ops.mixed_gemm.all_reduce`` and ``.all_reduce_residual_rms_norm`` are the calls as torch
custom ops (fake implementations for Dynamo), for compiled models. Design and measurements:
docs/notes/tensor-parallel-allreduce.md.
"""
from __future__ import annotations

import os
import socket
import threading
import warnings
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..compile import build_specs
from ..kernels.allreduce import (ALGOS, FAMILY, MAX_RANKS, MODES, NCCL, TORCH_DTYPES, VECTOR_BYTES,
                                 AllReduceConfig, AllReduceProblem, buffer_bytes, check_mode, choose)
from ..kernels.allreduce.config import DATA_OFFSET
from ..runtime import current_stream

MODE_ENV = "MIXED_GEMM_ALLREDUCE"                 # auto | nccl | one_shot | two_shot | fused
MAX_BYTES_ENV = "MIXED_GEMM_ALLREDUCE_MAX_BYTES"  # the largest message ours takes (the slots' size)
TIMEOUT_ENV = "MIXED_GEMM_ALLREDUCE_TIMEOUT_S"    # a kernel waiting longer for a peer traps; 0: never
DEFAULT_MAX_BYTES = 2 << 20  # 64 tokens x 8192 x fp16 is 1 MB; a buffer holds 2 x world_size slots
# NVLS off in NCCL, in torch's CUDA symmetric memory and in NVSHMEM (a symmetric-memory backend
# torch can be switched to): a program that uses NVLink multicast can take a shared host's GPUs
# out of service, so none of ours asks for it.
MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast() -> None:
    """NVLink multicast off for NCCL and for symmetric memory (unless the environment says
    otherwise); takes effect for NCCL communicators and buffers created afterwards."""
    for key, value in MULTICAST_ENV.items():
        os.environ.setdefault(key, value)


disable_multicast()  # on import: usually before the process group's first NCCL communicator


def all_reduce_mode(mode: Optional[str] = None) -> str:
    """``mode``, else ``$MIXED_GEMM_ALLREDUCE``, else ``"auto"``; checked (:data:`MODES`)."""
    if mode is None:
        mode = os.environ.get(MODE_ENV, "").strip().lower() or "auto"
    return check_mode(mode)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must be >= 0")
    return value


def _group_of(group):
    return group if group is not None else dist.group.WORLD


def group_name(group) -> str:
    """The name ``torch.distributed`` knows ``group`` by (``None``: the default group)."""
    return _group_of(group).group_name


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _why(e: BaseException) -> str:
    """A one-line account of ``e`` for the reasons ranks exchange (never raises: an exception with
    an empty message would otherwise skip the exchange that every peer waits in)."""
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def _gather(obj, group) -> list:
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _local_verdict(group, device: torch.device, world: int) -> Tuple[bool, str]:
    """What this rank alone can tell (no communication)."""
    if not 2 <= world <= MAX_RANKS:
        return False, f"{world} ranks: ours serves 2 to {MAX_RANKS}"
    backend = str(dist.get_backend(group)).lower()
    if "nccl" not in backend:
        return False, f"the group's backend is {backend!r}, not NCCL"
    ok, why = FAMILY.supports(device.index)
    if not ok:
        return False, why
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as e:
        return False, f"torch.distributed._symmetric_memory: {e}"
    return True, ""


def _peer_verdict(device: torch.device, infos: List[dict], rank: int) -> Tuple[bool, str]:
    """Same host and peer access from this rank's GPU to every other rank's (by UUID, so it holds
    whatever CUDA_VISIBLE_DEVICES each process has)."""
    if len({i["host"] for i in infos}) > 1:
        return False, "the group spans several hosts (ours is intra-node only)"
    local = {str(torch.cuda.get_device_properties(d).uuid): d for d in range(torch.cuda.device_count())}
    for peer, info in enumerate(infos):
        if peer == rank:
            continue
        index = local.get(info["uuid"])
        if index is None:
            return False, f"rank {peer}'s GPU is not visible to rank {rank} (CUDA_VISIBLE_DEVICES), peer access unknown"
        if index != device.index and not torch.cuda.can_device_access_peer(device.index, index):
            return False, f"GPU {device.index} cannot access rank {peer}'s GPU {index} (no NVLink/P2P path)"
    return True, ""


def _rendezvous(buf: torch.Tensor, name: str, rank: int):
    """``(handle, bases, offset)``: the handle of ``buf`` over the group named ``name``, every
    rank's address of the symmetric block, and ``buf``'s offset in this rank's block.
    ``buffer_ptrs`` are the blocks' bases (torch 2.9+ keeps a tensor's offset in the handle), or
    the tensor's own addresses in older torch: ``data_ptr() - bases[rank]`` holds for both."""
    import torch.distributed._symmetric_memory as symm_mem

    try:
        handle = symm_mem.rendezvous(buf, name)
    except RuntimeError as e:
        # Torch that still needs enable_symm_mem_for_group raises "get_group_info: no group info
        # associated with the group name" before any exchange, on every rank alike: register and
        # retry. Any other failure may have come after part of the exchange, where a retry would
        # pair with nothing on the peers: it propagates (the caller reports it to every rank).
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is None or "no group info" not in str(e):
            raise
        with warnings.catch_warnings():  # deprecated where it is no longer needed
            warnings.simplefilter("ignore", FutureWarning)
            enable(name)
        handle = symm_mem.rendezvous(buf, name)
    bases = [int(p) for p in handle.buffer_ptrs]
    offset = buf.data_ptr() - bases[rank]
    size = getattr(handle, "buffer_size", None)
    if offset < 0 or (size is not None and offset + buf.numel() > size):
        raise RuntimeError(f"the tensor lies outside its symmetric block (offset {offset}, block {size} bytes)")
    return handle, bases, offset


class Communicator:
    """The all-reduce state of one process group on one device (module docstring). Build it on
    every rank of ``group`` at the same point (it communicates); afterwards ``usable`` and
    ``reason`` say whether (and why not) our kernels serve this group; NCCL serves otherwise."""

    def __init__(self, group=None, device=None, *, max_bytes: Optional[int] = None):
        disable_multicast()
        self.group = group
        self.name = group_name(group)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        slot = _env_int(MAX_BYTES_ENV, DEFAULT_MAX_BYTES) if max_bytes is None else int(max_bytes)
        self.slot_bytes = -(-slot // VECTOR_BYTES) * VECTOR_BYTES
        self.timeout_ns = _env_int(TIMEOUT_ENV, 0) * 10**9
        self.usable, self.reason = False, ""
        self.buffer, self.handle, self.peers = None, None, []
        self._kernels: Dict[str, dict] = {}  # dtype -> algo -> (launcher, args, argv)
        # The GEMM-fused all-reduce (mixed_gemm.ops.gemm_allreduce): whether every rank has the same
        # GPU generation (so the same weight layouts), and its kernels by problem, agreed by all ranks.
        self.same_arch = False
        self.gemm_fused: Dict[tuple, object] = {}
        if self.device.type != "cuda":
            self.reason = f"{self.device} is not a CUDA device"
            return
        with torch.cuda.device(self.device):
            self._setup()

    def _setup(self) -> None:
        ok, why = _local_verdict(self.group, self.device, self.world_size)
        props = torch.cuda.get_device_properties(self.device)
        info = dict(host=socket.gethostname(), uuid=str(props.uuid), ok=ok, why=why, slot_bytes=self.slot_bytes,
                    capability=(getattr(props, "major", None), getattr(props, "minor", None)))
        infos = _gather(info, self.group)
        self.same_arch = len({i.get("capability") for i in infos}) == 1
        bad = [(r, i["why"]) for r, i in enumerate(infos) if not i["ok"]]
        if not bad and len({i["slot_bytes"] for i in infos}) > 1:
            # The per-call choice compares sizes with slot_bytes: ranks must hold the same one, or
            # one would run ours while its peer runs NCCL (and the rendezvous wants equal sizes).
            bad = [(r, f"{MAX_BYTES_ENV} gives {i['slot_bytes']}-byte slots") for r, i in enumerate(infos)]
        if bad:
            self.reason = "; ".join(f"rank {r}: {w}" for r, w in bad)
            return
        verdicts = _gather(_peer_verdict(self.device, infos, self.rank), self.group)
        bad = [(r, w) for r, (o, w) in enumerate(verdicts) if not o]
        if bad:
            self.reason = "; ".join(f"rank {r}: {w}" for r, w in bad)
            return
        try:  # every rank gets here (the verdicts agreed)
            import torch.distributed._symmetric_memory as symm_mem

            buf, why = symm_mem.empty(buffer_bytes(self.world_size, self.slot_bytes), dtype=torch.uint8,
                                      device=self.device), ""
        except Exception as e:  # noqa: BLE001 - e.g. out of memory on this rank only
            buf, why = None, _why(e)
        # The rendezvous is collective: enter it only where every rank has its buffer, else a rank
        # that failed alone would leave the others waiting in its exchange.
        bad = [(r, w) for r, w in enumerate(_gather(why, self.group)) if w]
        if bad:
            self.reason = "symmetric memory: " + "; ".join(f"rank {r}: {w}" for r, w in bad)
            return
        try:
            handle, bases, offset = _rendezvous(buf, self.name, self.rank)
            if len(bases) != self.world_size or any((b + offset) % VECTOR_BYTES for b in bases):
                raise RuntimeError(f"unexpected buffer addresses {[hex(p) for p in bases]} + {offset}")
            buf[:DATA_OFFSET].zero_()  # flags and call counters; no peer signals before the gather below
            torch.cuda.synchronize(self.device)
            mine = (True, "", offset)
        except Exception as e:  # noqa: BLE001 - any failure: NCCL serves, on every rank alike
            buf, handle, bases, mine = None, None, [], (False, _why(e), 0)
        results = _gather(mine, self.group)
        bad = [(r, w) for r, (o, w, _) in enumerate(results) if not o]
        if not bad and len({off for _, _, off in results}) > 1:  # symmetric allocations: one offset for all
            bad = [(r, f"offset {off} in its block") for r, (_, _, off) in enumerate(results)]
        if bad:
            self.reason = "symmetric memory: " + "; ".join(f"rank {r}: {w}" for r, w in bad)
            return
        self.buffer, self.handle, self.usable = buf, handle, True
        self.peers = [b + offset for b in bases]  # each rank's buffer, as this rank addresses it

    # ---- kernels ----
    def prepare(self, dtype: torch.dtype) -> bool:
        """Load (compiling on first use) the kernels for ``dtype`` on every rank; collective.
        Returns whether ours serves ``dtype`` (every rank loaded them)."""
        name = _NAMES.get(dtype)
        if not self.usable or name is None:
            return False
        if name in self._kernels:
            return bool(self._kernels[name])
        kernels, why = {}, ""
        try:
            configs = [AllReduceConfig(algo=algo, dtype=name, world_size=self.world_size) for algo in ALGOS]
            specs = [FAMILY.build_spec(c) for c in configs]  # built side by side (seconds each), then loaded
            build_specs(specs)
            for config in configs:
                launcher = FAMILY.launcher(config, self.device.index)
                args, argv = launcher.block()
                for i, p in enumerate(self.peers):
                    args.peers[i] = p
                args.rank, args.slot_bytes, args.timeout_ns = self.rank, self.slot_bytes, self.timeout_ns
                kernels[config.algo] = (launcher, args, argv)
        except Exception as e:  # noqa: BLE001 - e.g. no nvcc and no cached binary: NCCL serves
            kernels, why = {}, _why(e)
        with torch.cuda.device(self.device):
            results = _gather(why, self.group)
        if any(results):
            kernels = {}
            self.reason = f"{name} kernels: " + "; ".join(f"rank {r}: {w}" for r, w in enumerate(results) if w)
        self._kernels[name] = kernels
        return bool(kernels)

    def _ready(self, dtype: torch.dtype) -> Optional[dict]:
        name = _NAMES.get(dtype)
        kernels = self._kernels.get(name) if name is not None else None
        if kernels is None and name is not None and self.usable and not _capturing():
            self.prepare(dtype)  # the first eager call of this dtype, on every rank alike
            kernels = self._kernels.get(name)
        return kernels or None

    def algorithm(self, x: torch.Tensor, mode: str = "auto") -> Tuple[str, str]:
        """``(algorithm, reason)`` for all-reducing ``x``: ``"one_shot"``, ``"two_shot"`` or ``"nccl"``."""
        if not self.usable:
            return NCCL, self.reason
        if not x.is_cuda or x.device != self.device:
            return NCCL, f"x is on {x.device}, the communicator on {self.device}"
        name = _NAMES.get(x.dtype)
        if name is None:
            return NCCL, f"{x.dtype}: ours sums {tuple(TORCH_DTYPES)}"
        algo, why = choose(x.numel() * x.element_size(), self.world_size, mode, self.slot_bytes)
        if algo != NCCL and self._ready(x.dtype) is None:
            return NCCL, self.reason or f"{name} kernels not loaded before CUDA-graph capture (call prepare first)"
        return algo, why

    def _launch(self, algo: str, x: torch.Tensor, out: torch.Tensor, **fields) -> None:
        launcher, args, argv = self._kernels[_NAMES[x.dtype]][algo]
        rows = fields.pop("rows", 1)
        with launcher.fn.lock:
            args.in_, args.out, args.numel, args.rows = x.data_ptr(), out.data_ptr(), x.numel(), rows
            args.active_blocks = launcher.config.active_blocks(x.numel(), rows)
            for key, value in fields.items():
                setattr(args, key, value)
            launcher.launch(argv, current_stream(self.device.index))

    # ---- calls ----
    def all_reduce_(self, x: torch.Tensor, mode: str = "auto") -> torch.Tensor:
        """Sum ``x`` over the group in place; returns ``x``."""
        algo, _ = self.algorithm(x, mode)
        if algo == NCCL:
            dist.all_reduce(x, group=self.group)
        elif x.numel():
            if _aligned(x):
                self._launch(algo, x, x)
            else:  # a view: sum a contiguous copy (the choice above is the same on every rank)
                y = _aligned_copy(x)
                self._launch(algo, y, y)
                x.copy_(y)
        return x

    def all_reduce(self, x: torch.Tensor, mode: str = "auto") -> torch.Tensor:
        """The sum of ``x`` over the group, as a new contiguous tensor."""
        out = x.new_empty(x.shape)
        algo, _ = self.algorithm(x, mode)
        if algo == NCCL:
            dist.all_reduce(out.copy_(x), group=self.group)
        elif x.numel():
            self._launch(algo, x if _aligned(x) else _aligned_copy(x), out)
        return out

    def all_reduce_residual_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                     mode: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(residual + sum(x)) * weight, residual + sum(x))`` (module docstring of
        templates/allreduce/allreduce.cuh for the rounding steps): one kernel where it can, else the
        all-reduce, then torch's ops."""
        cols = x.shape[-1] if x.dim() else 1
        if self._fused_applies(x, residual, weight, cols, mode):
            out, residual_out = x.new_empty(x.shape), residual.new_empty(residual.shape)
            if x.numel():
                x, residual, weight = (t if _aligned(t) else _aligned_copy(t) for t in (x, residual, weight))
                self._launch("rms_norm", x, out, rows=x.numel() // cols, cols=cols, residual=residual.data_ptr(),
                             residual_out=residual_out.data_ptr(), weight=weight.data_ptr(), eps=float(eps))
            return out, residual_out
        return residual_rms_norm(self.all_reduce(x, mode), residual, weight, eps)

    def _fused_applies(self, x, residual, weight, cols: int, mode: str) -> bool:
        if mode not in ("auto", "one_shot", "fused") or not self.usable or x.dim() == 0:
            return False
        if residual.shape != x.shape or residual.dtype != x.dtype or weight.shape != (cols,) or weight.dtype != x.dtype:
            return False
        if x.device != self.device or residual.device != x.device or weight.device != x.device:
            return False
        name = _NAMES.get(x.dtype)
        if name is None:
            return False
        config = AllReduceConfig(algo="rms_norm", dtype=name, world_size=self.world_size)
        rows = x.numel() // cols if cols else 0
        problem = AllReduceProblem(x.numel(), name, self.world_size, self.slot_bytes, rows=rows, cols=cols)
        return FAMILY.can_implement(config, problem)[0] and self._ready(x.dtype) is not None

    def __repr__(self) -> str:
        state = "ours + NCCL" if self.usable else f"NCCL only ({self.reason})"
        return (f"Communicator(group={self.name!r}, rank={self.rank}/{self.world_size}, device={self.device}, "
                f"max_bytes={self.slot_bytes}, {state})")


_NAMES = {getattr(torch, k): v for k, v in TORCH_DTYPES.items()}  # torch dtype -> "f16" | "bf16" | "f32"


def _aligned(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.data_ptr() % VECTOR_BYTES == 0


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous copy of ``t`` (the allocator's blocks are 512-byte aligned): one copy,
    where ``contiguous()`` already made one."""
    return t.clone() if t.is_contiguous() else t.contiguous()


def residual_rms_norm(reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + reduced``; ``(weight * rms_norm(h), h)`` with transformers' LlamaRMSNorm
    steps (fp32 statistics, the normalized value rounded before the weight)."""
    h = residual + reduced
    f = h.float()
    normed = (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return weight * normed, h


# ---- one communicator per (group, device) ----
_COMMS: Dict[Tuple[str, int], Communicator] = {}
_GROUPS: Dict[str, object] = {}
_REGISTRY_LOCK = threading.Lock()


def communicator(group=None, device=None) -> Communicator:
    """The :class:`Communicator` of ``group`` on ``device`` (default: the current CUDA device),
    built on first use: collectively, so every rank of the group must reach its first use at the
    same point, outside CUDA-graph capture."""
    name = group_name(group)
    index = None if device is None else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    comm = _COMMS.get((name, index))
    if comm is None:
        with _REGISTRY_LOCK:
            comm = _COMMS.get((name, index))
            if comm is None:
                _GROUPS[name] = group
                comm = _COMMS[(name, index)] = Communicator(group, torch.device("cuda", index))
    return comm


def _communicator_by_name(name: str, device: torch.device) -> Optional[Communicator]:
    comm = _COMMS.get((name, device.index))
    if comm is None and not _capturing():
        group = _GROUPS[name] if name in _GROUPS else dist.distributed_c10d._resolve_process_group(name)
        comm = communicator(group, device)
    return comm


def prepare_all_reduce(group=None, device=None, dtypes=(torch.float16, torch.bfloat16)) -> Optional[Communicator]:
    """Build ``group``'s communicator on ``device`` and load its kernels for ``dtypes`` (on every
    rank of the group at the same point; before any CUDA-graph capture). Returns it. With
    ``$MIXED_GEMM_ALLREDUCE=nccl`` the layers never ask for it: nothing is built (returns None)."""
    if all_reduce_mode() == NCCL:
        return None
    comm = communicator(group, device)
    for dtype in dtypes:
        comm.prepare(dtype)
    return comm


def release_all_reduce() -> None:
    """Forget every communicator (their buffers are freed once no kernel uses them); before
    destroying process groups in long-lived processes and tests."""
    with _REGISTRY_LOCK:
        _COMMS.clear()
        _GROUPS.clear()


# ---- custom ops (compiled models) ----
@torch.library.custom_op("mixed_gemm::all_reduce", mutates_args=())
def all_reduce_op(x: torch.Tensor, group: str, mode: str) -> torch.Tensor:
    """The sum of ``x`` over the process group named ``group`` (a new tensor), ours or NCCL by
    ``mode`` (:data:`MODES`) and size."""
    if x.is_cuda and mode != NCCL:
        comm = _communicator_by_name(group, x.device)
        if comm is not None:
            return comm.all_reduce(x, mode)
    pg = _GROUPS.get(group) or dist.distributed_c10d._resolve_process_group(group)
    out = x.contiguous().clone()
    dist.all_reduce(out, group=pg)
    return out


@all_reduce_op.register_fake
def _all_reduce_fake(x, group, mode):
    return x.new_empty(x.shape)


@torch.library.custom_op("mixed_gemm::all_reduce_residual_rms_norm", mutates_args=())
def all_reduce_residual_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                    group: str, mode: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(weight * rms_norm(residual + sum(x)), residual + sum(x))`` over the process group named
    ``group`` (:meth:`Communicator.all_reduce_residual_rms_norm`)."""
    if x.is_cuda and mode != NCCL:
        comm = _communicator_by_name(group, x.device)
        if comm is not None:
            out, h = comm.all_reduce_residual_rms_norm(x, residual, weight, eps, mode)
            return out.contiguous(), h.contiguous()  # the fake's layout, whatever residual's strides
    out, h = residual_rms_norm(all_reduce_op(x, group, NCCL), residual, weight, eps)
    return out.contiguous(), h.contiguous()


@all_reduce_residual_rms_norm_op.register_fake
def _all_reduce_residual_rms_norm_fake(x, residual, weight, eps, group, mode):
    torch._check(residual.shape == x.shape, lambda: "residual: must have x's shape")
    # The unfused path's type promotion (h = residual + sum, out = weight * normed(h)); the fused
    # kernel runs only where all three dtypes agree.
    h_dtype = torch.promote_types(residual.dtype, x.dtype)
    return x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, h_dtype)), x.new_empty(x.shape, dtype=h_dtype)


__all__ = ["Communicator", "MODES", "MODE_ENV", "MAX_BYTES_ENV", "TIMEOUT_ENV", "all_reduce_mode", "communicator",
           "disable_multicast", "group_name", "prepare_all_reduce", "release_all_reduce", "residual_rms_norm"]
