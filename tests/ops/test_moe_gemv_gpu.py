"""The grouped MoE decode kernels (moe_gemv, pair mode and expert mode) on the GPU: every catalog
schedule against the float32 reference over weight kinds (fp16/bf16, int4/int8, symmetric / integer
/ float zeros / offsets, groups 32/64/128/per-channel), top-k 1/2/6/8, token counts, split-K and
slot looping; routing edge cases (experts without tokens, every token on one expert -- in expert
mode more pairs than a chunk holds, so several chunks, and repeated ids, so more chunks than grid
slots --, ids out of range, T = 0), grid.z chunking, determinism, and CUDA-graph capture with new
routing written between replays (in expert mode too: the arrival counters reset by the last CTA).

Each stage is checked on its own, outputs poisoned with NaN first: h against the reference computed
from the weights exactly as the kernel forms them (q' s + z' rounded once to the activation dtype:
then only fp32 summation order and h's one rounding remain), y against the reference of the
kernel's own h; and the whole layer against ``mixed_gemm.reference.moe`` of the canonical
dequantized experts (its h is not rounded: within the same sqrt(K) tolerance)."""
import random

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import family, family_of
from mixed_gemm.kernels.moe_gemv import MoeGemvConfig
from mixed_gemm.kernels.moe_gemv.catalog import expert_shapes_for, shapes_for, slot_warp_shapes_for
from mixed_gemm.kernels.sm90a import layout as sm90a_layout
from mixed_gemm.ops.moe_grouped import GroupedPlan, _problems, grouped_plan, moe_grouped
from mixed_gemm.runtime import current_stream
from test_sm90a_gpu import DTYPES, ZERO_KINDS, make_case
from tolerance import assert_elementwise
from weights import seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
FAMILY = family("moe_gemv")
GROUPS = (32, 64, 128, -1)
TOP_KS = (1, 2, 6, 8)


class Experts:
    """``e`` random experts of one kind, stacked in the sm90a layout (``gate_up``: a gate|up stack,
    moe's w13), with their canonical weights dequantized in float32 (``dense``) and as the kernels
    form them (``kernel``), both gate rows then up rows."""

    def __init__(self, e, n, k, *, dtype, bits, zero, group, seed, gate_up=False):
        tdtype = DTYPES[dtype]
        qs, ss, zs, dense = [], [], [], []
        zm = "int"
        for i in range(e):
            q, s, z, _, zm = make_case(bits, zero, group, n, k, seed + i)
            s_t, z_t = s.to(tdtype), None if z is None else z.to(tdtype)
            qs.append(q)
            ss.append(s_t)
            zs.append(z_t)
            dense.append(mg.reference.dequantize(q, s_t, z_t, group_size=group, bits=bits,
                                                 zero_mode="offset" if zero == "offset" else "int"))
        z_all = None if zs[0] is None else torch.stack(zs).cuda()
        self.packed = mg.prepack_experts(torch.stack(qs).cuda(), torch.stack(ss).cuda(), z_all, bits=bits,
                                         group_size=group, zero_mode=zm, dtype=tdtype, layout="sm90a",
                                         gate_up=gate_up)
        assert self.packed.layout == "sm90a" and self.packed.b.is_contiguous()
        self.dense = torch.stack(dense).cuda()
        self.kernel = kernel_weights(self.packed)


def kernel_weights(w) -> torch.Tensor:
    """float32 ``(E, N, K)``: w = q' s + z' rounded once to the activation dtype, from the stacked
    sm90a tensors (what atom_scale computes with one fma per pair)."""
    half = 1 << (w.bits - 1)
    groups = w.scales.shape[1]
    gsize = w.k if groups == 1 else w.group_size
    gi = (torch.arange(w.k, device=w.b.device) // gsize).clamp(max=groups - 1)
    out = []
    for e in range(w.num_experts):
        q = sm90a_layout.unpack_b(w.b[e], w.bits, w.n, w.k).float() - half
        s = w.scales[e][:, :w.n].float()[gi].t()
        z = w.zeros[e][:, :w.n].float()[gi].t()
        out.append((q * s + z).to(w.dtype).float())
    out = torch.stack(out)
    return mg.ops.experts.gate_up_halves(out) if w.gate_up else out


def routing(t, k, e, seed, *, one_expert=None, ids_dtype=torch.int64, weights_dtype=torch.float32):
    """Random top-k routing (distinct experts per token); ``one_expert``: slot 0 of every token routes
    there (and no other slot does)."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(t, e, generator=gen)
    if one_expert is not None:
        scores[:, one_expert] = 2.0  # the top score of every token
    ids = scores.topk(k, dim=1).indices
    weights = torch.rand(t, k, generator=gen)
    return weights.to("cuda", weights_dtype), ids.to("cuda", ids_dtype)


def _per_expert(rows, ids, weights_of):
    """float64 ``rows[p] @ weights_of[ids[p]]^T`` for every pair p, one matmul per expert used."""
    flat = ids.reshape(-1).long()
    out = torch.empty(flat.numel(), weights_of.shape[1], dtype=torch.float64, device=rows.device)
    for e in flat.unique().tolist():
        sel = (flat == e).nonzero().squeeze(1)
        out[sel] = rows.double()[sel] @ weights_of[e].double().t()
    return out


def ref_h(x, w13_weights, ids, top_k):
    """float32 (T*k, I): silu(gate) * up per pair from ``w13_weights`` (E, 2I, H), in float64."""
    inter = w13_weights.shape[1] // 2
    rows = x[torch.arange(ids.numel(), device=x.device) // top_k]
    gu = _per_expert(rows, ids, w13_weights)
    return (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).float()


def ref_y(h, w2_weights, ids, weights):
    """float32 (T, H): sum_j weights[t, j] * h[t k + j] @ W2_e^T, in float64."""
    t, k = ids.shape
    per_pair = _per_expert(h, ids, w2_weights)
    return (per_pair * weights.reshape(-1, 1).double()).view(t, k, -1).sum(1).float()


def poisoned_outputs_and_launchers(cfg13, cfg2, x, w2, t, k):
    """NaN-filled h ``(t k, I)`` and y ``(t, H)``, and both configs' launchers (built first)."""
    h = torch.full((t * k, w2.k), float("nan"), dtype=x.dtype, device="cuda")
    y = torch.full((t, w2.n), float("nan"), dtype=x.dtype, device="cuda")
    with mg.compile.blocking():
        gate_up, down = family_of(cfg13).launcher(cfg13, 0), family_of(cfg2).launcher(cfg2, 0)
    return h, y, gate_up, down


def run_stages(cfg13, cfg2, x, w13, w2, weights, ids):
    """Both kernels (of any grouped family) through their launchers into NaN-poisoned outputs: (h, y)."""
    t, k = ids.shape
    stream = current_stream(0)
    h, y, gate_up, down = poisoned_outputs_and_launchers(cfg13, cfg2, x, w2, t, k)
    gate_up(x, w13, ids.contiguous(), None, h, t, k, stream)
    down(h, w2, ids.contiguous(), weights.float().contiguous(), y, t, k, stream)
    torch.cuda.synchronize()
    return h, y


def _layer_dims(rng, group):
    """(H, I) of a sweep case: multiples of the group (ragged against the 64/128-output CTAs), or, per
    channel (``group == -1``), H with H % 16 == 8."""
    if group == -1:
        return 8 * rng.randrange(9, 90, 2), 16 * rng.randrange(2, 30)
    return group * rng.randrange(1, 12), group * rng.randrange(1, 6)


def _sched(shape, splits, kloop=False, ds=False):
    stage, strips, (wn, wk), unroll = shape[:4]
    mode = f"_m{shape[4]}_xe" if len(shape) > 4 else ""  # expert mode: (..., tokens)
    return (f"{stage}_s{strips}_w{wn}x{wk}_u{unroll}" + mode + ("_ds" if ds else "")
            + (f"_split{splits}" if splits > 1 else "") + ("_kloop" if kloop else ""))


def _sweep_params():
    """Every catalog gate|up schedule paired with every down schedule of its kind (all 48 pair-mode
    catalog kernels run), twice each with the FMA path and once with deferred group parameters
    (``_ds``, both stages): 108 cases over which the zero kind and group size go through all 16
    combinations, and top-k, T, splits, slot looping, id widths and shapes are drawn
    (ragged against the 64/128-output CTAs; per-channel K with K % 16 == 8)."""
    rng = random.Random(24)
    cases = []
    for dtype in DTYPES:
        for bits in (4, 8):
            for a in [s for s in shapes_for(bits) if s[0] == "w13"]:
                for b in [s for s in shapes_for(bits) if s[0] == "w2"]:
                    for ds in (False, False, True):
                        c = len(cases)
                        zero, group = ZERO_KINDS[c % 4], GROUPS[(c // 4) % 4]
                        top_k, t = TOP_KS[(c + c // 4 + c // 16) % 4], rng.choice((1, 4, 16))
                        e = max(top_k, rng.choice((8, 16)))
                        h, inter = _layer_dims(rng, group)
                        s13 = _sched(a, rng.choice((1, 2, 5)), ds=ds)
                        s2 = _sched(b, rng.choice((1, 2, 3)), kloop=top_k > 1 and rng.random() < 0.5, ds=ds)
                        ids32 = rng.random() < 0.3
                        cases.append(pytest.param(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, ids32,
                                                  "random",
                                                  id=f"{dtype}-u{bits}-{s13}-{s2}-{zero}-g{group}-k{top_k}-t{t}-e{e}"
                                                     f"-h{h}-i{inter}" + ("-ids32" if ids32 else "")))
    assert {p.values[6] for p in cases} == set(TOP_KS) and {p.values[7] for p in cases} == {1, 4, 16}
    return cases


def _expert_sweep_params():
    """Expert mode (``_m<8|16>_xe``): every catalog gate|up expert schedule with every down one of
    its kind (all 16 expert kernels run), twice each, plus 8 cases that mix the modes (an expert
    gate|up before a pair down and the reverse: h is the same (T k, I) rows either way). Zero kind
    x group go through all 16 combinations twice, top-k 1/2/6/8 and T 1/4/16/64 rotate; the routing
    is random or puts every token's slot 0 on one expert (T pairs on it: at T = 64 that is 4 to 8
    chunks of 16 or 8); E up to 32 leaves experts without tokens; split-K 1/2/3."""
    rng = random.Random(2424)
    cases = []
    for dtype in DTYPES:
        for bits in (4, 8):
            pairs = [(a, b) for a in expert_shapes_for(bits, "w13") for b in expert_shapes_for(bits, "w2")] * 2
            pairs += [(expert_shapes_for(bits, "w13")[0], shapes_for(bits, "w2")[0]),
                      (shapes_for(bits, "w13")[1], expert_shapes_for(bits, "w2")[1])]
            for a, b in pairs:
                c = len(cases)
                zero, group = ZERO_KINDS[c % 4], GROUPS[(c // 4) % 4]
                top_k, t = TOP_KS[(c + c // 4) % 4], (1, 4, 16, 64)[(c // 2 + c // 8) % 4]
                route = "one" if c % 3 == 0 else "random"
                e = max(top_k + 1, rng.choice((8, 16, 32)))
                h, inter = _layer_dims(rng, group)
                s13 = _sched(a, rng.choice((1, 2, 3)))
                s2 = _sched(b, rng.choice((1, 2, 3)), kloop=len(b) == 4 and top_k > 1 and rng.random() < 0.5)
                ids32 = rng.random() < 0.3
                cases.append(pytest.param(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, ids32, route,
                                          id=f"{dtype}-u{bits}-{s13}-{s2}-{zero}-g{group}-k{top_k}-t{t}-e{e}"
                                             f"-h{h}-i{inter}-{route}" + ("-ids32" if ids32 else "")))
    assert {p.values[6] for p in cases} == set(TOP_KS) and {p.values[7] for p in cases} == {1, 4, 16, 64}
    assert {(p.values[4], p.values[5]) for p in cases} == {(z, g) for z in ZERO_KINDS for g in GROUPS}
    assert {p.values[12] for p in cases if p.values[7] == 64} == {"one", "random"}
    return cases


def _slot_warps_sweep_params():
    """Slot-warps mode (``_sw``): every catalog down kernel of the mode, three cases each, after a
    catalog pair-mode gate|up. top-k 2 / 6 / 8 / 10 rotate against the kernels' 8-16 K warps, so
    a CTA's slots are all of a token's (pieces of K per slot: 1-8), leave warps idle (6 slots on 8,
    12 or 16 warps: 2, 0, 4 idle) or need two slot groups (10 on 8: planes added by the last
    arrival); one K slice or two (planes again); T 1 / 3; zero kind x group rotate."""
    rng = random.Random(2425)
    cases = []
    for dtype in DTYPES:
        for bits in (4, 8):
            for b in slot_warp_shapes_for(bits):
                for _ in range(3):
                    c = len(cases)
                    zero, group = ZERO_KINDS[c % 4], GROUPS[(c // 4) % 4]
                    top_k, t = (2, 6, 8, 10)[(c + c // 4) % 4], (1, 3)[(c // 2) % 2]
                    e = max(top_k + 2, rng.choice((8, 16)))
                    h, inter = _layer_dims(rng, group)
                    s13 = _sched(shapes_for(bits, "w13")[1], 1, ds=True)
                    s2 = _sched(b, rng.choice((1, 1, 2)), ds=True).replace("_ds", "_ds_sw")
                    cases.append(pytest.param(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, False,
                                              "random",
                                              id=f"{dtype}-u{bits}-{s13}-{s2}-{zero}-g{group}-k{top_k}-t{t}-e{e}"
                                                 f"-h{h}-i{inter}"))
    assert {p.values[6] for p in cases} == {2, 6, 8, 10}
    assert {MoeGemvConfig.from_schedule(p.values[3], dtype=p.values[0], bits=p.values[1]).kernel_name for p in cases} \
        == {c.kernel_name for c in FAMILY.catalog() if c.slot_warps}
    return cases


@pytest.mark.parametrize("dtype,bits,s13,s2,zero,group,top_k,t,e,h,inter,ids32,route",
                         _sweep_params() + _expert_sweep_params() + _slot_warps_sweep_params())
def test_sweep(dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, ids32, route):
    seed = seed_of("moe", dtype, bits, s13, s2, zero, group, top_k, t, e, h, inter, route)
    w13 = Experts(e, 2 * inter, h, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed, gate_up=True)
    w2 = Experts(e, h, inter, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed + 1000)
    zm = w13.packed.zero_mode
    cfg13 = MoeGemvConfig.from_schedule(s13, dtype=dtype, bits=bits, zero_mode=zm)
    cfg2 = MoeGemvConfig.from_schedule(s2, dtype=dtype, bits=bits, zero_mode=zm)
    tdtype = DTYPES[dtype]
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", tdtype)
    weights, ids = routing(t, top_k, e, seed, ids_dtype=torch.int32 if ids32 else torch.int64,
                           one_expert=3 if route == "one" else None)
    if route == "one":
        assert (ids[:, 0] == 3).all()

    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any(), "an output was never written"
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), h)          # gate|up + silu * up
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), inter)    # down + top-k sum
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=(cfg13, cfg2))
    assert torch.equal(y, yk)  # the same kernels: deterministic, whoever arrives last
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
    assert_elementwise(y, ref, inter, chained=2)


def layer(dtype="f16", bits=4, zero="int", group=64, e=8, h=256, inter=128, seed=7):
    """w13 (E, 2I, H) and w2 (E, H, I) random experts of one kind (the grouped families' tests share it)."""
    w13 = Experts(e, 2 * inter, h, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed, gate_up=True)
    w2 = Experts(e, h, inter, dtype=dtype, bits=bits, zero=zero, group=group, seed=seed + 100)
    return w13, w2


@pytest.mark.parametrize("mode", ["heuristic", "xe8", "xe16_split2"])
@pytest.mark.parametrize("top_k", TOP_KS)
def test_every_token_on_one_expert_and_experts_without_tokens(top_k, mode):
    """Expert 3 gets all 16 tokens: in expert mode with 8-token chunks that is two chunks (two grid
    slots, ceil(16 / 8)), with 16-token chunks one full chunk; the experts without a token exit
    after their scan."""
    w13, w2 = layer(e=24)  # 16 tokens x (top_k - 1) free slots leave some of 23 experts without a token
    t = 16
    x = torch.randn(t, 256, device="cuda").half()
    weights, ids = routing(t, top_k, w13.packed.num_experts, seed_of("one", top_k), one_expert=3)
    assert (ids[:, 0] == 3).all() and ((ids == 3).sum(1) == 1).all()
    unused = set(range(w13.packed.num_experts)) - set(ids.reshape(-1).tolist())
    assert unused or top_k >= 6  # some experts get no token
    zm = w13.packed.zero_mode
    if mode == "heuristic":
        cfg13 = FAMILY.heuristic(_problem(w13, w2, t, top_k, "w13"), 132)
        cfg2 = FAMILY.heuristic(_problem(w13, w2, t, top_k, "w2"), 132)
    elif mode == "xe8":
        cfg13 = MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_m8_xe", zero_mode=zm)
        cfg2 = MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m8_xe", zero_mode=zm)
    else:
        cfg13 = MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_m16_xe_split2", zero_mode=zm)
        cfg2 = MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m16_xe_split2", zero_mode=zm)
    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), 256)
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), 128)
    y = mg.moe(x, w13.packed, w2.packed, weights, ids)  # selection: the grouped path (16 * k <= 4 E or not)
    assert_elementwise(y, mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids), 128, chained=2)


def _problem(w13, w2, t, top_k, stage):
    return next(p for p in _problems(t, top_k, w13.packed, w2.packed) if p.stage == stage)


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("s13, s2", [("w13_s1_w4x2_u8_split3", "w2_s1_w4x2_u8_split2"),
                                     ("w13_s1_w4x2_u8_split3", "w2_s2_w4x2_u8_kloop"),
                                     ("w13_s1_w4x2_u8_m8_xe", "w2_s1_w4x2_u8_m8_xe"),
                                     ("w13_s1_w4x2_u8_m16_xe_split2", "w2_s1_w4x2_u8_m16_xe_split2"),
                                     ("w13_s1_w4x2_u8_ds", "w2_s1_w1x8_u16_ds_sw")])
def test_ids_out_of_range_contribute_nothing(ids_dtype, s13, s2):
    """Ids outside [0, E) are not checked on the device (no host sync): such a pair's h row is zero
    and it adds nothing to y; nothing is read out of bounds. (Expert mode files them under expert
    0's CTAs as zero rows, so its arrival counts stay complete.)"""
    w13, w2 = layer()
    t, top_k, e = 5, 2, w13.packed.num_experts
    x = torch.randn(t, 256, device="cuda").half()
    weights, ids = routing(t, top_k, e, seed_of("oob"), ids_dtype=ids_dtype)
    bad = ids.clone()
    bad[0, 1], bad[2, 0], bad[3, 1] = -1, e, (2**40 if ids_dtype == torch.int64 else 2**31 - 1)
    bad[4, :] = -7  # a token with no valid slot: y row zero
    cfg13 = MoeGemvConfig.from_schedule(s13, zero_mode=w13.packed.zero_mode)
    cfg2 = MoeGemvConfig.from_schedule(s2, zero_mode=w13.packed.zero_mode)
    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, bad)
    valid = (bad >= 0) & (bad < e)
    hv = hk.view(t, top_k, -1)
    assert (hv[~valid] == 0).all()
    kept_ids = torch.where(valid, bad, torch.zeros_like(bad))
    kept_weights = torch.where(valid, weights, torch.zeros_like(weights))
    assert_elementwise(hv[valid], ref_h(x, w13.kernel, kept_ids, top_k).view(t, top_k, -1)[valid], 256)
    assert (yk[4] == 0).all()
    assert_elementwise(yk, ref_y(hk, w2.kernel, kept_ids, kept_weights), 128)
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, kept_weights, kept_ids)
    assert_elementwise(moe_grouped(x, w13.packed, w2.packed, weights, bad, configs=(cfg13, cfg2)), ref, 128, chained=2)


def test_no_tokens():
    w13, w2 = layer()
    x = torch.empty(0, 256, device="cuda").half()
    weights, ids = torch.empty(0, 2, device="cuda"), torch.empty(0, 2, dtype=torch.long, device="cuda")
    for y in (mg.moe(x, w13.packed, w2.packed, weights, ids), moe_grouped(x, w13.packed, w2.packed, weights, ids)):
        assert y.shape == (0, 256) and y.dtype == torch.float16
    cfg13 = MoeGemvConfig(stage="w13", zero_mode=w13.packed.zero_mode)
    cfg2 = MoeGemvConfig(stage="w2", zero_mode=w13.packed.zero_mode)
    run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)  # no launch, no error
    xe = (MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_m16_xe_split2", zero_mode=w13.packed.zero_mode),
          MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m8_xe_split2", zero_mode=w13.packed.zero_mode))
    run_stages(*xe, x, w13.packed, w2.packed, weights, ids)  # expert mode: no launch either
    y = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=xe)
    assert y.shape == (0, 256)


@pytest.mark.parametrize("s13, s2", [("w13_s1_w4x2_u8_m8_xe", "w2_s1_w4x2_u8_m8_xe_split2"),
                                     ("w13_s1_w4x2_u8_m16_xe_split2", "w2_s1_w4x2_u8_m16_xe")])
def test_expert_mode_repeated_ids_take_more_chunks_than_grid_slots(s13, s2):
    """The host sizes grid.z for distinct experts per token (ceil(T / tokens) chunk slots per
    expert). Ids repeated within a token put up to T k pairs on one expert; the CTAs then serve
    further chunks in turn (slot c, c + chunks, ...), and the token's repeated slots land in one
    chunk, where one CTA arrives twice at the token's counter."""
    w13, w2 = layer(e=8)
    t, top_k = 20, 4
    x = torch.randn(t, 256, device="cuda").half()
    gen = torch.Generator().manual_seed(seed_of("repeat"))
    ids = torch.full((t, top_k), 5, dtype=torch.int64)
    ids[::3, 1] = 2  # some slots elsewhere; expert 5 still holds ~70 pairs (9 chunks of 8, 5 of 16) in 2 slots
    ids = ids.cuda()
    weights = torch.rand(t, top_k, generator=gen).cuda()
    cfg13 = MoeGemvConfig.from_schedule(s13, zero_mode=w13.packed.zero_mode)
    cfg2 = MoeGemvConfig.from_schedule(s2, zero_mode=w13.packed.zero_mode)
    assert cfg13.expert_chunks(t, 8) < (ids == 5).sum().item() / cfg13.tokens
    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(hk).any() and not torch.isnan(yk).any()
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), 256)
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), 128)
    for _ in range(2):
        assert torch.equal(run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)[1], yk)


def test_more_pairs_than_one_grid_z():
    """grid.z is at most 65535: more pairs (gate|up) and more tokens (down) take more launches."""
    w13, w2 = layer(e=4, h=64, inter=32, group=32)
    t, top_k = 65600, 2  # 131200 pairs; 65600 tokens
    x = torch.randn(t, 64, device="cuda").half()
    weights, ids = routing(t, top_k, 4, seed_of("gridz"))
    cfg13 = MoeGemvConfig.from_schedule("w13_s1_w4x2_u8", zero_mode=w13.packed.zero_mode)
    cfg2 = MoeGemvConfig.from_schedule("w2_s1_w4x2_u8", zero_mode=w13.packed.zero_mode)
    hk, yk = run_stages(cfg13, cfg2, x, w13.packed, w2.packed, weights, ids)
    assert_elementwise(hk, ref_h(x, w13.kernel, ids, top_k), 64)
    assert_elementwise(yk, ref_y(hk, w2.kernel, ids, weights), 32)


@pytest.mark.parametrize("s13, s2, t", [("w13_s1_w4x2_u8_split8", "w2_s1_w4x2_u8_split4", 3),
                                        ("w13_s1_w4x2_u8_m16_xe_split4", "w2_s1_w4x2_u8_m16_xe_split4", 24),
                                        ("w13_s1_w4x2_u8_m8_xe_split2", "w2_s1_w4x2_u8_m8_xe_split2", 24),
                                        ("w13_s1_w4x2_u8_ds", "w2_s1_w1x8_u16_ds_sw_split2", 3)])
def test_split_and_slot_planes_are_deterministic(s13, s2, t):
    w13, w2 = layer(h=2048, inter=512, group=128)
    x = torch.randn(t, 2048, device="cuda").half()
    weights, ids = routing(t, 8, 8, seed_of("det"))
    configs = (MoeGemvConfig.from_schedule(s13, zero_mode=w13.packed.zero_mode),
               MoeGemvConfig.from_schedule(s2, zero_mode=w13.packed.zero_mode))
    first = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs)
    for _ in range(3):
        assert torch.equal(moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs), first)
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights, ids)
    assert_elementwise(first, ref, 512, chained=2)


def _touch_pages_params():
    """Every catalog gate|up pair shape, with and without ``_ds``, in f16 int4, and one bf16 int8
    kernel; one K slice and three (slices that start inside a 2 MB page)."""
    cases = [("f16", 4, _sched(a, splits, ds=ds)) for a in shapes_for(4, "w13") for ds in (False, True)
             for splits in (1, 3)]
    return cases + [("bf16", 8, _sched(shapes_for(8, "w13")[1], 3, ds=True))]


@pytest.mark.parametrize("dtype, bits, s13", _touch_pages_params())
def test_touch_pages_changes_no_bit(dtype, bits, s13):
    """``_tp`` only prefetches (one L2 line per 2 MB page of the CTA's K slice): h is bitwise the
    kernel's without it, and within the reference. 4 MB (int4) to 8 MB (int8) an expert, so the
    slices span several pages."""
    e, h, inter, top_k, t = 4, 2048, 2048, 2, 3
    seed = seed_of("touch", dtype, bits, s13)
    w13 = Experts(e, 2 * inter, h, dtype=dtype, bits=bits, zero="int", group=128, seed=seed, gate_up=True)
    w2 = Experts(e, h, inter, dtype=dtype, bits=bits, zero="int", group=128, seed=seed + 1)
    zm = w13.packed.zero_mode
    plain = MoeGemvConfig.from_schedule(s13, dtype=dtype, bits=bits, zero_mode=zm)
    touch = plain.replace(touch_pages=True)
    assert touch.schedule.endswith(("_tp", f"_tp_split{plain.splits}")) and touch.kernel_name != plain.kernel_name
    down = MoeGemvConfig.from_schedule(_sched(shapes_for(bits, "w2")[0], 1), dtype=dtype, bits=bits, zero_mode=zm)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed)).to("cuda", DTYPES[dtype])
    weights, ids = routing(t, top_k, e, seed)
    h_plain, _ = run_stages(plain, down, x, w13.packed, w2.packed, weights, ids)
    h_touch, _ = run_stages(touch, down, x, w13.packed, w2.packed, weights, ids)
    assert not torch.isnan(h_touch).any(), "an output was never written"
    assert torch.equal(h_touch, h_plain)
    assert_elementwise(h_touch, ref_h(x, w13.kernel, ids, top_k), h)


def test_moe_takes_the_grouped_path_and_falls_back_for_sm80_experts():
    w13, w2 = layer()
    x = torch.randn(2, 256, device="cuda").half()
    weights, ids = routing(2, 2, 8, seed_of("route"))
    plan = grouped_plan(x, w13.packed, w2.packed, 2)
    assert isinstance(plan, GroupedPlan) and plan.family is FAMILY and FAMILY.pays(2, 2, 8)
    y = mg.moe(x, w13.packed, w2.packed, weights, ids)
    assert torch.equal(y, moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=plan.configs))
    # The same experts in the sm80 layout: no grouped kernel reads it; the per-expert path runs.
    q = torch.randint(0, 16, (8, 256, 256), dtype=torch.uint8)
    s = torch.rand(8, 256, 4) * 0.01 + 0.001
    w13_80 = mg.prepack_experts(q.cuda(), s.cuda(), None, bits=4, group_size=64, layout="sm80", gate_up=True)
    w2_80 = mg.prepack_experts(q[:, :, :128].contiguous().cuda(), s[:, :, :2].contiguous().cuda(), None, bits=4,
                               group_size=64, layout="sm80")
    why = grouped_plan(x, w13_80, w2_80, 2)
    assert isinstance(why, str) and "'sm90a' weight layout" in why
    ref = mg.reference.moe(x.float(), w13_80.dequantize(), w2_80.dequantize(), weights, ids)
    assert_elementwise(mg.moe(x, w13_80, w2_80, weights, ids), ref, 128, chained=2)


def capture_moe(x, w13, w2, weights, ids):
    """``mg.moe`` called eagerly (kernels loaded, workspaces sized), then captured in a CUDA graph
    whose first replay must equal the eager call bitwise: ``(graph, out)``."""
    warm = mg.moe(x, w13, w2, weights, ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mg.moe(x, w13, w2, weights, ids)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, warm)
    return graph, out


def replay_with(graph, out, captured, new, eager):
    """Write ``new`` (x, weights, ids) into the ``captured`` tensors, poison ``out``, replay, and
    return ``eager()`` (the same call outside the graph) for the caller's bitwise check."""
    for dst, src in zip(captured, new):
        dst.copy_(src)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return eager()


def check_dropped(out, x, w13, w2, weights, ids, inter):
    """``out`` against the float32 reference with the -1 pairs' weights zeroed; all-dropped tokens zero."""
    dropped = ids == -1
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights.masked_fill(dropped, 0), ids.masked_fill(dropped, 0))
    assert_elementwise(out, ref, inter, chained=2)
    assert (out[dropped.all(1)] == 0).all()


def drop_share(weights, ids, share, seed):
    """``share`` of the pairs (1.0: all) set to -1 with NaN weights (never read): ``(weights, ids)``."""
    away = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)).cuda() < share
    return weights.masked_fill(away, float("nan")), ids.masked_fill(away, -1)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_graph_capture_replays_new_routing(dtype):
    """``moe`` captured once runs the routing, weights and x written into the captured tensors before
    each replay: nothing was read on the host."""
    w13, w2 = layer(dtype=dtype, zero="float", group=128, e=16, h=512, inter=256)
    t, top_k, e = 4, 2, 16
    tdtype = DTYPES[dtype]
    x = torch.randn(t, 512, device="cuda").to(tdtype)
    weights, ids = routing(t, top_k, e, seed_of("graph", 0), weights_dtype=tdtype)  # cast to fp32 inside
    assert isinstance(grouped_plan(x, w13.packed, w2.packed, top_k), GroupedPlan)
    graph, out = capture_moe(x, w13.packed, w2.packed, weights, ids)
    for round_ in range(1, 4):
        new_w, new_ids = routing(t, top_k, e, seed_of("graph", round_), weights_dtype=tdtype)
        weights.copy_(new_w)
        ids.copy_(new_ids)
        x.copy_(torch.randn(t, 512, device="cuda").to(tdtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, mg.moe(x, w13.packed, w2.packed, weights, ids))  # eager, same kernels
        assert_elementwise(out, mg.reference.moe(x.float(), w13.dense, w2.dense, weights.float(), ids), 256, chained=2)


@pytest.mark.parametrize("forced", [False, True], ids=["heuristic", "split2"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_graph_capture_expert_mode_replays_new_routing(dtype, forced):
    """Expert mode captured once (16 tokens over 8 experts, top-2: the heuristic's expert mode, or
    forced split-K configs, whose gate|up and down both count arrivals): each replay scans the new
    routing on the device -- random, all slot-0s on one expert (several chunks), an expert left
    without tokens -- and the counters the last arrivals reset serve the next replay."""
    w13, w2 = layer(dtype=dtype, zero="float", group=128, e=8, h=512, inter=256)
    t, top_k, e = 16, 2, 8
    tdtype = DTYPES[dtype]
    x = torch.randn(t, 512, device="cuda").to(tdtype)
    weights, ids = routing(t, top_k, e, seed_of("graph-xe", 0), weights_dtype=tdtype)
    zm = w13.packed.zero_mode
    if forced:
        configs = (MoeGemvConfig.from_schedule("w13_s1_w4x2_u8_m8_xe_split2", dtype=dtype, zero_mode=zm),
                   MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m8_xe_split2", dtype=dtype, zero_mode=zm))
        run = lambda: moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs)  # noqa: E731
    else:
        plan = grouped_plan(x, w13.packed, w2.packed, top_k)
        assert isinstance(plan, GroupedPlan) and all(c.by_expert for c in plan.configs), plan
        run = lambda: mg.moe(x, w13.packed, w2.packed, weights, ids)  # noqa: E731
    warm = run()  # eager: kernels loaded, workspaces sized
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, warm)
    for round_ in range(1, 5):
        new_w, new_ids = routing(t, top_k, e, seed_of("graph-xe", round_), weights_dtype=tdtype,
                                 one_expert=2 if round_ == 2 else None)
        if round_ == 3:  # expert 0 gets no token
            new_ids = torch.where(new_ids == 0, torch.full_like(new_ids, 7), new_ids)
            new_ids[:, 1] = torch.where(new_ids[:, 0] == 7, torch.full_like(new_ids[:, 1], 6), new_ids[:, 1])
        weights.copy_(new_w)
        ids.copy_(new_ids)
        x.copy_(torch.randn(t, 512, device="cuda").to(tdtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run())  # eager, same kernels
        assert_elementwise(out, mg.reference.moe(x.float(), w13.dense, w2.dense, weights.float(), ids), 256, chained=2)


# (gate|up, down) schedules of every mode the down kernel can be in: pair (FMA, deferred, slot
# loop, split), persistent, the one-launch persistent mode, and expert mode (fp32 only: cast first).
WEIGHT_MODES = {
    "pair": ("w13_s1_w4x2_u8", "w2_s2_w4x2_u8"),
    "pair_ds_split": ("w13_s1_w4x2_u8_ds", "w2_s2_w4x2_u8_ds_split2"),
    "pair_kloop": ("w13_s1_w4x2_u8", "w2_s2_w4x2_u8_kloop"),
    "persistent": ("w13_s1_w4x2_u8_m8_pe", "w2_s1_w4x2_u8_m8_pe_split2"),
    "one_launch": ("w13_s1_w4x2_u8_m8_pe1", "w2_s1_w4x2_u8_m8_pe1"),
    "expert": ("w13_s1_w4x2_u8_m8_xe", "w2_s1_w4x2_u8_m8_xe_split2"),
}


@pytest.mark.parametrize("wdtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", sorted(WEIGHT_MODES))
@pytest.mark.parametrize("t, top_k", [(1, 8), (5, 3), (16, 1)])
def test_16_bit_topk_weights_equal_their_fp32_cast(mode, wdtype, t, top_k):
    """A router's fp16/bf16 scores, read as they are (pair and persistent modes) or cast first
    (expert mode), give bit for bit the output of the same scores cast to fp32 (the kernel widens
    each exactly as the cast does), and match the float32 reference."""
    w13, w2 = layer(e=16, h=512, inter=256, group=128)
    torch.manual_seed(seed_of("wdt", mode, t))
    x = torch.randn(t, 512, device="cuda").half()
    weights, ids = routing(t, top_k, 16, seed_of("wdt-route", mode, t, top_k), weights_dtype=wdtype)
    s13, s2 = WEIGHT_MODES[mode]
    configs = tuple(MoeGemvConfig.from_schedule(s, zero_mode=w13.packed.zero_mode) for s in (s13, s2))
    with mg.compile.blocking():
        got = moe_grouped(x, w13.packed, w2.packed, weights, ids, configs=configs)
        want = moe_grouped(x, w13.packed, w2.packed, weights.float(), ids, configs=configs)
    assert torch.equal(got, want)
    ref = mg.reference.moe(x.float(), w13.dense, w2.dense, weights.float(), ids)
    assert_elementwise(got, ref, 512, chained=2)


def test_16_bit_topk_weights_rules():
    """What each down launcher reads: expert mode fp32 only; 16-bit weights 4-byte aligned and
    contiguous; no integer weights. A misaligned 16-bit tensor still runs through moe (cast)."""
    w13, w2 = layer(e=8, h=256, inter=128)
    t, k = 4, 2
    x = torch.randn(t, 256, device="cuda").half()
    weights, ids = routing(t, k, 8, seed_of("wdt-rules"), weights_dtype=torch.float16)
    stream = current_stream(0)
    h = torch.randn(t * k, 128, device="cuda").half()
    y = torch.full((t, 256), float("nan"), dtype=torch.float16, device="cuda")
    zm = w13.packed.zero_mode
    with mg.compile.blocking():
        expert = FAMILY.launcher(MoeGemvConfig.from_schedule("w2_s1_w4x2_u8_m8_xe", zero_mode=zm), 0)
        pair = FAMILY.launcher(MoeGemvConfig.from_schedule("w2_s2_w4x2_u8", zero_mode=zm), 0)
    assert pair.native_weights and not expert.native_weights
    with pytest.raises(ValueError, match=r"weights: .*reads top-k weights of dtype float32, got float16"):
        expert(h, w2.packed, ids, weights, y, t, k, stream)
    odd = torch.empty(t * k + 1, dtype=torch.float16, device="cuda")[1:].view(t, k)
    odd.copy_(weights)
    with pytest.raises(ValueError, match=r"weights: 16-bit top-k weights .* 4-byte aligned"):
        pair(h, w2.packed, ids, odd, y, t, k, stream)
    with pytest.raises(ValueError, match=r"weights: expected a contiguous"):
        pair(h, w2.packed, ids, torch.cat([weights, weights], 1)[:, ::2], y, t, k, stream)
    with pytest.raises(ValueError, match=r"weights: .*got int32"):
        pair(h, w2.packed, ids, ids.int(), y, t, k, stream)
    assert torch.isnan(y).all()  # nothing launched
    configs = (MoeGemvConfig.from_schedule("w13_s1_w4x2_u8", zero_mode=zm), pair.config)
    got = moe_grouped(x, w13.packed, w2.packed, odd, ids, configs=configs)  # cast, then the fp32 path
    assert torch.equal(got, moe_grouped(x, w13.packed, w2.packed, weights.float(), ids, configs=configs))
