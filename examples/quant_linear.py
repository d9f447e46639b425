"""QuantLinear directly: quantize an nn.Linear, or wrap a checkpoint's tensors, and call it."""
import torch
from torch import nn

import mixed_gemm as mg
from mixed_gemm.nn import QuantLinear

device = "cuda" if torch.cuda.is_available() else "cpu"
linear = nn.Linear(4096, 11008, bias=False, dtype=torch.float16, device=device)
layer = QuantLinear.from_linear(linear, bits=4, group_size=128)          # RTN int4 with zero points
print(layer)
x = torch.randn(8, 4096, dtype=torch.float16, device=device)
print("rel. error vs fp16:", ((layer(x).float() - linear(x).float()).norm() / linear(x).float().norm()).item())

# From a checkpoint's tensors (here made with mg.pack; an AWQ file holds the same three tensors).
q, s, z = mg.quantize(linear.weight.detach(), bits=4, group_size=128)
qweight, scales, qzeros = mg.pack(q, s, z, format="awq", bits=4, group_size=128)
same = QuantLinear.from_checkpoint(qweight, scales, qzeros, format="awq", bits=4, group_size=128)
print("same as from_linear:", torch.equal(same(x), layer(x)))
torch.save(layer.state_dict(), "/tmp/quant_linear.pt")  # buffers round-trip through state_dict
