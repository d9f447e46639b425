"""ColumnParallel/RowParallel QuantLinear on one process (tp_size 1 and argument rules); the
two-process behaviour is in tests/integrations/test_tp.py."""
import pytest
import torch
from torch import nn

from mixed_gemm.nn import QuantLinear
from mixed_gemm.nn.parallel import ColumnParallelQuantLinear, RowParallelQuantLinear


def _linear(bias=False):
    return QuantLinear.from_linear(nn.Linear(128, 64, bias=bias).half(), bits=4, group_size=64)


def test_tp_size_one_is_the_layer():
    lin = _linear(bias=True)
    x = torch.randn(3, 128).half()
    row = RowParallelQuantLinear(lin, tp_rank=0, tp_size=1)
    assert torch.equal(row(x), lin(x)) and row.full_in_features == 128  # no all-reduce at tp_size 1
    col = ColumnParallelQuantLinear.from_shard(lin.packed(), lin.bias, tp_rank=0, tp_size=1, group_size=64)
    assert torch.equal(col(x), lin(x)) and "tp_rank=0, tp_size=1" in repr(col)


def test_rules_are_named():
    lin = _linear(bias=True)
    with pytest.raises(ValueError, match="linear: only rank 0 of a row-parallel layer holds the bias"):
        RowParallelQuantLinear(lin, tp_rank=1, tp_size=2)
    with pytest.raises(ValueError, match=r"input_index: expected \(128,\)"):
        RowParallelQuantLinear(_linear(), tp_rank=1, tp_size=2, in_features=96, input_index=torch.arange(96))
    with pytest.raises(ValueError, match="in_features: 96 differs from linear.in_features=128"):
        RowParallelQuantLinear(_linear(), tp_rank=1, tp_size=2, in_features=96)
    with pytest.raises(ValueError, match="tp_rank, tp_size: expected tp_size >= 1"):
        RowParallelQuantLinear(_linear(), tp_rank=2, tp_size=2)
    with pytest.raises(TypeError, match="tp_size: expected an int"):
        ColumnParallelQuantLinear.from_shard(lin.packed(), tp_rank=0, tp_size=2.0)
    with pytest.raises(TypeError, match="linear: expected a QuantLinear"):
        RowParallelQuantLinear(nn.Linear(4, 4), tp_rank=0, tp_size=1)


def test_input_index_gathers_x():
    lin = _linear()
    index = torch.randperm(128)
    row = RowParallelQuantLinear(lin, tp_rank=0, tp_size=1, input_index=index)
    x = torch.randn(2, 128).half()
    assert torch.equal(row(x), lin(x[:, index]))
