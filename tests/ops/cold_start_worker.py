"""One process of tests/ops/test_concurrency_gpu.py's cold start: a fixed int4 weight, one matmul
at M=1 as soon as the go file appears (racing the other processes for the same kernels in an
empty cache), then, after every background build has finished, the same call again. Installed
kernel packages are ignored: the kernels must come from the cache or nvcc.

    python cold_start_worker.py READY_DIR GO_FILE OUT_FILE

Checks both results against the float32 reference and saves them (and the kernels that ran)
to OUT_FILE for the test to compare across processes."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/tolerance.py
import mixed_gemm as mg  # noqa: E402
from mixed_gemm.compile import packages  # noqa: E402
from tolerance import assert_elementwise  # noqa: E402

N, K, GROUP = 512, 1024, 128


def main(ready: Path, go: Path, out: Path) -> int:
    packages.find = lambda *args, **kwargs: None  # noqa: E731 - this test is about the cache
    gen = torch.Generator().manual_seed(20261124)
    q = torch.randint(0, 16, (N, K), generator=gen, dtype=torch.uint8)
    s = ((torch.rand(N, K // GROUP, generator=gen) + 0.5) * (2.0 / (16 * K**0.5))).half()
    z = torch.randint(0, 16, (N, K // GROUP), generator=gen).half()
    x = torch.randn(1, K, generator=gen).half().cuda()
    q, s, z = q.cuda(), s.cuda(), z.cuda()
    w = mg.prepack(q, s, z, format="plain", bits=4, group_size=GROUP)
    ref = mg.reference.matmul(x, q, s, z, group_size=GROUP, bits=4)
    torch.cuda.synchronize()
    (ready / str(os.getpid())).touch()
    deadline = time.monotonic() + 300
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.002)
    first = mg.matmul(x, w)  # async: a stand-in while the chosen kernel compiles in the background
    running_first = mg.explain(x, w).running
    torch.cuda.synchronize()
    assert_elementwise(first, ref, K)
    failed = mg.wait_for_builds(timeout=900)
    assert not failed and not mg.pending_builds(), (failed, mg.pending_builds())
    second = mg.matmul(x, w)  # the chosen kernel now
    choice = mg.explain(x, w)
    torch.cuda.synchronize()
    assert_elementwise(second, ref, K)
    assert choice.running == choice.schedule, choice
    torch.save({"first": first.cpu(), "second": second.cpu(), "running_first": running_first,
                "schedule": choice.schedule}, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*(Path(a) for a in sys.argv[1:4])))
