"""``silu_mul_matmul`` and the gated MLP on the CPU: the argument rules, the reference path, and
which MLPs fuse_projections gives the SiLU·mul epilogue."""
import pytest
import torch
from torch import nn

from mixed_gemm.integrations.fuse import FusedGateUpMLP, fuse_projections
from mixed_gemm.nn import QuantLinear
from mixed_gemm.ops.gated import _as_expert, silu_mul_matmul


def _linear(n, k, bias=False, seed=0):
    torch.manual_seed(seed)
    return QuantLinear.from_linear(nn.Linear(k, n, bias=bias), bits=4, group_size=64)


def test_rules_name_the_argument():
    q = _linear(192, 128)
    with pytest.raises(TypeError, match="w: expected a PackedWeight"):
        silu_mul_matmul(torch.randn(1, 128), q)
    with pytest.raises(ValueError, match="K=128"):
        silu_mul_matmul(torch.randn(1, 64), q.packed())
    with pytest.raises(ValueError, match="has a bias"):
        _linear(192, 128, bias=True).silu_mul(torch.randn(1, 128))


def test_cpu_reference_and_layouts():
    q = _linear(256, 128)
    x = torch.randn(3, 128)
    gate, up = q(x).split(128, dim=-1)
    torch.testing.assert_close(q.silu_mul(x), nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)
    # the grouped kernels read one sm90a copy with zeros; an sm80 weight takes the matmul path
    assert _as_expert(QuantLinear.from_linear(nn.Linear(128, 256, bias=False), layout="sm80").packed()) is None


class _MLP(nn.Module):
    def __init__(self, act, bias=False):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = _linear(128, 64, bias, 1), _linear(128, 64, bias, 2), _linear(64, 128, False, 3)
        self.act_fn = act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize("act,bias,gated", [(nn.SiLU(), False, True), (nn.GELU(), False, False), (nn.SiLU(), True, False)])
def test_fuse_projections_gates_silu_mlps_without_bias(act, bias, gated):
    model = nn.Sequential(_MLP(act, bias))
    x = torch.randn(2, 64)
    want = model(x)
    assert fuse_projections(model, gated=True) == 1
    assert isinstance(model[0], FusedGateUpMLP) and model[0].gated is gated
    torch.testing.assert_close(model(x), want, rtol=1e-4, atol=1e-5)
    ungated = nn.Sequential(_MLP(act, bias))
    fuse_projections(ungated)  # off by default
    assert ungated[0].gated is False
