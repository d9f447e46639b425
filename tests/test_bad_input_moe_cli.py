"""Bad input to the mixture-of-experts and command-line entry points, one table row per rule:
``prepack_experts``, ``moe``, ``QuantExperts`` (constructor and forward) and each ``mixed-gemm``
subcommand's numeric and list arguments. Every bad call raises ValueError/TypeError naming the
argument and the rule before anything runs; a bad command line exits with code 2 and one line,
``mixed-gemm <command>: error: --flag ...``, before any GPU is looked for, never a traceback. The GPU
variant (``-m gpu``) makes a correct call after each bad one and checks it against the float32
reference of the canonical experts: the context is still usable. What is allowed stays allowed
(non-contiguous inputs, no tokens, ids of -1)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm import cli
from mixed_gemm.nn import QuantExperts
from tolerance import assert_elementwise

E, H, I, G, T, K = 4, 256, 128, 64, 5, 2  # a layer the grouped GPU kernels take (I % 16, groups of 64)
DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="needs a CUDA GPU")])]
NAN, INF = float("nan"), float("inf")


def canonical(n, k, seed):
    """Random experts' canonical ``(q, s, z)`` (round to nearest, int4 with zeros, groups of G)."""
    w = torch.randn(E, n, k, generator=torch.Generator().manual_seed(seed)) / k**0.5
    parts = [mg.quantize(w[e], bits=4, group_size=G) for e in range(E)]
    return tuple(torch.stack([p[i] for p in parts]) for i in range(3))


class Layer:
    """One layer on ``device``: canonical experts, their stacks, the reference's float32 experts
    (from the canonical codes, scales rounded to fp16 as stored), and correct inputs."""

    def __init__(self, device: str, layout: str = "auto"):
        self.device = device
        self.other = "meta" if device == "cpu" else "cpu"  # a device the layer is not on
        self.c13 = tuple(t.to(device) for t in canonical(2 * I, H, seed=1))
        self.c2 = tuple(t.to(device) for t in canonical(H, I, seed=2))
        self.w13 = mg.prepack_experts(*self.c13, group_size=G, layout=layout, gate_up=True)
        self.w2 = mg.prepack_experts(*self.c2, group_size=G, layout=layout)
        self.d13, self.d2 = (torch.stack([mg.reference.dequantize(q[e], s[e].half(), z[e], group_size=G)
                                          for e in range(E)]) for q, s, z in (self.c13, self.c2))
        gen = torch.Generator().manual_seed(3)
        self.x = torch.randn(T, H, generator=gen).half().to(device)
        self.ids = torch.rand(T, E, generator=gen).topk(K, dim=1).indices.to(device)
        self.weights = torch.rand(T, K, generator=gen).to(device)

    def args(self):
        return self.x, self.w13, self.w2, self.weights, self.ids

    def check_usable(self, y=None):
        """A correct call (or its result ``y``) against the reference, all but first poisoned."""
        out = torch.full((T, H), NAN, dtype=torch.float16, device=self.device)
        out.copy_(mg.moe(*self.args()) if y is None else y)
        ref = mg.reference.moe(self.x.float(), self.d13, self.d2, self.weights, self.ids)
        assert_elementwise(out, ref, I, chained=3)


_LAYERS = {}


def layer(device, layout="auto") -> Layer:
    key = (device, layout)
    if key not in _LAYERS:
        _LAYERS[key] = Layer(device, layout)
    return _LAYERS[key]


def _set(t, value, at=(1, 2, 0)):
    t = t.clone()
    t[at] = value
    return t


def _fewer(w):
    """The stack without its last expert."""
    return dataclasses.replace(w, b=w.b[:-1], scales=w.scales[:-1], zeros=w.zeros[:-1])


def _on(w, device):
    return dataclasses.replace(w, b=w.b.to(device), scales=w.scales.to(device), zeros=w.zeros.to(device))


def _strided(t):
    """The same values, not contiguous (the last two dimensions stored transposed)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


# ---------------------------------------------------------------------------------------------
# prepack_experts: (id, (q, s, z, device) -> (args, keyword overrides), exception, message)

STACK = r"s: expected \(E, N, ceil\(K / group_size\)\)"
PREPACK = [
    ("q-not-a-tensor", lambda q, s, z, d: ((q.tolist(), s, z), {}), TypeError, "q: expected a torch.Tensor"),
    ("q-float", lambda q, s, z, d: ((q.float(), s, z), {}), TypeError, "q: expected integer codes, got dtype"),
    ("q-rank-2", lambda q, s, z, d: ((q[0], s, z), {}), ValueError, r"q: expected non-empty \(E, N, K\) codes"),
    ("q-no-experts", lambda q, s, z, d: ((q[:0], s[:0], z[:0]), {}), ValueError, r"q: expected non-empty \(E, N, K\)"),
    ("q-code-too-large", lambda q, s, z, d: ((_set(q, 16), s, z), {}), ValueError,
     r"q: expected codes in \[0, 16\) for bits=4, got 16"),
    ("q-code-negative", lambda q, s, z, d: ((_set(q.short(), -1), s, z), {}), ValueError,
     r"q: expected codes in \[0, 16\) for bits=4, got -1"),
    ("s-not-a-tensor", lambda q, s, z, d: ((q, 0.5, z), {}), TypeError, "s: expected a torch.Tensor"),
    ("s-integer", lambda q, s, z, d: ((q, s.int(), z), {}), TypeError, "s: expected floating-point scales"),
    ("s-rank-2", lambda q, s, z, d: ((q, s[0], z), {}), ValueError, STACK),
    ("s-expert-count", lambda q, s, z, d: ((q, s[:-1], z[:-1]), {}), ValueError, STACK),
    ("s-rows", lambda q, s, z, d: ((q, s[:, :-16], z[:, :-16]), {}), ValueError, STACK),
    ("group-size-mismatch", lambda q, s, z, d: ((q, s, z), {"group_size": 128}), ValueError,
     STACK + r" = \(4, 256, 2\) .* group_size=128"),
    ("s-nan", lambda q, s, z, d: ((q, _set(s, NAN), z), {}), ValueError, "s: expected finite scales, got nan/inf"),
    ("s-inf", lambda q, s, z, d: ((q, _set(s, -INF), z), {}), ValueError, "s: expected finite scales"),
    ("z-nan", lambda q, s, z, d: ((q, s, _set(z, NAN)), {}), ValueError, "z: expected finite zeros, got nan/inf"),
    ("z-not-a-tensor", lambda q, s, z, d: ((q, s, 8), {}), TypeError, "z: expected a torch.Tensor or None"),
    ("z-shape", lambda q, s, z, d: ((q, s, z[:-1]), {}), ValueError, r"z: expected shape \(4, 256, 4\)"),
    ("s-device", lambda q, s, z, d: ((q, s.to(d), z.to(d)), {}), ValueError, "s: expected device .* \\(same as q\\)"),
    ("z-device", lambda q, s, z, d: ((q, s, z.to(d)), {}), ValueError, "z: expected device .* \\(same as q\\)"),
    ("dtype", lambda q, s, z, d: ((q, s, z), {"dtype": torch.float32}), TypeError,
     "dtype: must be torch.float16 or torch.bfloat16"),
    ("bits", lambda q, s, z, d: ((q, s, z), {"bits": 5}), ValueError, "bits: expected one of"),
    ("layout", lambda q, s, z, d: ((q, s, z), {"layout": "sm80+sm90a"}), ValueError, "layout: experts hold one layout"),
    ("zero-mode", lambda q, s, z, d: ((q, s, z), {"zero_mode": "bogus"}), ValueError, "zero_mode: expected one of"),
    ("gate-up-not-a-bool", lambda q, s, z, d: ((q, s, z), {"gate_up": 1}), TypeError, "gate_up: expected a bool"),
    ("gate-up-rows", lambda q, s, z, d: ((q[:, :24], s[:, :24], z[:, :24]), {}), ValueError,
     r"q: a gate\|up stack \(gate_up=True\) has 2I rows with I a multiple of 8"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, build, exc, match", PREPACK, ids=[c[0] for c in PREPACK])
def test_prepack_experts_rejects(device, case, build, exc, match):
    lay = layer(device)
    args, overrides = build(*lay.c13, lay.other)
    with pytest.raises(exc, match=match):
        mg.prepack_experts(*args, **{**dict(group_size=G, gate_up=True), **overrides})
    lay.check_usable()


# ---------------------------------------------------------------------------------------------
# moe: (id, (layer) -> (x, w13, w2, topk_weights, topk_ids), exception, message). Metadata only:
# checked on every path, the grouped GPU path included, before anything launches.

EQUAL_SHAPES = r"topk_ids, topk_weights: expected equal \(T=5, top_k\) shapes"
MOE = [
    ("x-not-a-tensor", lambda L: (L.x.tolist(), L.w13, L.w2, L.weights, L.ids), TypeError, "x: expected a torch.Tensor"),
    ("x-rank-3", lambda L: (L.x[None], L.w13, L.w2, L.weights, L.ids), ValueError, r"x: expected a \(T, H\) tensor"),
    ("x-float32", lambda L: (L.x.float(), L.w13, L.w2, L.weights, L.ids), TypeError,
     r"x: dtype must equal the experts' \(torch.float16\)"),
    ("x-bfloat16", lambda L: (L.x.bfloat16(), L.w13, L.w2, L.weights, L.ids), TypeError, "x: dtype must equal"),
    ("x-hidden", lambda L: (L.x[:, :128], L.w13, L.w2, L.weights, L.ids), ValueError, "w13: expected K = H = 128"),
    ("x-device", lambda L: (L.x.to(L.other), L.w13, L.w2, L.weights.to(L.other), L.ids.to(L.other)), ValueError,
     r"w13: expected device .* \(same as x\)"),
    ("weights-not-a-tensor", lambda L: (L.x, L.w13, L.w2, L.weights.tolist(), L.ids), TypeError,
     "topk_weights: expected a torch.Tensor"),
    ("ids-not-a-tensor", lambda L: (L.x, L.w13, L.w2, L.weights, L.ids.tolist()), TypeError,
     "topk_ids: expected a torch.Tensor"),
    ("ids-float", lambda L: (L.x, L.w13, L.w2, L.weights, L.ids.float()), TypeError,
     "topk_ids: expected int32 or int64 expert ids, got torch.float32"),
    ("ids-int16", lambda L: (L.x, L.w13, L.w2, L.weights, L.ids.short()), TypeError, "topk_ids: expected int32 or int64"),
    ("ids-rank-1", lambda L: (L.x, L.w13, L.w2, L.weights.reshape(-1), L.ids.reshape(-1)), ValueError, EQUAL_SHAPES),
    ("ids-tokens", lambda L: (L.x, L.w13, L.w2, L.weights[:-1], L.ids[:-1]), ValueError, EQUAL_SHAPES),
    ("weights-top-k", lambda L: (L.x, L.w13, L.w2, L.weights[:, :1], L.ids), ValueError, EQUAL_SHAPES),
    ("weights-integer", lambda L: (L.x, L.w13, L.w2, L.ids.clone(), L.ids), TypeError,
     "topk_weights: expected floating point"),
    ("weights-device", lambda L: (L.x, L.w13, L.w2, L.weights.to(L.other), L.ids), ValueError,
     r"topk_weights: expected device .* \(same as x\)"),
    ("ids-device", lambda L: (L.x, L.w13, L.w2, L.weights, L.ids.to(L.other)), ValueError,
     r"topk_ids: expected device .* \(same as x\)"),
    ("w13-a-packed-weight", lambda L: (L.x, L.w13.expert(0), L.w2, L.weights, L.ids), TypeError,
     "w13, w2: expected PackedExperts"),
    ("w13-plain-rows", lambda L: (L.x, dataclasses.replace(L.w13, gate_up=False), L.w2, L.weights, L.ids), ValueError,
     r"w13: expected a gate\|up stack"),
    ("w2-gate-up", lambda L: (L.x, L.w13, dataclasses.replace(L.w2, gate_up=True), L.weights, L.ids), ValueError,
     "w2: the down projection is stacked with plain rows"),
    ("swapped", lambda L: (L.x, L.w2, L.w13, L.weights, L.ids), ValueError, r"w13: expected a gate\|up stack"),
    ("w2-expert-count", lambda L: (L.x, L.w13, _fewer(L.w2), L.weights, L.ids), ValueError,
     r"w2: expected \(E, H, I\) = \(4, 256, 128\)"),
    ("w2-other-bits", lambda L: (L.x, L.w13, dataclasses.replace(L.w2, bits=8), L.weights, L.ids), ValueError,
     r"w2: expected the \(bits, zero_mode, layout\) of w13"),
    ("w2-dtype", lambda L: (L.x, L.w13, dataclasses.replace(L.w2, scales=L.w2.scales.bfloat16()), L.weights, L.ids),
     TypeError, r"w2: dtype must equal w13's \(torch.float16\), got torch.bfloat16"),
    ("w13-scales-expert-count", lambda L: (L.x, dataclasses.replace(L.w13, scales=L.w13.scales[:-1]), L.w2, L.weights,
                                           L.ids), ValueError, "w13.scales: expected a stack of 4 experts"),
    ("w13-zeros-device", lambda L: (L.x, dataclasses.replace(L.w13, zeros=L.w13.zeros.to(L.other)), L.w2, L.weights,
                                    L.ids), ValueError, "w13.zeros: expected a stack of 4 experts on"),
    ("w2-device", lambda L: (L.x, L.w13, _on(L.w2, L.other), L.weights, L.ids), ValueError,
     r"w2: expected device .* \(same as x\)"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, build, exc, match", MOE, ids=[c[0] for c in MOE])
def test_moe_rejects(device, case, build, exc, match):
    lay = layer(device)
    with pytest.raises(exc, match=match):
        mg.moe(*build(lay))
    lay.check_usable()


# Read on the host: on the CPU and on the per-expert GPU path (sm80-layout experts, which no
# grouped kernel reads). The grouped path reads no value on the host (moe's docstring).
ROUTING = [
    ("id-E", lambda w, i: (w, _set(i, E, (2, 1))), r"topk_ids: expert ids must lie in \[0, 4\) \(E\) or be -1 .*got 4"),
    ("id-minus-2", lambda w, i: (w, _set(i, -2, (2, 1))), r"topk_ids: expert ids must lie in \[0, 4\) .*got -2"),
    ("id-huge", lambda w, i: (w, _set(i, 2**40, (0, 0))), r"topk_ids: .*got 1099511627776"),
    ("weight-nan", lambda w, i: (_set(w, NAN, (3, 0)), i), "topk_weights: expected finite weights for the routed pairs"),
    ("weight-inf", lambda w, i: (_set(w, INF, (3, 1)), i), "topk_weights: expected finite weights"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, build, match", ROUTING, ids=[c[0] for c in ROUTING])
def test_moe_rejects_bad_routing_where_it_is_read(device, case, build, match):
    lay = layer(device, "auto" if device == "cpu" else "sm80")
    weights, ids = build(lay.weights, lay.ids)
    with pytest.raises(ValueError, match=match):
        mg.moe(lay.x, lay.w13, lay.w2, weights, ids)
    lay.check_usable()


@pytest.mark.parametrize("device", DEVICES)
def test_moe_allows(device):
    """Not errors: strided x, weights and ids (the same result as contiguous ones), int32 ids, fp16
    weights, no tokens, top_k = 0, ids of -1 with NaN weights (nothing added)."""
    lay = layer(device)
    with mg.compile.blocking():  # the kernels selection picks, not a stand-in while they compile
        want = mg.moe(*lay.args())
        x = _strided(lay.x)
        weights, ids = _strided(lay.weights), _strided(lay.ids)
        assert not (x.is_contiguous() or weights.is_contiguous() or ids.is_contiguous())
        assert torch.equal(mg.moe(x, lay.w13, lay.w2, weights, ids), want)
    half = lay.weights.half()
    ref = mg.reference.moe(lay.x.float(), lay.d13, lay.d2, half.float(), lay.ids)
    assert_elementwise(mg.moe(lay.x, lay.w13, lay.w2, half, lay.ids.int()), ref, I, chained=3)
    assert mg.moe(lay.x[:0], lay.w13, lay.w2, lay.weights[:0], lay.ids[:0]).shape == (0, H)
    assert (mg.moe(lay.x, lay.w13, lay.w2, lay.weights[:, :0], lay.ids[:, :0]) == 0).all()
    away = torch.full_like(lay.ids, -1)
    assert (mg.moe(lay.x, lay.w13, lay.w2, torch.full_like(lay.weights, NAN), away) == 0).all()


# ---------------------------------------------------------------------------------------------
# QuantExperts

INIT = [
    ("w13-a-packed-weight", lambda L: ((L.w13.expert(0), L.w2), {}), TypeError, "w13, w2: expected PackedExperts"),
    ("swapped", lambda L: ((L.w2, L.w13), {}), ValueError, r"w13: expected a gate\|up stack"),
    ("expert-count", lambda L: ((L.w13, _fewer(L.w2)), {}), ValueError, r"w2: expected \(E, H, I\)"),
    ("other-bits", lambda L: ((L.w13, dataclasses.replace(L.w2, bits=8)), {}), ValueError,
     r"w2: expected the \(bits, zero_mode, layout\) of w13"),
    ("dtype", lambda L: ((L.w13, dataclasses.replace(L.w2, scales=L.w2.scales.bfloat16())), {}), TypeError,
     "w2: dtype must equal w13's"),
    ("device", lambda L: ((L.w13, _on(L.w2, L.other)), {}), ValueError, "w2: expected w13's device"),
    ("group-size-str", lambda L: ((L.w13, L.w2), {"group_size": "64"}), TypeError,
     "group_size: expected None or an int .-1 or positive., got str"),
    ("group-size-zero", lambda L: ((L.w13, L.w2), {"group_size": 0}), ValueError, "group_size: expected None, -1"),
    ("not-contiguous", lambda L: ((dataclasses.replace(L.w13, b=_strided(L.w13.b)), L.w2), {}), ValueError,
     "w13.b: expected a contiguous stack"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, build, exc, match", INIT, ids=[c[0] for c in INIT])
def test_quant_experts_constructor_rejects(device, case, build, exc, match):
    lay = layer(device)
    args, kwargs = build(lay)
    with pytest.raises(exc, match=match):
        QuantExperts(*args, **kwargs)
    lay.check_usable()


EQUAL_TOP_K = r"top_k_index, top_k_weights: expected equal \(T=5, top_k\) shapes"
FORWARD = [
    ("hidden-not-a-tensor", lambda L: (L.x.tolist(), L.ids, L.weights), TypeError,
     "hidden_states: expected a torch.Tensor"),
    ("hidden-integer", lambda L: (L.x.int(), L.ids, L.weights), TypeError, "hidden_states: expected floating point"),
    ("hidden-rank-3", lambda L: (L.x[None], L.ids, L.weights), ValueError, r"hidden_states: expected \(T, H=256\)"),
    ("hidden-size", lambda L: (L.x[:, :128], L.ids, L.weights), ValueError, r"hidden_states: expected \(T, H=256\)"),
    ("hidden-device", lambda L: (L.x.to(L.other), L.ids, L.weights), ValueError,
     "hidden_states: expected the experts' device"),
    ("index-not-a-tensor", lambda L: (L.x, L.ids.tolist(), L.weights), TypeError, "top_k_index: expected a torch.Tensor"),
    ("index-float", lambda L: (L.x, L.ids.float(), L.weights), TypeError, "top_k_index: expected int32 or int64"),
    ("index-tokens", lambda L: (L.x, L.ids[:-1], L.weights[:-1]), ValueError, EQUAL_TOP_K),
    ("weights-top-k", lambda L: (L.x, L.ids, L.weights[:, :1]), ValueError, EQUAL_TOP_K),
    ("weights-integer", lambda L: (L.x, L.ids, L.ids.clone()), TypeError, "top_k_weights: expected floating point"),
    ("index-device", lambda L: (L.x, L.ids.to(L.other), L.weights), ValueError,
     "top_k_index: expected the experts' device"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, build, exc, match", FORWARD, ids=[c[0] for c in FORWARD])
def test_quant_experts_forward_rejects(device, case, build, exc, match):
    lay = layer(device)
    module = QuantExperts(lay.w13, lay.w2)
    with pytest.raises(exc, match=match):
        module(*build(lay))
    lay.check_usable(module(lay.x, lay.ids, lay.weights))


def test_quant_experts_forward_reads_the_routing_on_the_cpu():
    lay = layer("cpu")
    module = QuantExperts(lay.w13, lay.w2)
    with pytest.raises(ValueError, match=r"top_k_index: expert ids must lie in \[0, 4\) \(E\) or be -1 .*got 4"):
        module(lay.x, _set(lay.ids, E, (0, 1)), lay.weights)
    with pytest.raises(ValueError, match=r"top_k_weights: expected finite weights for the routed pairs \(top_k_index"):
        module(lay.x, lay.ids, _set(lay.weights, NAN, (0, 1)))
    lay.check_usable(module(lay.x, lay.ids, lay.weights))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quant_experts_forward_takes_the_experts_dtype_on_a_gpu():
    lay = layer("cuda")
    module = QuantExperts(lay.w13, lay.w2)
    with pytest.raises(TypeError, match=r"hidden_states: dtype must equal the experts' \(torch.float16\) on a GPU"):
        module(lay.x.float(), lay.ids, lay.weights)
    lay.check_usable(module(lay.x, lay.ids, lay.weights))


# ---------------------------------------------------------------------------------------------
# The command line: (argv, the flag its one error line names)

CLI = [
    (["bench", "--ms", "1,x"], "--ms"), (["bench", "--ms", "0"], "--ms"), (["bench", "--ms", ","], "--ms"),
    (["bench", "--ms"], "--ms"), (["bench", "--bits", "5"], "--bits"), (["bench", "--bits", "4,x"], "--bits"),
    (["bench", "--group-size", "48"], "--group-size"), (["bench", "--group-size", "0"], "--group-size"),
    (["bench", "--group-size", "x"], "--group-size"), (["bench", "--model", "gpt5"], "--model"),
    (["bench", "--shapes", "4096"], "--shapes"), (["bench", "--shapes", "0:4096"], "--shapes"),
    (["bench", "--dtype", "f32"], "--dtype"), (["bench", "--moe", "nope"], "--moe"),
    (["bench", "--moe", "mixtral-8x7b", "--tokens", "1,x"], "--tokens"),
    (["bench", "--moe", "mixtral-8x7b", "--tokens", "-4"], "--tokens"),
    (["profile", "--ms", "1,-1"], "--ms"), (["profile", "--bits", "5"], "--bits"),
    (["profile", "--bits", "4,8"], "--bits"), (["profile", "--group-size", "100"], "--group-size"),
    (["profile", "--replays", "0"], "--replays"), (["profile", "--model", "llama3-8b,gpt5"], "--model"),
    (["profile", "--zero-mode", "x"], "--zero-mode"),
    (["profile-moe", "--model", "nope"], "--model"), (["profile-moe", "--tokens", "0"], "--tokens"),
    (["profile-moe", "--replays", "x"], "--replays"), (["profile-moe", "--dtype", "x"], "--dtype"),
    (["profile-moe", "--families", "sm90s"], "--families"), (["profile-moe", "--bits", "5"], "--bits"),
    (["e2e", "--model", "gpt5"], "--model"), (["e2e", "--model", "llama3-8b,llama3-70b"], "--model"),
    (["e2e", "--layers", "-1"], "--layers"), (["e2e", "--layers", "x"], "--layers"),
    (["e2e", "--batches", "1,0"], "--batches"), (["e2e", "--batches", "x"], "--batches"),
    (["e2e", "--reps", "0"], "--reps"), (["e2e", "--lm-head", "int3"], "--lm-head"),
    (["e2e", "--model", "qwen3-30b-a3b", "--compare"], "--compare"),
    (["build", "--jobs", "0"], "--jobs"), (["build", "--jobs", "x"], "--jobs"), (["build", "--arch", "sm90a"], "--arch"),
    (["build", "--package", "OUT", "--arch", "sm70"], "--arch"), (["build", "--package", "OUT"], "--arch"),
]


@pytest.mark.parametrize("argv, flag", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_cli_rejects(argv, flag, monkeypatch, capsys, tmp_path):
    from mixed_gemm.profiler import timing

    def looked(*_):
        raise AssertionError("a bad argument must be reported before any GPU is looked for")

    monkeypatch.setattr(timing, "gpu_missing", looked)
    argv = [str(tmp_path / "pkg") if a == "OUT" else a for a in argv]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mixed-gemm {argv[0]}: error: {flag}"), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "pkg").exists()


def test_cli_exit_code_as_a_script(tmp_path):
    """``python -m mixed_gemm.cli``: the exit status is 2 and stderr the one line."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "mixed_gemm.cli", "bench", "--ms", "1,0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["mixed-gemm bench: error: --ms: expected comma-separated positive "
                                                "integers, got '1,0'"]
