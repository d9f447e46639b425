"""The all-reduce kernels on ONE GPU: W emulated ranks, each with its own stream and its own
buffer in the same device memory (the peers' addresses are plain device pointers, as symmetric
memory's would be). What this checks without two GPUs: the pieces, tails and two-shot segments
for every size (1 element up), rank-order fp32 sums bit-identical on every rank, in place, the
fused residual + RMSNorm, the device-side call counters and buffer parities across mixed sizes
(active block counts change from call to call), one rank running calls ahead of a delayed peer,
and CUDA-graph replays interleaved with eager calls. NVLink ordering itself needs two GPUs:
test_tp_allreduce_gpu.py. Run: python -m pytest -m gpu tests/integrations/test_tp_allreduce_emulated_gpu.py
"""
import pytest
import torch

from mixed_gemm.kernels.allreduce import FAMILY, AllReduceConfig, buffer_bytes

pytestmark = [pytest.mark.gpu]

SLOT = 2 << 20
NUMELS = [1, 3, 7, 8, 9, 15, 17, 31, 1000, 4095, 4096, 8192, 8200, 65536 + 5, 64 * 8192, 3 * 64 * 8192 // 2,
          1 << 20]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


class Ranks:
    """``world`` emulated ranks on the current GPU: their buffers, streams and argument blocks."""

    def __init__(self, world: int):
        self.world, self.device = world, torch.device("cuda", torch.cuda.current_device())
        self.bufs = [torch.zeros(buffer_bytes(world, SLOT), dtype=torch.uint8, device=self.device) for _ in range(world)]
        self.streams = [torch.cuda.Stream(self.device) for _ in range(world)]
        self._kernels = {}

    def kernel(self, algo: str, dtype: str):
        key = (algo, dtype)
        if key not in self._kernels:
            launcher = FAMILY.launcher(AllReduceConfig(algo, dtype, self.world), self.device.index)
            blocks = []
            for rank in range(self.world):
                args, argv = launcher.block()
                for i, b in enumerate(self.bufs):
                    args.peers[i] = b.data_ptr()
                args.rank, args.slot_bytes, args.timeout_ns = rank, SLOT, 30 * 10**9  # a lost peer traps
                blocks.append((args, argv))
            self._kernels[key] = (launcher, blocks)
        return self._kernels[key]

    def launch(self, algo: str, xs, outs, streams=None, rows: int = 1, extra=None, sleep=None):
        """One call on every rank: rank r sums ``xs[r]`` into ``outs[r]`` on its stream (after
        ``sleep[r]`` GPU cycles there, to make it late)."""
        name = {v: k for k, v in DTYPES.items()}[xs[0].dtype]
        launcher, blocks = self.kernel(algo, name)
        for r, (args, argv) in enumerate(blocks):
            stream = (streams or self.streams)[r]
            with torch.cuda.stream(stream):
                if sleep and sleep[r]:
                    torch.cuda._sleep(sleep[r])
            args.in_, args.out, args.numel, args.rows = xs[r].data_ptr(), outs[r].data_ptr(), xs[r].numel(), rows
            args.active_blocks = launcher.config.active_blocks(xs[r].numel(), rows)
            for key, value in (extra[r] if extra else {}).items():
                setattr(args, key, value)
            launcher.launch(argv, stream.cuda_stream)

    def fork(self):
        for s in self.streams:
            s.wait_stream(torch.cuda.current_stream())

    def join(self):
        for s in self.streams:
            torch.cuda.current_stream().wait_stream(s)


def _rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _reference(xs):
    """The kernels' sum: fp32 from -0.0, ranks in order, rounded once."""
    acc = torch.full(xs[0].shape, -0.0, dtype=torch.float32, device=xs[0].device)
    for x in xs:
        acc = acc + x.float()
    return acc.to(xs[0].dtype)


def _same_bits(a, b):
    return torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def _poisoned(x):
    return torch.full_like(x, float("nan"))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_size_every_rank_bit_identical(world):
    ranks = Ranks(world)
    dtypes = ("f16", "bf16", "f32") if world == 2 else ("bf16",)
    for name in dtypes:
        dtype = DTYPES[name]
        for algo in ("one_shot", "two_shot"):
            for numel in NUMELS:
                if numel * dtype.itemsize > SLOT:
                    continue
                xs = [_rand(numel, dtype, 1000 * r + numel) for r in range(world)]
                want = _reference(xs)
                outs = [_poisoned(x) for x in xs]
                kept = [x.clone() for x in xs]
                inplace = [x.clone() for x in xs]
                ranks.fork()
                ranks.launch(algo, xs, outs)
                ranks.launch(algo, inplace, inplace)  # the next call: the other parity, in place
                ranks.join()
                torch.cuda.synchronize()
                for r in range(world):
                    where = f"{name} {algo} numel {numel} rank {r}/{world}"
                    assert _same_bits(outs[r], want), f"{where}: max|d| {(outs[r].float() - want.float()).abs().max()}"
                    assert _same_bits(inplace[r], want), f"{where}: in place"
                    assert _same_bits(xs[r], kept[r]), f"{where}: the input must stay as it was"


def test_negative_zeros_stay_negative():
    ranks = Ranks(2)
    xs = [torch.full((24,), -0.0, dtype=torch.float16, device="cuda") for _ in range(2)]
    outs = [_poisoned(x) for x in xs]
    ranks.fork()
    ranks.launch("one_shot", xs, outs)
    ranks.join()
    torch.cuda.synchronize()
    assert all(torch.signbit(o).all() and (o == 0).all() for o in outs)


def test_mixed_sizes_with_a_late_rank_each_call():
    """Calls of changing sizes and algorithms (active blocks 1..64), a different rank delayed
    before each: the early rank pushes the next call's parity while its peer still sums."""
    world = 2
    ranks = Ranks(world)
    gen = torch.Generator().manual_seed(5)
    plan = []
    for i in range(60):
        numel = [1, 9, 4096, 8200, 64 * 8192, 1 << 19][int(torch.randint(0, 6, (1,), generator=gen))]
        algo = ("one_shot", "two_shot")[i % 2]
        xs = [_rand(numel, torch.float16, 10**6 * r + i) for r in range(world)]
        plan.append((algo, xs, [_poisoned(x) for x in xs]))
    ranks.fork()
    for i, (algo, xs, outs) in enumerate(plan):
        sleep = [0] * world
        sleep[i % world] = int(torch.randint(0, 200_000, (1,), generator=gen))
        ranks.launch(algo, xs, outs, sleep=sleep)
    ranks.join()
    torch.cuda.synchronize()
    for i, (algo, xs, outs) in enumerate(plan):
        want = _reference(xs)
        for r in range(world):
            assert _same_bits(outs[r], want), f"call {i} {algo} numel {xs[0].numel()} rank {r}"


@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_fused_residual_rms_norm(name):
    from mixed_gemm.ops.allreduce import residual_rms_norm

    dtype, world, eps = DTYPES[name], 2, 1e-5
    ranks = Ranks(world)
    for rows, cols in [(1, 8192), (3, 4096), (16, 8192), (64, 8192), (100, 1024), (2, 8)]:
        xs = [_rand((rows, cols), dtype, 100 * r + rows) for r in range(world)]
        res = _rand((rows, cols), dtype, rows)  # replicated: the same on every rank
        w = (1 + 0.1 * _rand(cols, torch.float32, 5)).to(dtype)
        outs, hs = [_poisoned(x) for x in xs], [_poisoned(x) for x in xs]
        extra = [dict(cols=cols, residual=res.data_ptr(), residual_out=h.data_ptr(), weight=w.data_ptr(), eps=eps)
                 for h in hs]
        ranks.fork()
        ranks.launch("rms_norm", xs, outs, rows=rows, extra=extra)
        ranks.join()
        torch.cuda.synchronize()
        want_out, want_h = residual_rms_norm(_reference(xs), res, w, eps)
        for r in range(world):
            where = f"{name} {rows}x{cols} rank {r}"
            assert _same_bits(hs[r], want_h), f"{where}: residual + sum"
            assert _same_bits(outs[r], outs[0]), f"{where}: ranks differ"
            torch.testing.assert_close(outs[r], want_out, rtol=2 * torch.finfo(dtype).eps,
                                       atol=2 * torch.finfo(dtype).eps, msg=lambda m: f"{where}: {m}")


def test_cuda_graph_replays_with_eager_calls_between():
    world = 2
    ranks = Ranks(world)
    cases = [(8192, torch.float16, "one_shot"), (16 * 8192, torch.bfloat16, "one_shot"), (7, torch.float16, "two_shot"),
             (64 * 8192, torch.float16, "two_shot"), (3 * 5, torch.float16, "one_shot")]
    xs = [[torch.zeros(n, dtype=d, device="cuda") for _ in range(world)] for n, d, _ in cases]
    outs = [[torch.zeros_like(x) for x in per] for per in xs]
    for per, out, (_, _, algo) in zip(xs, outs, cases):  # warm-up: loads the kernels
        ranks.fork()
        ranks.launch(algo, per, out)
        ranks.join()
    torch.cuda.synchronize()
    graphs = []
    for r in range(world):  # one graph per emulated rank, captured on its own stream
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=ranks.streams[r]):
            for per, out, (_, _, algo) in zip(xs, outs, cases):
                launcher, blocks = ranks.kernel(algo, {v: k for k, v in DTYPES.items()}[per[0].dtype])
                args, argv = blocks[r]
                args.in_, args.out, args.numel, args.rows = per[r].data_ptr(), out[r].data_ptr(), per[r].numel(), 1
                args.active_blocks = launcher.config.active_blocks(per[r].numel())
                launcher.launch(argv, ranks.streams[r].cuda_stream)
        graphs.append(g)
    for step in range(40):
        for i, per in enumerate(xs):
            for r, x in enumerate(per):
                x.copy_(_rand(x.shape, x.dtype, 10**6 * r + 1000 * step + i))
        if step % 3 == 0:  # made before the fork, so that the ranks' streams see them written
            eager = [_rand(8 * 8192 + 3, torch.float16, 77 * step + r) for r in range(world)]
            eager_out = [_poisoned(x) for x in eager]
        ranks.fork()
        for r, g in enumerate(graphs):
            with torch.cuda.stream(ranks.streams[r]):
                g.replay()
        if step % 3 == 0:  # eager calls between replays advance the same counters
            ranks.launch("two_shot" if step % 2 else "one_shot", eager, eager_out)
        ranks.join()
        torch.cuda.synchronize()
        for per, out, (n, d, algo) in zip(xs, outs, cases):
            want = _reference(per)
            for r in range(world):
                assert _same_bits(out[r], want), f"replay {step}: {n} {d} {algo} rank {r}"
        if step % 3 == 0:
            want = _reference(eager)
            assert all(_same_bits(o, want) for o in eager_out), f"eager after replay {step}"
