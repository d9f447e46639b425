"""Every malformed input raises TypeError/ValueError naming the argument and the rule."""
from __future__ import annotations

import re

import pytest
import torch

from mixed_gemm.formats import pack, quantize, unpack

F16, I32, U8 = torch.float16, torch.int32, torch.uint8
N, K, G = 16, 64, 32  # packed awq: (64, 2); gptq: (8, 16); scales (2, 16); zeros (2, 2)


def zeros_(*shape, dtype=I32, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


def ones_(*shape, dtype=F16, device="cpu"):
    return torch.ones(shape, dtype=dtype, device=device)


def awq(**kw):
    args = dict(qweight=zeros_(K, N // 8), scales=ones_(K // G, N), zeros=zeros_(K // G, N // 8))
    opts = dict(format="awq", bits=4, group_size=G)
    args.update({k: v for k, v in kw.items() if k in args})
    opts.update({k: v for k, v in kw.items() if k not in args})
    return unpack(args["qweight"], args["scales"], args["zeros"], **opts)


def gptq(**kw):
    return awq(**{"qweight": zeros_(K // 8, N), "format": "gptq", **kw})


def canon(**kw):
    args = dict(q=zeros_(N, K, dtype=U8), s=ones_(N, K // G), z=ones_(N, K // G))
    opts = dict(format="awq", bits=4, group_size=G)
    args.update({k: v for k, v in kw.items() if k in args})
    opts.update({k: v for k, v in kw.items() if k not in args})
    return pack(args["q"], args["s"], args["z"], **opts)


def plain(**kw):
    return awq(**{"qweight": zeros_(N, K, dtype=U8), "scales": ones_(N, K // G), "zeros": ones_(N, K // G),
                  "format": "plain", **kw})


def with_value(t, index, value):
    t = t.clone()
    t[index] = value
    return t


META = "meta"
CASES = {
    # --- common arguments (both directions) ---
    "format-unknown": (lambda: awq(format="marlin"), ValueError, "format: expected one of"),
    "format-type": (lambda: canon(format=4), TypeError, "format: expected a str"),
    "bits-value": (lambda: awq(bits=3), ValueError, "bits: expected one of (4, 8) for format 'awq', got 3"),
    "bits-type": (lambda: canon(bits="4"), TypeError, "bits: expected an int"),
    "bits-bool": (lambda: canon(bits=True), TypeError, "bits: expected an int"),
    "group-zero": (lambda: awq(group_size=0), ValueError, "group_size: expected -1 or a positive int"),
    "group-negative": (lambda: canon(group_size=-2), ValueError, "group_size: expected -1 or a positive"),
    "group-type": (lambda: canon(group_size=32.0), TypeError, "group_size: expected an int"),
    "ragged-groups-count": (lambda: canon(q=zeros_(N, 80, dtype=U8)), ValueError,
                            "= (N, ceil(K / group_size)) for N=16, K=80, group_size=32"),
    "ragged-groups-count-packed": (lambda: gptq(qweight=zeros_(10, N)), ValueError,
                                   "= (ceil(K / group_size), N) for K=80"),
    # --- unpack, packed formats ---
    "qweight-dtype": (lambda: awq(qweight=zeros_(K, 2, dtype=F16)), TypeError,
                      "qweight: expected dtype torch.int32 for format 'awq', got torch.float16"),
    "qweight-type": (lambda: gptq(qweight=[[0]]), TypeError, "qweight: expected a torch.Tensor"),
    "qweight-ndim": (lambda: awq(qweight=zeros_(K)), ValueError, "qweight: expected a 2-D tensor"),
    "qweight-empty": (lambda: awq(qweight=zeros_(0, 2)), ValueError, "qweight: expected a non-empty"),
    # A qweight of the wrong width names qweight (not scales) and the shape the scales' N implies:
    # awq packs N into qweight's columns, gptq/gptq_v2 keep N unpacked there, plain has N as rows.
    "qweight-N-awq": (lambda: awq(qweight=zeros_(K, N // 8 + 1)), ValueError,
                      "qweight: expected shape (64, 2) = (K, N // 8) for format 'awq', N=16 (from scales (2, 16)), "
                      "K=64, got (64, 3)"),
    "qweight-N-awq-symmetric": (lambda: awq(qweight=zeros_(K, N // 8 - 1), zeros=None), ValueError,
                                "qweight: expected shape (64, 2) = (K, N // 8)"),
    "qweight-N-awq-8bit": (lambda: awq(qweight=zeros_(K, 5), zeros=zeros_(2, 4), bits=8), ValueError,
                           "qweight: expected shape (64, 4) = (K, N // 4)"),
    "qweight-N-gptq": (lambda: gptq(qweight=zeros_(K // 8, N + 1)), ValueError,
                       "qweight: expected shape (8, 16) = (K // 8, N) for format 'gptq', N=16 (from scales (2, 16)), "
                       "K=64, got (8, 17)"),
    "qweight-N-gptq_v2": (lambda: gptq(qweight=zeros_(K // 8, N - 1), format="gptq_v2"), ValueError,
                          "qweight: expected shape (8, 16) = (K // 8, N) for format 'gptq_v2'"),
    "qweight-N-plain": (lambda: plain(qweight=zeros_(N + 1, K, dtype=U8)), ValueError,
                        "qweight: expected shape (16, 64) = (N, K) for format 'plain', N=16 (from scales (16, 2)), "
                        "K=64, got (17, 64)"),
    "q-N-pack": (lambda: canon(q=zeros_(N - 8, K, dtype=U8)), ValueError,
                 "q: expected shape (16, 64) = (N, K) for format 'awq', N=16 (from s (16, 2))"),
    "scales-dtype": (lambda: awq(scales=zeros_(2, N)), TypeError, "scales: expected dtype torch.float16"),
    "scales-shape": (lambda: awq(scales=ones_(2, N + 8)), ValueError, "scales: expected shape (2, 16) = (ceil(K / group_size), N) for K=64, N=16"),
    "scales-shape-gptq": (lambda: gptq(scales=ones_(N, 2)), ValueError, "scales: expected shape (2, 16)"),
    "zeros-dtype": (lambda: gptq(zeros=ones_(2, 2)), TypeError, "zeros: expected dtype torch.int32"),
    "zeros-shape": (lambda: awq(zeros=zeros_(2, 4)), ValueError, "zeros: expected shape (2, 2)"),
    "zeros-N-not-multiple": (lambda: gptq(qweight=zeros_(8, 12), scales=ones_(2, 12), zeros=zeros_(2, 1)),
                             ValueError, "zeros: N=12 must be a multiple of 8"),
    "device-scales": (lambda: awq(scales=ones_(2, N, device=META)), ValueError,
                      "scales: expected the same device as qweight"),
    "device-zeros": (lambda: gptq(zeros=zeros_(2, 2, device=META)), ValueError,
                     "zeros: expected the same device as qweight"),
    "scales-nan": (lambda: awq(scales=with_value(ones_(2, N), (1, 7), float("nan"))), ValueError,
                   "scales: expected finite values, got inf/nan (1 of 32, the first at (1, 7))"),
    "scales-inf-gptq": (lambda: gptq(scales=with_value(ones_(2, N), (0, 0), float("-inf"))), ValueError,
                        "scales: expected finite values"),
    "g_idx-awq": (lambda: awq(g_idx=torch.zeros(K, dtype=I32)), ValueError, "g_idx: format 'awq' has no act-order"),
    "g_idx-dtype": (lambda: gptq(g_idx=torch.zeros(K)), TypeError, "g_idx: expected dtype"),
    "g_idx-shape": (lambda: gptq(g_idx=torch.zeros(K - 1, dtype=I32)), ValueError, "g_idx: expected shape (64,)"),
    "g_idx-range-high": (lambda: gptq(g_idx=with_value(torch.zeros(K, dtype=I32), 5, 2)), ValueError,
                         "g_idx: expected values in [0, 2)"),
    "g_idx-range-negative": (lambda: gptq(g_idx=with_value(torch.zeros(K, dtype=I32), 5, -1)), ValueError,
                             "g_idx: expected values in [0, 2)"),
    "g_idx-device": (lambda: gptq(g_idx=torch.zeros(K, dtype=I32, device=META)), ValueError,
                     "g_idx: expected the same device"),
    # --- unpack, plain ---
    "plain-qweight-dtype": (lambda: plain(qweight=zeros_(N, K)), TypeError,
                            "qweight: expected dtype torch.uint8 for format 'plain', got torch.int32"),
    "plain-qweight-range": (lambda: plain(qweight=with_value(zeros_(N, K, dtype=U8), (1, 2), 16)), ValueError,
                            "qweight: expected values in [0, 16)"),
    "plain-zeros-dtype": (lambda: plain(zeros=ones_(N, 2, dtype=torch.bfloat16)), TypeError,
                          "zeros: expected dtype torch.float16 (same as scales)"),
    "plain-scales-shape": (lambda: plain(scales=ones_(2, N)), ValueError, "scales: expected shape (16, 2)"),
    "plain-scales-nan": (lambda: plain(scales=with_value(ones_(N, 2), (3, 1), float("nan"))), ValueError,
                         "scales: expected finite values"),
    "plain-scales-nan-float-zeros": (lambda: plain(scales=with_value(ones_(N, 2), (3, 1), float("nan")),
                                                   zero_mode="float"), ValueError, "scales: expected finite values"),
    "plain-zeros-inf-float": (lambda: plain(zeros=with_value(ones_(N, 2), (0, 1), float("inf")), zero_mode="float"),
                              ValueError, "zeros: expected finite values"),
    "plain-zeros-nan-offset": (lambda: plain(zeros=with_value(ones_(N, 2), (0, 1), float("nan")), zero_mode="offset"),
                               ValueError, "zeros: expected finite values"),
    "sparse12-scales-nan": (lambda: awq(qweight=zeros_(N, K // 2, dtype=U8), scales=with_value(ones_(N, 2), (0, 0),
                                                                                               float("nan")),
                                        zeros=None, format="sparse12", bits=7), ValueError,
                            "scales: expected finite values"),
    # --- pack ---
    "q-dtype": (lambda: canon(q=zeros_(N, K)), TypeError, "q: expected dtype torch.uint8 for format 'awq'"),
    "q-range-4bit": (lambda: canon(q=with_value(zeros_(N, K, dtype=U8), (3, 3), 16)), ValueError,
                     "q: expected values in [0, 16), got min 0, max 16"),
    "s-dtype": (lambda: canon(s=zeros_(N, 2)), TypeError, "s: expected dtype"),
    "s-ndim": (lambda: canon(s=ones_(N * 2)), ValueError, "s: expected a 2-D tensor"),
    "s-shape": (lambda: canon(s=ones_(N, 4), z=None), ValueError,
                "s: expected shape (16, 2) = (N, ceil(K / group_size)) for N=16, K=64, group_size=32, got (16, 4)"),
    "z-dtype": (lambda: canon(z=zeros_(N, 2)), TypeError, "z: expected dtype torch.float16 (same as s)"),
    "z-shape": (lambda: canon(z=ones_(N, 1)), ValueError, "z: expected shape (16, 2)"),
    "z-non-integer": (lambda: canon(z=ones_(N, 2) * 1.5), ValueError, "z: expected integer values"),
    "z-nan": (lambda: canon(z=with_value(ones_(N, 2), (0, 0), float("nan"))), ValueError, "z: expected finite"),
    "s-nan": (lambda: canon(s=with_value(ones_(N, 2), (5, 1), float("nan"))), ValueError,
              "s: expected finite values, got inf/nan (1 of 32, the first at (5, 1))"),
    "s-inf-hqq": (lambda: canon(s=with_value(ones_(N, 2), (0, 0), float("inf")), format="hqq"), ValueError,
                  "s: expected finite values"),
    "z-inf-float": (lambda: canon(z=with_value(ones_(N, 2), (0, 0), float("inf")), format="plain", zero_mode="float"),
                    ValueError, "z: expected finite values"),
    "z-range": (lambda: canon(z=with_value(ones_(N, 2), (0, 1), 16)), ValueError, "z: expected values in [0, 16)"),
    "z-negative": (lambda: canon(z=with_value(ones_(N, 2), (0, 1), -1), format="gptq"), ValueError,
                   "z: expected values in [0, 16)"),
    "z-range-8bit": (lambda: canon(z=with_value(ones_(N, 2), (0, 1), 256), bits=8), ValueError,
                     "z: expected values in [0, 256)"),
    "awq-N-not-multiple": (lambda: canon(q=zeros_(12, K, dtype=U8), s=ones_(12, 2), z=None), ValueError,
                           "q: N=12 must be a multiple of 8"),
    "awq8-N-not-multiple": (lambda: canon(q=zeros_(6, K, dtype=U8), s=ones_(6, 2), z=None, bits=8),
                            ValueError, "q: N=6 must be a multiple of 4"),
    "gptq-K-not-multiple": (lambda: canon(q=zeros_(N, 36, dtype=U8), s=ones_(N, 1), z=ones_(N, 1),
                                          group_size=-1, format="gptq_v2"),
                            ValueError, "q: K=36 must be a multiple of 8"),
    "gptq-z-N-not-multiple": (lambda: canon(q=zeros_(12, K, dtype=U8), s=ones_(12, 2), z=ones_(12, 2),
                                            format="gptq"), ValueError, "z: N=12 must be a multiple of 8"),
    "pack-device": (lambda: canon(z=ones_(N, 2, device=META)), ValueError, "z: expected the same device as q"),
    "pack-g_idx-awq": (lambda: canon(g_idx=torch.zeros(K, dtype=I32)), ValueError, "g_idx: format 'awq'"),
    "pack-g_idx-range": (lambda: canon(format="gptq", g_idx=torch.full((K,), 2, dtype=I32)), ValueError,
                         "g_idx: expected values in [0, 2)"),
    # --- quantize ---
    "w-type": (lambda: quantize([[1.0]]), TypeError, "w: expected a torch.Tensor"),
    "w-dtype": (lambda: quantize(zeros_(4, 64)), TypeError, "w: expected dtype"),
    "w-ndim": (lambda: quantize(ones_(64)), ValueError, "w: expected a 2-D tensor"),
    "w-nan": (lambda: quantize(with_value(ones_(4, 64), (0, 0), float("nan")), group_size=32), ValueError,
              "w: expected finite values"),
    "w-overflow": (lambda: quantize(ones_(4, 64, dtype=torch.float32) * 1e9, group_size=32), ValueError,
                   "w: values too large"),
    "quantize-bits": (lambda: quantize(ones_(4, 64), bits=5), ValueError, "bits: expected one of (1, 2, 3, 4, 7, 8), got 5"),
    "quantize-group": (lambda: quantize(ones_(4, 64), group_size=0), ValueError,
                       "group_size: expected -1 or a positive int, got 0"),
    "quantize-symmetric": (lambda: quantize(ones_(4, 64), group_size=32, symmetric=1), TypeError,
                           "symmetric: expected a bool"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_error(case):
    fn, exc, msg = CASES[case]
    with pytest.raises(exc, match=re.escape(msg)):
        fn()


def test_valid_baselines_do_not_raise():
    """The helpers above are valid as given, so each case fails for the reason it names."""
    awq(), gptq(), plain(), canon(), canon(format="gptq")
    quantize(ones_(4, 64), group_size=32)
