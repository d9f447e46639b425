"""The peers of `mixed-gemm bench --compare` on the CPU: a peer that cannot be imported is skipped with
a note (and never built), humming's packing of mg's codes, and how peer timings and notes land in a
row (a fake timer stands in for the GPU)."""
from __future__ import annotations

import sys

import pytest
import torch

from mixed_gemm.benchmark import peers, report
from mixed_gemm.benchmark.measure import WeightKind
from mixed_gemm.formats._bitpack import pack_last

INT4 = WeightKind("f16", 4, 128, "int")


class _Never(peers.Peer):
    """A peer whose build must not be reached."""

    name = "never"

    def build(self, *args):
        raise AssertionError("built a peer that should have been skipped")


def _hide(monkeypatch, *modules):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError


def test_humming_not_importable_is_skipped_with_a_note(monkeypatch):
    _hide(monkeypatch, "humming", "humming.layer")
    note = "humming: humming-kernels is not installed (pip install humming-kernels); skipped"
    assert peers.Humming().unavailable(INT4) == note[len("humming: "):]
    built = []
    ready, notes = peers.prepare([peers.Humming()], INT4, lambda peer: built.append(peer) or ())
    assert (ready, notes, built) == ({}, {"humming": note}, [])
    row = {}
    peers.time_into(row, ready, notes, torch.zeros(1, 8), 1e-5, lambda fn, copies: 1 / 0)
    assert row == {"humming_error": note}
    assert report.notes([row]) == [f"unavailable or failed: {note}"]


def test_gemlite_not_importable_and_kinds_a_peer_lacks(monkeypatch):
    _hide(monkeypatch, "gemlite", "gemlite.helper")
    assert peers.GemLite().unavailable(INT4) == "gemlite is not installed (pip install gemlite); skipped"
    assert peers.GemLite().unavailable(WeightKind("f16", 3, 64, "int")) == "no 3-bit grouped-INT layer"
    assert peers.TinyGemm().unavailable(WeightKind("f16", 8, 128, "int")) == "int4 only"
    assert peers.Humming().unavailable(WeightKind("f16", 7, 64, "int")) == "no 1:2-sparse format"
    assert peers.Humming().unavailable(WeightKind("f16", 4, 128, "offset")) == "no additive-offset zeros"


def test_a_refused_build_becomes_a_note():
    class Refuses(peers.Peer):
        name = "refuses"

        def build(self, *args):
            raise RuntimeError("no kernel for N=4100\nsecond line")

    ready, notes = peers.prepare([Refuses()], INT4, lambda peer: ())
    assert ready == {} and notes == {"refuses": "refuses: RuntimeError: no kernel for N=4100"}


def test_time_into_rotates_copies_and_checks_the_same_weight():
    calls = []

    class Same(peers.Peer):
        name = "same"
        same_weight = True

        def inputs(self, x):
            return x * 2

        def build(self, *args):
            return [lambda x, i=i: calls.append(i) or x.sum(-1, keepdim=True) for i in range(3)]

    def timer(fn, copies):
        for i in range(copies):
            fn(i)
        return 4e-6

    ready, notes = peers.prepare([Same()], INT4, lambda peer: ())
    x = torch.arange(1.0, 9.0).reshape(2, 4)
    row = {}
    peers.time_into(row, ready, notes, x, 1e-5, timer, reference=2 * x.sum(-1, keepdim=True))
    assert calls == [0, 0, 1, 2]  # the check on copy 0, then every copy timed
    assert row == {"same_rel_err": 0.0, "same_us": pytest.approx(4.0), "same_speedup": pytest.approx(2.5)}
    row = {}
    peers.time_into(row, ready, notes, x, 1e-5, timer, reference=x.sum(-1, keepdim=True))
    assert row["same_rel_err"] == pytest.approx(1.0)
    assert row["same_error"] == "same: output differs from mg.matmul's by 100.0% (relative)"
    assert row["same_us"] == pytest.approx(4.0)  # timed all the same


def test_a_peer_failing_at_one_m_is_not_tried_again():
    class Fails(peers.Peer):
        name = "fails"

        def build(self, *args):
            return [lambda x: x]

    tries = []

    def timer(fn, copies):
        tries.append(copies)
        raise RuntimeError("out of memory")

    ready, notes = peers.prepare([Fails()], INT4, lambda peer: ())
    first, second = {}, {}
    peers.time_into(first, ready, notes, torch.ones(1, 4), 1e-5, timer)
    peers.time_into(second, ready, notes, torch.ones(1, 4), 1e-5, timer)
    assert tries == [1]
    assert first == second == {"fails_error": "fails: RuntimeError: out of memory"}


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_bitstream_is_field_order_where_bits_divide_32(bits):
    gen = torch.Generator().manual_seed(bits)
    q = torch.randint(0, 2**bits, (5, 96), generator=gen, dtype=torch.uint8)
    assert torch.equal(peers.pack_bitstream(q, bits), pack_last(q, bits))


@pytest.mark.parametrize("bits,m", [(3, 64), (3, 32), (5, 32), (6, 16), (3, 96)])
def test_bitstream_crossing_words(bits, m):
    gen = torch.Generator().manual_seed(bits * 100 + m)
    q = torch.randint(0, 2**bits, (3, m), generator=gen, dtype=torch.uint8)
    words = peers.pack_bitstream(q, bits)
    assert words.dtype == torch.int32 and words.shape == (3, m * bits // 32)
    stream = [[(int(w) >> b) & 1 for w in row for b in range(32)] for row in words]  # LSB first
    want = [[(int(v) >> b) & 1 for v in row for b in range(bits)] for row in q]
    assert stream == want


def test_bitstream_rejects_partial_words():
    with pytest.raises(ValueError, match="do not fill whole 32-bit words"):
        peers.pack_bitstream(torch.zeros(2, 10, dtype=torch.uint8), 3)


def test_humming_tensors_from_canonical_codes():
    gen = torch.Generator().manual_seed(0)
    n, k, g = 16, 256, 128
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s = torch.rand(n, k // g, generator=gen).half() + 0.5
    z = torch.randint(0, 16, (n, k // g), generator=gen).half()
    t = peers.humming_tensors(q, s, z, 4, "int")
    assert t["weight"].shape == (n, k // 8) and t["weight"].dtype == torch.int32
    assert torch.equal(t["weight"], pack_last(q, 4))  # value 8j + i at bits 4i of word j
    assert t["zero_point"].shape == (n // 8, k // g)  # packed along N, one column per group
    for row in range(n):
        for grp in range(k // g):
            word = int(t["zero_point"][row // 8, grp])
            assert (word >> (4 * (row % 8))) & 0xF == int(z[row, grp])
    assert torch.equal(t["weight_scale"], s)
    assert set(peers.humming_tensors(q, s, None, 4, "sym")) == {"weight", "weight_scale"}
    assert torch.equal(peers.humming_tensors(q, s, z + 0.25, 4, "float")["zero_point"], z + 0.25)
