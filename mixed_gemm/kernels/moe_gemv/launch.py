"""Launching one moe_gemv config: the argument block filled once per stacked weight, the call's
tensors, and the split-K / slot planes and arrival counters from the per-stream workspaces."""
from __future__ import annotations

import torch

from ...runtime import get_module, semaphores, workspace
from ..base import compute_capability, sm_count
from ..common import PER_CHANNEL_SHIFT
from .abi import MoeGemvArgs, MoeGemvFusedArgs
from .config import GRID_Z, WEIGHT_ELEMENTS, MoeGemvConfig

# torch dtype -> MoeGemvArgs::weights_dtype (a dict lookup on the hot path)
_WEIGHT_CODES = {getattr(torch, name): code for name, code in WEIGHT_ELEMENTS.items()}


class MoeGemvLauncher:
    """``launch(x, w, ids, weights, out, tokens, top_k, stream)`` for one config on one device
    (pair mode: grid.z over pairs or tokens; expert mode: over experts x chunk slots; persistent
    mode: grid.x the resident CTAs, at most the work items the shapes allow).

    ``w``: stacked experts (``ops.experts.PackedExperts``, sm90a layout, contiguous); ``x``: the
    rows the stage reads (w13: ``(tokens, H)``; w2: ``h``, ``(tokens * top_k, I)``), contiguous and
    16-byte aligned; ``ids``: contiguous int32/int64 ``(tokens, top_k)``; ``weights``: contiguous
    ``(tokens, top_k)`` (w2; None for w13), fp32, or fp16/bf16 4-byte aligned where
    :attr:`native_weights` (pair and persistent modes: the router's scores as they are, no cast launch); ``out``: ``h`` ``(tokens * top_k, I)`` (w13) or ``y``
    ``(tokens, H)`` (w2), contiguous. Nothing here reads a tensor's values (capturable).

    ``pdl=True`` (``pdl_capable`` launchers only: the down projection's two-launch kernels on sm_90+,
    which wait with ``griddepcontrol.wait`` before reading h or writing anything) launches as a
    programmatic dependent of the kernel before it on the stream; ``pdl_prefetch=True`` adds the L2
    prefetch of the CTAs' weight slices before the wait (``MoeGemvArgs::pdl``,
    templates/moe_gemv/moe_pdl.cuh). The prefetch measured 2-4 µs slower at one token on the H200,
    the plain programmatic launch 0.3-0.7 µs faster (docs/notes/moe.md), so it is off unless asked
    for. ``pdl_default``: the launchers that run_grouped launches with PDL in its ``auto`` mode
    (pair mode's downs: the measured ones)."""

    pdl_capable = False
    pdl_default = False

    def __init__(self, config: MoeGemvConfig, spec, device_index: int):
        module = get_module(spec, device_index)
        self.config = config
        self.device_index = device_index
        # Static shared memory, or (persistent mode) dynamic: the kernel's and the routing's, per launch.
        args = MoeGemvFusedArgs if config.fused else MoeGemvArgs
        self.fn = module.function(config.kernel_name, args, config.threads, config.max_smem)
        self._blocks = {}  # the experts' key -> (argument block, argv, row tiles, splits)
        self._resident = {}  # persistent mode: dynamic shared memory -> resident CTAs on the device
        self._persistent = {}  # persistent mode: (experts' key, tokens, top_k) -> (grid x, smem, planes, counters)
        self.pdl_capable = (not config.gated and not config.fused
                            and (compute_capability(device_index) or (0, 0)) >= (9, 0))
        self.pdl_default = self.pdl_capable and not config.tiled

    @property
    def native_weights(self) -> bool:
        """Whether the kernel reads fp16/bf16 top-k weights as they are (pair and persistent modes);
        expert mode reads fp32 only (templates/moe_gemv/moe_gemv.cuh, topk_weight_f32)."""
        return not self.config.by_expert

    def reads(self, weights) -> bool:
        """Whether the kernel reads ``weights`` as they are: contiguous fp32, or where
        :attr:`native_weights`, contiguous 4-byte aligned fp16/bf16 (run_grouped casts the rest)."""
        code = _WEIGHT_CODES.get(weights.dtype)
        return (code == 0 or (code is not None and self.native_weights and weights.data_ptr() % 4 == 0)) \
            and weights.is_contiguous()

    def _check_weights(self, weights) -> None:
        """Raise ValueError, naming the rule, for top-k weights the kernel cannot read (before any launch)."""
        if self.reads(weights):
            return
        code = _WEIGHT_CODES.get(weights.dtype)
        if code is None or (code and not self.native_weights):
            allowed = tuple(WEIGHT_ELEMENTS) if self.native_weights else ("float32",)
            raise ValueError(f"weights: {self.config.schedule} reads top-k weights of dtype {', '.join(allowed)}, "
                             f"got {str(weights.dtype).removeprefix('torch.')}")
        if not weights.is_contiguous():
            raise ValueError("weights: expected a contiguous (tokens, top_k) tensor")
        if code and weights.data_ptr() % 4:
            raise ValueError(f"weights: 16-bit top-k weights are read 4 bytes at a time and must be 4-byte aligned "
                             f"(data_ptr % 4 == {weights.data_ptr() % 4})")

    @property
    def one_launch(self) -> bool:
        """The one-launch mode: run_grouped calls :meth:`launch_layer` (both projections) instead.
        (Not ``fused``: moe_sm80's launchers have that attribute, for their gather.)"""
        return self.config.fused

    def _block(self, w, key):
        args, argv = self.fn.block()
        row_tiles, splits = self._fill_weight(args, self.config, w)
        blk = self._blocks[key] = (args, argv, row_tiles, splits)
        return blk

    @staticmethod
    def _fill_weight(args, config: MoeGemvConfig, w):
        """The weight's fields of argument block ``args`` for ``config``: ``(row tiles, splits)``."""
        row_tiles, splits, chunk, strips = config.launch_geometry(w.n, w.k)
        if (w.b.shape[1], w.b.shape[2]) != (-(-w.k // 16), strips):
            raise ValueError(f"w: expected sm90a atoms (E, {-(-w.k // 16)}, {strips}, 8 * bits), got {tuple(w.b.shape)}")
        num_groups = w.scales.shape[1]
        args.b, args.scales, args.zeros = w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr()
        args.expert_b, args.expert_s = w.b[0].numel(), w.scales[0].numel()
        args.experts, args.n, args.k, args.strips, args.katoms = w.num_experts, w.n, w.k, strips, w.b.shape[1]
        args.group_shift = PER_CHANNEL_SHIFT if num_groups == 1 else w.group_size.bit_length() - 1
        args.num_groups, args.splits, args.chunk = num_groups, splits, chunk
        args.gate_up = int(w.gate_up)  # gate|up rows interleaved (else gate, then up: ops.gated's dense weights)
        return row_tiles, splits

    def _set_call(self, a, x, ids, weights, out, tokens: int, top_k: int, slots: int, planes: int, counters: int,
                  stream: int, prefetch: bool) -> None:
        """The call's fields of argument block ``a`` (every mode), with ``planes`` fp32 floats and
        ``counters`` arrival counters of scratch from the stream's workspaces (none when 0);
        ``prefetch``: the L2 prefetch before the PDL wait."""
        dev = self.device_index
        self._set_io(a, x, ids, weights, out, tokens, top_k, slots, workspace(dev, stream, planes) if planes else 0,
                     semaphores(dev, stream, counters) if counters else 0)
        a.pdl = int(prefetch)

    @staticmethod
    def _set_io(a, x, ids, weights, out, tokens: int, top_k: int, slots: int, planes_ptr: int, counters_ptr: int):
        """The call's tensors and sizes in argument block ``a``, with the scratch already placed."""
        a.x, a.ids, a.y = x.data_ptr(), ids.data_ptr(), out.data_ptr()
        a.weights = 0 if weights is None else weights.data_ptr()
        a.weights_dtype = 0 if weights is None else _WEIGHT_CODES[weights.dtype]
        a.workspace, a.counters = planes_ptr, counters_ptr
        a.tokens, a.top_k, a.slots, a.ids_64 = tokens, top_k, slots, int(ids.dtype == torch.int64)

    def __call__(self, x: torch.Tensor, w, ids: torch.Tensor, weights, out: torch.Tensor, tokens: int, top_k: int,
                 stream: int, pdl: bool = False, pdl_prefetch: bool = False) -> None:
        key = (w.b.data_ptr(), w.scales.data_ptr(), w.zeros.data_ptr(), w.num_experts, w.n, w.k, w.group_size,
               w.gate_up)
        blk = self._blocks.get(key)
        if blk is None:
            blk = self._block(w, key)
        a, argv, row_tiles, splits = blk
        if self.one_launch:
            raise RuntimeError(f"{self.config.schedule}: the one-launch mode runs both projections in one kernel "
                               "(launch_layer, which run_grouped calls), not one projection")
        if weights is not None:
            self._check_weights(weights)
        if pdl and not self.pdl_capable:
            raise ValueError(f"pdl: only the down projection's two-launch kernels on sm_90+ wait for the kernel before "
                             f"them; {self.config.schedule} on device {self.device_index} does not")
        prefetch = pdl and pdl_prefetch
        if self.config.by_expert:
            self._launch_by_expert(blk, x, w, ids, weights, out, tokens, top_k, stream, pdl, prefetch)
            return
        if self.config.persistent:
            self._launch_persistent(blk, x, w, ids, weights, out, tokens, top_k, stream, key, pdl, prefetch)
            return
        if self.config.gated:  # grid (row tiles, splits, pairs)
            z, slots, grid_y = tokens * top_k, 1, splits
            planes, counters = (z * splits * w.n, z * row_tiles) if splits > 1 else (0, 0)
        else:  # grid (row tiles, slot groups x splits, tokens)
            slots, groups = self.config.slot_group(top_k)
            z, grid_y = tokens, groups * splits
            planes, counters = (z * grid_y * w.n, z * row_tiles) if grid_y > 1 else (0, 0)
        if z == 0:
            return
        fn = self.fn
        with fn.lock:
            self._set_call(a, x, ids, weights, out, tokens, top_k, slots, planes, counters, stream, prefetch)
            a.chunks = 1
            for z0 in range(0, z, GRID_Z):  # CUDA's grid.z limit: more pairs / tokens take more launches
                a.z0 = z0  # (with pdl, a later launch depends on the previous one: it waits for it too)
                fn.launch((row_tiles, grid_y, min(GRID_Z, z - z0)), stream, argv, pdl=pdl)

    def _launch_by_expert(self, blk, x, w, ids, weights, out, tokens: int, top_k: int, stream: int,
                          pdl: bool, prefetch: bool) -> None:
        """Expert mode: one launch, grid (row tiles, splits, experts x chunk slots), sized from shapes
        only. fp32 planes per (pair, slice) and arrival counters: gate|up with split-K (counted per
        chunk at its first pair), down whenever a token has more than one plane (top_k x splits)."""
        a, argv, row_tiles, splits = blk
        pairs = tokens * top_k
        if pairs == 0:
            return
        chunks = self.config.expert_chunks(tokens, w.num_experts)
        if self.config.gated:
            planes, counters = (pairs * splits * w.n, pairs * row_tiles) if splits > 1 else (0, 0)
        else:
            planes, counters = (pairs * splits * w.n, tokens * row_tiles) if top_k * splits > 1 else (0, 0)
        fn = self.fn
        with fn.lock:
            self._set_call(a, x, ids, weights, out, tokens, top_k, 1, planes, counters, stream, prefetch)
            a.z0, a.chunks = 0, chunks
            fn.launch((row_tiles, splits, w.num_experts * chunks), stream, argv, pdl=pdl)

    def resident_ctas(self, smem: int) -> int:
        """CTAs of this kernel resident on the whole device at ``smem`` bytes of dynamic shared
        memory (the driver's occupancy for the kernel's registers and shared memory, times the SMs)."""
        ctas = self._resident.get(smem)
        if ctas is None:
            ctas = self._resident[smem] = max(1, self.fn.occupancy(smem)) * sm_count(self.device_index)
        return ctas

    def _persistent_launch(self, key, w, tokens: int, top_k: int, splits: int, row_tiles: int):
        """``(grid x, dynamic shared memory, planes, counters)`` of a persistent launch, from shapes
        only, computed once per (experts, tokens, top_k): the hot path is a dict lookup."""
        pairs = tokens * top_k
        planes, counters = self._scratch(self.config, w, tokens, top_k, splits, row_tiles)
        smem = self.config.launch_smem(w.num_experts, pairs)
        items = self.config.persistent_items(tokens, top_k, w.num_experts, w.n, w.k)
        shape = self._persistent[(key, tokens, top_k)] = (min(items, self.resident_ctas(smem)), smem, planes, counters)
        return shape

    @staticmethod
    def _scratch(config: MoeGemvConfig, w, tokens: int, top_k: int, splits: int, row_tiles: int):
        """``(planes, counters)`` of a persistent launch of ``config``'s stage: fp32 planes per (pair,
        slice) and arrival counters, gate|up with split-K (counted per (pair, row tile)), down whenever
        a token has more than one plane (top_k x splits; counted per (token, row tile))."""
        pairs = tokens * top_k
        if config.gated:
            return (pairs * splits * w.n, pairs * row_tiles) if splits > 1 else (0, 0)
        return (pairs * splits * w.n, tokens * row_tiles) if top_k * splits > 1 else (0, 0)

    def _launch_persistent(self, blk, x, w, ids, weights, out, tokens: int, top_k: int, stream: int, key,
                           pdl: bool, prefetch: bool) -> None:
        """Persistent mode: one launch, grid (resident CTAs, at most the items, 1, 1), sized from
        shapes only; the routing's shared memory per launch (``launch_smem``); scratch as
        :meth:`_scratch` sizes it."""
        a, argv, row_tiles, splits = blk
        if tokens * top_k == 0:
            return
        shape = self._persistent.get((key, tokens, top_k))
        if shape is None:
            shape = self._persistent_launch(key, w, tokens, top_k, splits, row_tiles)
        grid, smem, planes, counters = shape
        fn = self.fn
        with fn.lock:
            self._set_call(a, x, ids, weights, out, tokens, top_k, 1, planes, counters, stream, prefetch)
            a.z0, a.chunks = 0, 1
            fn.launch((grid, 1, 1), stream, argv, smem, pdl=pdl)

    # ---- the one-launch persistent mode (config.fused): this launcher is the gate|up config's ----

    def launch_layer(self, down, x, w13, w2, ids, weights, h, y, tokens: int, top_k: int, stream: int) -> None:
        """Both projections in one launch (``MoeGemvFused``): ``down`` is the plan's down launcher (its
        config's K split); ``h`` the ``(tokens * top_k, I)`` scratch between them, ``y`` the output.
        Grid: resident CTAs, at most both projections' items; scratch from the stream's workspaces:
        gate|up planes then down planes, and the queue and per-expert counts, then the gate|up and
        the down arrival counters (all left at zero by the kernel). Capturable: nothing is read."""
        pairs = tokens * top_k
        if pairs == 0:
            return
        down._check_weights(weights)
        key = (w13.b.data_ptr(), w13.scales.data_ptr(), w13.zeros.data_ptr(), w13.num_experts, w13.n, w13.k,
               w13.group_size, w13.gate_up, w2.b.data_ptr(), w2.scales.data_ptr(), w2.zeros.data_ptr(), w2.n, w2.k,
               w2.group_size, down.config)
        blk = self._blocks.get(key)
        if blk is None:
            args, argv = self.fn.block()
            rt13, sp13 = self._fill_weight(args.up, self.config, w13)
            rt2, sp2 = self._fill_weight(args.down, down.config, w2)
            blk = self._blocks[key] = (args, argv, (rt13, sp13, rt2, sp2))
        a, argv, (rt13, sp13, rt2, sp2) = blk
        shape = self._persistent.get((key, tokens, top_k))
        if shape is None:
            planes13, counters13 = self._scratch(self.config, w13, tokens, top_k, sp13, rt13)
            planes2, counters2 = self._scratch(down.config, w2, tokens, top_k, sp2, rt2)
            smem = self.config.launch_smem(w13.num_experts, pairs)
            items = (self.config.persistent_items(tokens, top_k, w13.num_experts, w13.n, w13.k)
                     + down.config.persistent_items(tokens, top_k, w2.num_experts, w2.n, w2.k))
            shape = self._persistent[(key, tokens, top_k)] = (
                min(items, self.resident_ctas(smem)), smem, planes13, planes2, 1 + w13.num_experts, counters13,
                counters2)
        grid, smem, planes13, planes2, sync, counters13, counters2 = shape
        dev, fn = self.device_index, self.fn
        with fn.lock:
            floats = workspace(dev, stream, planes13 + planes2) if planes13 + planes2 else 0
            ints = semaphores(dev, stream, sync + counters13 + counters2)
            for sub, src, out, wts, planes, counters, plane_at, counter_at in (
                    (a.up, x, h, None, planes13, counters13, 0, sync),
                    (a.down, h, y, weights, planes2, counters2, planes13, sync + counters13)):
                self._set_io(sub, src, ids, wts, out, tokens, top_k, 1, floats + 4 * plane_at if planes else 0,
                             ints + 4 * counter_at if counters else 0)
                sub.z0, sub.chunks, sub.pdl = 0, 1, 0
            a.sync = ints
            fn.launch((grid, 1, 1), stream, argv, smem)
