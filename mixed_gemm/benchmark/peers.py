"""The libraries ``mixed-gemm bench --compare`` times beside mg.matmul: PyTorch's tinygemm (int4,
bf16), gemlite (its A16Wn layers) and humming-kernels (``HummingLayer``). Each is optional: a peer
that is not installed, or has no kernel for the weight kind, is skipped with a note in the table's
footer instead of a column of numbers.

A peer's row keys are ``<name>_us`` and ``<name>_speedup`` (over torch fp16), or ``<name>_error``
(the note). tinygemm and gemlite quantize random codes of their own; humming reads mg's codes,
scales and zeros (``PackedWeight.unpack``), so its output is checked against mg.matmul's.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

Runner = Callable[[torch.Tensor], torch.Tensor]


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def _import(module: str, package: str) -> Optional[str]:
    """Why ``module`` cannot be imported here, or None."""
    try:
        importlib.import_module(module)
    except ImportError:
        return f"{package} is not installed (pip install {package}); skipped"
    except Exception as exc:  # noqa: BLE001 - a broken install is a note, not a failed bench
        return f"importing {package} failed ({error_text(exc)}); skipped"
    return None


class Peer:
    """One peer library: its name (the row keys' prefix), what it cannot run, and its layers.
    ``same_weight``: it multiplies by mg's weight, so its output can be checked against mg's."""

    name = ""
    same_weight = False

    def unavailable(self, kind) -> Optional[str]:
        """Why this peer cannot run weights of ``kind`` (a ``measure.WeightKind``) here, or None."""
        return None

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """The activations as the peer takes them (converted once per M, outside the timing)."""
        return x

    def build(self, n: int, k: int, kind, dtype: torch.dtype, copies: int, weights: Sequence) -> List[Runner]:
        """``copies`` runners ``x -> y`` over separate copies of one weight (raises if the peer refuses)."""
        raise NotImplementedError


class TinyGemm(Peer):
    name = "tinygemm"

    def unavailable(self, kind) -> Optional[str]:
        if kind.bits != 4:
            return "int4 only"
        if not hasattr(torch, "_weight_int4pack_mm"):
            return "this torch has no _weight_int4pack_mm"
        return None

    def inputs(self, x):
        return x.to(torch.bfloat16)  # tinygemm runs bf16 only

    def build(self, n, k, kind, dtype, copies, weights):
        from ..formats.tinygemm import pack_codes

        packed = pack_codes(torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda"))
        sz = (torch.rand(k // kind.group_size, n, 2, device="cuda") * 0.01).to(torch.bfloat16)
        group = kind.group_size
        out = []
        for i in range(copies):
            p, s = (packed, sz) if i == 0 else (packed.clone(), sz.clone())
            out.append(lambda x, p=p, s=s: torch._weight_int4pack_mm(x, p, group, s))
        return out


GEMLITE_BITS = (1, 2, 4, 8)


class GemLite(Peer):
    name = "gemlite"

    def unavailable(self, kind) -> Optional[str]:
        if kind.bits not in GEMLITE_BITS:
            return f"no {kind.bits}-bit grouped-INT layer"
        return _import("gemlite.helper", "gemlite")

    def build(self, n, k, kind, dtype, copies, weights):
        from gemlite.helper import A16Wn

        bits, group = kind.bits, kind.group_size
        out = []
        for _ in range(copies):
            q = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device="cuda")
            s = (torch.rand(n, k // group, device="cuda") * 0.01).to(dtype)
            z = torch.randint(0, 2**bits, (n, k // group), device="cuda").to(dtype)
            out.append(A16Wn(device="cuda", dtype=dtype).from_weights(q, s, z, bits, group))
        return out


def pack_bitstream(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Integers in ``[0, 2**bits)`` along the last dim as one little-endian bit stream in int32
    words, value ``i`` at bits ``[i bits, (i + 1) bits)``: humming's packing (its ``pack_weight``),
    a word boundary crossed where ``bits`` does not divide 32."""
    *lead, m = values.shape
    if m * bits % 32:
        raise ValueError(f"values: {m} values of {bits} bits do not fill whole 32-bit words")
    v = values
    if m % 32:  # pad to whole blocks of 32 values; the padding's words are dropped below
        v = torch.cat([v, v.new_zeros(*lead, 32 - m % 32)], dim=-1)
    v = v.reshape(*lead, -1, 32)
    words = torch.zeros(*v.shape[:-1], bits + 1, dtype=torch.int64, device=values.device)
    for i in range(32):  # each value's low part, and what spills into the next word
        word, shift = divmod(i * bits, 32)
        vi = v[..., i].to(torch.int64)  # one value of every block at a time: a 70B weight is 470M values
        words[..., word] |= (vi << shift) & 0xFFFFFFFF
        if shift + bits > 32:
            words[..., word + 1] |= vi >> (32 - shift)
    words = words[..., :bits].reshape(*lead, -1)[..., : m * bits // 32]
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).contiguous()  # as int32


def humming_tensors(q: torch.Tensor, s: torch.Tensor, z: Optional[torch.Tensor], bits: int,
                    zero_mode: str) -> Dict[str, torch.Tensor]:
    """Canonical ``(q, s, z)`` (``w = (q - z) s``; ``s``, ``z`` ``(N, G)``) as a humming-schema layer's
    state: ``weight`` packed along K, ``weight_scale`` as is, integer zero points packed along N."""
    out = {"weight": pack_bitstream(q, bits), "weight_scale": s.contiguous()}
    if zero_mode == "int":
        out["zero_point"] = pack_bitstream(z.round().to(torch.int32).t(), bits).t().contiguous()
    elif zero_mode == "float":
        out["zero_point"] = z.to(s.dtype).contiguous()
    return out


class Humming(Peer):
    name = "humming"
    same_weight = True

    def unavailable(self, kind) -> Optional[str]:
        if kind.bits == 7:
            return "no 1:2-sparse format"
        if kind.zero_mode == "offset":
            return "no additive-offset zeros"
        return _import("humming.layer", "humming-kernels")

    def build(self, n, k, kind, dtype, copies, weights):
        from humming.layer import HummingLayer

        if n * kind.bits % 32 or k * kind.bits % 32:
            raise ValueError(f"N={n}, K={k}: humming packs rows and zero points in whole 32-bit words")
        q, s, z = weights[0].unpack()  # mg's codes, scales and zero points: the same weight
        config = {"quant_method": "humming", "b_dtype": f"uint{kind.bits}",
                  "weight_scale_group_size": 0 if kind.group_size in (-1, k) else kind.group_size,
                  "has_zero_point": kind.zero_mode in ("int", "float"),
                  "is_fp_zero_point": kind.zero_mode == "float"}
        state = humming_tensors(q, s.to(dtype), z, kind.bits, kind.zero_mode)
        del q
        out = []
        for _ in range(copies):
            layer = HummingLayer(shape_n=n, shape_k=k, weight_config=dict(config), torch_dtype=dtype).cuda()
            layer.load_from_tensors(state)
            layer.transform()
            out.append(layer)
        return out


PEERS: Tuple[Peer, ...] = (TinyGemm(), GemLite(), Humming())


def prepare(peers: Sequence[Peer], kind, build_args: Callable[[Peer], tuple]) -> Tuple[Dict[str, tuple], Dict[str, str]]:
    """``({name: (peer, runners)}, {name: note})``: each peer built (``peer.build(*build_args(peer))``)
    or the reason it was skipped or refused."""
    ready, notes = {}, {}
    for peer in peers:
        why = peer.unavailable(kind)
        if why is None:
            try:
                ready[peer.name] = (peer, peer.build(*build_args(peer)))
                continue
            except Exception as exc:  # noqa: BLE001 - report why, keep benchmarking
                why = error_text(exc)
        notes[peer.name] = f"{peer.name}: {why}"
    return ready, notes


MAX_REL_ERR = 2e-2  # two 16-bit products of one weight: rounding differences only


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def time_into(row: Dict, ready: Dict[str, tuple], notes: Dict[str, str], x: torch.Tensor, t_fp: float,
              timer: Callable[[Callable[[int], object], int], float], reference: Optional[torch.Tensor] = None) -> None:
    """Each ready peer's seconds per call on ``x`` (``timer(fn, copies)``, rotating its copies) into
    ``row`` as ``<name>_us`` / ``<name>_speedup``; a failure becomes its note (and the peer is not
    tried again for this weight). A ``same_weight`` peer's output is compared with ``reference``
    (mg's, for this ``x``) first: ``<name>_rel_err``, and a note where they disagree."""
    for name, (peer, runners) in ready.items():
        if name in notes:
            continue
        try:
            xp = peer.inputs(x)
            if peer.same_weight and reference is not None:
                err = rel_err(runners[0](xp), reference)
                row[f"{name}_rel_err"] = err
                if not err <= MAX_REL_ERR:  # timed all the same; the footer says so
                    row[f"{name}_error"] = f"{name}: output differs from mg.matmul's by {100 * err:.1f}% (relative)"
            t = timer(lambda i: runners[i % len(runners)](xp), len(runners))
            row.update({f"{name}_us": t * 1e6, f"{name}_speedup": t_fp / t})
        except Exception as exc:  # noqa: BLE001
            notes[name] = f"{name}: {error_text(exc)}"
    for name, note in notes.items():
        row[f"{name}_error"] = note
