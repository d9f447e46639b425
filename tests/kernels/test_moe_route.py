"""The grouped tile families' routing (kernels.moe_route, templates/common/moe_sort.cuh) on the CPU:
a step-by-step model of the two route kernels (per-CTA histograms; then per CTA the counts of the
CTAs before it, an exclusive scan over the keys, and the passes of 512 pairs placed by warp and
rank among equal keys) against the torch reference (a stable sort) and against a plain loop, over
random routing, -1 and out-of-range ids, hot experts, empty experts, chunks of several passes and
the tile prefix sums; the launch geometry and the argument block's mirror."""
from __future__ import annotations

import ctypes
import random

import pytest
import torch

from mixed_gemm.kernels import moe_route
from mixed_gemm.kernels.moe_route import (MAX_TILE_HEIGHTS, SORT_BLOCKS, SORT_THREADS, SortArgs, reference_routing,
                                          sort_geometry, tile_heights)


def kernel_model(ids, experts, tile_rows=(), chunk=None):
    """What count + scatter write, step by step as the kernels do it (chunk: their launch geometry)."""
    flat = [int(v) for v in ids.reshape(-1).tolist()]
    pairs, keys = len(flat), experts + 1
    key = [v if 0 <= v < experts else experts for v in flat]
    if chunk is None:
        chunk, blocks = sort_geometry(pairs)
    else:
        blocks = max(1, -(-pairs // chunk))
    hist = []
    for b in range(blocks):  # count
        h = [0] * keys
        for p in range(b * chunk, min((b + 1) * chunk, pairs)):
            h[key[p]] += 1
        hist.append(h)
    order, pos = [None] * pairs, [None] * pairs
    counts = offsets = ends = None
    for b in range(blocks):  # scatter
        before = [sum(hist[c][k] for c in range(b)) for k in range(keys)]
        totals = [sum(hist[c][k] for c in range(blocks)) for k in range(keys)]
        first = [sum(totals[:k]) for k in range(keys)]
        start = [first[k] + before[k] for k in range(keys)]
        if b == 0:
            counts, offsets = totals[:experts], first[:experts]
            ends = []
            for rows in tile_rows:
                tiles = [-(-(start[k + 1] - start[k]) // rows) for k in range(experts)]
                ends.append([sum(tiles[:k + 1]) for k in range(experts)])
        for base in range(b * chunk, min((b + 1) * chunk, pairs), SORT_THREADS):
            live = list(range(base, min(base + SORT_THREADS, (b + 1) * chunk, pairs)))
            warp_keys = {}
            for p in live:  # the leader of each (warp, key) writes its count
                w = (p - base) // 32
                warp_keys[(w, key[p])] = warp_keys.get((w, key[p]), 0) + 1
            for p in live:
                w, lane = (p - base) // 32, (p - base) % 32
                rank = sum(1 for q in live if (q - base) // 32 == w and (q - base) % 32 < lane and key[q] == key[p])
                row = start[key[p]] + rank + sum(warp_keys.get((v, key[p]), 0) for v in range(w))
                order[row] = p
                pos[p] = row if key[p] < experts else -1
            for (w, k), n in warp_keys.items():
                start[k] += n
    return order, pos, counts, offsets, ends


def loop_routing(ids, experts):
    """Each expert's pairs in pair order, then the pairs of no expert."""
    flat = [int(v) for v in ids.reshape(-1).tolist()]
    order = [p for e in range(experts) for p, v in enumerate(flat) if v == e]
    counts = [sum(1 for v in flat if v == e) for e in range(experts)]
    order += [p for p, v in enumerate(flat) if not 0 <= v < experts]
    return order, counts


def check(ids, experts, tile_rows=(), chunk=None):
    ref = reference_routing(ids, experts, tile_rows)
    order, pos, counts, offsets, ends = kernel_model(ids, experts, tile_rows, chunk)
    assert ref.order.dtype == torch.int32 and ref.pos.dtype == torch.int32 and ref.counts.dtype == torch.int64
    assert order == ref.order.tolist() and pos == ref.pos.tolist()
    assert counts == ref.counts.tolist() and offsets == ref.offsets.tolist()
    loop_order, loop_counts = loop_routing(ids, experts)
    assert order == loop_order and counts == loop_counts
    assert sorted(order) == list(range(ids.numel()))  # a permutation
    if tile_rows:
        assert ends == ref.tile_ends.tolist()
        for i, rows in enumerate(tile_rows):
            assert ref.tile_ends_of(rows).tolist() == ends[i]
    else:
        assert ref.tile_ends is None


def _random_ids(tokens, top_k, experts, seed, away=0.0, bad=0.0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices
    u = torch.rand(ids.shape, generator=gen)
    ids = ids.masked_fill(u < away, -1)
    return ids.masked_fill((u >= away) & (u < away + bad), experts + 3)


@pytest.mark.parametrize("tokens, top_k, experts", [(1, 1, 4), (7, 2, 8), (100, 8, 128), (300, 6, 64), (64, 2, 8),
                                                    (33, 4, 511)])
def test_kernel_model_is_the_stable_sort(tokens, top_k, experts):
    check(_random_ids(tokens, top_k, experts, tokens + experts), experts, tile_rows=(64, 128))


def test_minus_one_and_out_of_range_ids_sort_last_with_pos_minus_one():
    ids = _random_ids(200, 4, 16, 5, away=0.3, bad=0.1)
    ids[3] = -1  # a token whose experts all live on another rank
    check(ids, 16, tile_rows=(128,))
    ref = reference_routing(ids, 16)
    valid = int(ref.counts.sum())
    assert (ref.pos.view(200, 4)[3] == -1).all()
    flat = ids.reshape(-1)
    assert all(not 0 <= int(flat[p]) < 16 for p in ref.order[valid:].tolist())
    check(torch.full((40, 2), -1), 8, tile_rows=(64,))  # every pair away: no rows, no tiles
    assert reference_routing(torch.full((40, 2), -1), 8, (64,)).tile_ends.sum() == 0
    check(torch.tensor([[2**40, -7]]), 4)  # int64 ids beyond int32: no expert


def test_hot_expert_and_empty_experts_across_several_ctas_and_passes():
    """Chunks of two passes over several CTAs (a small chunk forces them): every pair on expert 3,
    then a mix where most experts get nothing."""
    check(torch.full((1500, 1), 3, dtype=torch.int32), 8, tile_rows=(64, 128), chunk=2 * SORT_THREADS)
    ids = torch.tensor([[0, 7]] * 700)
    check(ids, 8, tile_rows=(128,), chunk=SORT_THREADS)
    check(_random_ids(600, 8, 32, 9, away=0.2), 32, tile_rows=(64,), chunk=3 * SORT_THREADS)


def test_geometry_keeps_few_ctas_of_whole_passes():
    for pairs in (1, 511, 512, 513, 8192, 32768, 16384 * 8, 10**6, 2**31 - 1):
        chunk, blocks = sort_geometry(pairs)
        assert chunk % SORT_THREADS == 0 and 1 <= blocks <= SORT_BLOCKS
        assert (blocks - 1) * chunk < pairs <= blocks * chunk
    assert sort_geometry(4096 * 8) == (SORT_THREADS * 2, 32)  # Qwen3 at 4096 tokens: two passes a CTA


def test_tile_heights_and_the_argument_block():
    assert tile_heights(128, None, 128) == (128,) and tile_heights(None, None) == ()
    assert tile_heights(64, 128) == (64, 128)
    assert MAX_TILE_HEIGHTS == 2
    ref = reference_routing(torch.tensor([[0, 1]]), 2, (64,))
    with pytest.raises(ValueError, match="tile_rows: this routing has tile prefix sums for \\(64,\\), not 128"):
        ref.tile_ends_of(128)
    # SortArgs: seven pointers, five ints, two tile heights, padded to 8 (the C++ struct; templates
    # static_assert it).
    assert moe_route.SORT_ARGS_BYTES == ctypes.sizeof(SortArgs) == 7 * 8 + 5 * 4 + 2 * 4 + 4
    assert SortArgs.tile_rows.offset == 7 * 8 + 5 * 4


def test_random_sweep_of_the_kernel_model():
    rng = random.Random(3)
    for case in range(6):
        experts = rng.choice((2, 8, 60, 128, 300))
        top_k = rng.randint(1, min(8, experts))
        tokens = rng.randint(1, 180)
        ids = _random_ids(tokens, top_k, experts, case, away=rng.choice((0.0, 0.1)), bad=rng.choice((0.0, 0.05)))
        check(ids.int() if case % 2 else ids, experts, tile_rows=(rng.choice((16, 64)), 128),
              chunk=rng.choice((None, SORT_THREADS)))


@pytest.mark.parametrize("rows,cols", [(1, 8), (3, 8), (7, 2048), (4096, 2048), (11, 1408), (5, 4096), (2, 16384),
                                       (3, 16392), (9, 40960)])
def test_gather_grid_covers_every_vector_once(rows, cols):
    """The row gather's launch (gather_grid, the moe_sm80 launcher's; the libraries compute the same
    in C++ from the checked constants) and the kernel's thread -> (row, vector) map: every vector of
    every row exactly once, nothing past the rows or the row."""
    gx, gy, gz = moe_route.gather_grid(rows, cols)
    per_cta = SORT_THREADS * moe_route.GATHER_UNROLL
    vpr = cols // moe_route.GATHER_VEC
    span = min(vpr, per_cta)
    rows_per_cta = per_cta // span
    hit = torch.zeros(rows, vpr, dtype=torch.int32)
    i = torch.arange(per_cta)  # u * kThreads + thread, every u and thread of a CTA
    for bx in range(gx):
        for by in range(gy):
            r, c = bx * rows_per_cta + i // span, by * span + i % span
            ok = (i < rows_per_cta * span) & (r < rows) & (c < vpr)
            hit.index_put_((r[ok], c[ok]), torch.ones(int(ok.sum()), dtype=torch.int32), accumulate=True)
    assert gz == 1 and bool((hit == 1).all())
