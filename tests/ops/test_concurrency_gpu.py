"""Concurrency on the GPU.

- Threads, each on its own CUDA stream, calling ``matmul`` (int4 and int8 weights, M buckets 1 to
  256: gemv, split-K and tile kernels, each stream with its own workspace) and ``moe`` (grouped
  and per-expert token counts) on shared weights, starting together on a cold selection: every
  result is bit-identical to the serial one, which matches the float32 reference.
- Processes starting cold against one empty kernel cache, in the ``block`` and ``async`` JIT
  modes, with real nvcc builds (tests/ops/cold_start_worker.py): each kernel is compiled once
  (counted by an nvcc wrapper), every entry is complete and verified, every process gets the
  reference's result, and those running the same kernel get the same bits.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import mixed_gemm as mg
from tolerance import assert_elementwise
from weights import random_weight, seed_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[2]

MS = (1, 16, 64, 256)
TOKENS = (1, 8, 64, 256)  # grouped kernels at the small counts, the per-expert path at the large one
THREADS, ROUNDS = 4, 6


def _matmul_tasks():
    """(name, call, reference) per weight and M: x fresh, weights shared by every thread."""
    n, k, g = 1024, 2048, 128
    tasks = []
    for fmt, bits in (("awq", 4), ("gptq_v2", 8)):
        (q, s, z), packed = random_weight(n, k, fmt=fmt, bits=bits, symmetric=False, group_size=g, device="cuda",
                                          seed=seed_of("threads", fmt))
        w = mg.prepack(*packed, format=fmt, bits=bits, group_size=g)
        for m in MS:
            x = torch.randn(m, k, device="cuda").half()
            ref = mg.reference.matmul(x, q, s, z, group_size=g, bits=bits)
            tasks.append((f"matmul {fmt} M={m}", lambda x=x, w=w: mg.matmul(x, w), ref, k, 1))
    return tasks


def _moe_tasks(e=8, h=512, inter=256, top_k=2, group=128):
    gen = torch.Generator().manual_seed(seed_of("threads", "moe"))
    stacks, dense = [], []
    for stack, (n, k) in enumerate(((2 * inter, h), (h, inter))):
        q = torch.randint(0, 16, (e, n, k), generator=gen, dtype=torch.uint8)
        s = ((torch.rand(e, n, k // group, generator=gen) + 0.5) * (2.0 / (16 * k**0.5))).half()
        z = torch.randint(0, 16, (e, n, k // group), generator=gen).half()
        stacks.append(mg.prepack_experts(q.cuda(), s.cuda(), z.cuda(), group_size=group, dtype=torch.float16,
                                         gate_up=stack == 0))
        dense.append(torch.stack([mg.reference.dequantize(q[i], s[i], z[i], group_size=group, bits=4)
                                  for i in range(e)]).cuda())
    tasks = []
    for t in TOKENS:
        x = torch.randn(t, h, generator=gen).half().cuda()
        weights, ids = torch.rand(t, e, generator=gen).softmax(-1).topk(top_k, dim=1)
        weights, ids = weights.cuda(), ids.cuda()
        ref = mg.reference.moe(x.float(), dense[0], dense[1], weights, ids)
        tasks.append((f"moe T={t}", lambda x=x, w=weights, i=ids: mg.moe(x, stacks[0], stacks[1], w, i), ref, inter,
                      3))
    return tasks


def test_threads_on_their_own_streams_match_the_serial_results():
    tasks = _matmul_tasks() + _moe_tasks()
    serial = {}
    for name, call, ref, k, chained in tasks:
        serial[name] = call()
        torch.cuda.synchronize()
        assert_elementwise(serial[name], ref, k, chained=chained)
    mg.select.clear_selection()  # the threads choose (and find loaded kernels) at the same time
    torch.cuda.synchronize()  # inputs are ready before any other stream reads them
    barrier = threading.Barrier(THREADS)
    results: list[list] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            order = list(range(len(tasks)))
            random.Random(i).shuffle(order)  # a different interleaving per thread
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                barrier.wait(timeout=60)
                for _ in range(ROUNDS):
                    for j in order:
                        results[i].append((tasks[j][0], tasks[j][1]()))
            stream.synchronize()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    torch.cuda.synchronize()
    assert not errors, errors
    assert all(len(r) == ROUNDS * len(tasks) for r in results)
    for per_thread in results:
        for name, y in per_thread:
            assert torch.equal(y, serial[name]), name


# --- cold processes, one cache, real nvcc ---------------------------------------------------------


def _nvcc_wrapper(tmp_path: Path, log: Path) -> Path:
    """A CUDA_HOME whose nvcc logs the source of every device compile (one per kernel build, a
    fatbin or a kernel library's device pass) and holds it a second, so racing processes overlap,
    then runs the real nvcc."""
    from mixed_gemm.compile import find_nvcc

    real = find_nvcc()
    wrapper = tmp_path / "cuda" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--fatbin*)\n'
        '  for last; do :; done\n'
        f'  echo "$(basename "$last") $$" >> "{log}"; sleep 1;;\n'
        "esac\n"
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper.parent.parent


def _entries_verified(cache_dir: Path) -> list[str]:
    """Names of the cache's entries, each holding exactly its source, binary and meta.json, the
    binary's size and sha256 those meta.json records (nothing partial, no leftovers)."""
    names = []
    for entry in sorted(p for p in cache_dir.iterdir() if p.is_dir() and p.name != "profiles"):
        meta = json.loads((entry / "meta.json").read_text())
        name = meta["name"]
        binary = next(p for p in entry.iterdir() if p.name in (f"{name}.fatbin", f"{name}.so"))
        assert {p.name for p in entry.iterdir()} == {f"{name}.cu", binary.name, "meta.json"}, entry
        data = binary.read_bytes()
        assert meta["size"] == len(data) and meta["sha256"] == hashlib.sha256(data).hexdigest(), entry
        names.append(name)
    return names


@pytest.mark.nvcc
@pytest.mark.parametrize("mode", ["block", "async"])
def test_cold_processes_share_one_cache(mode, tmp_path):
    procs_n = 4
    log, ready, go = tmp_path / "nvcc.log", tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    log.touch()
    cache_dir = tmp_path / "cache"
    env = dict(os.environ, CUDA_HOME=str(_nvcc_wrapper(tmp_path, log)), MIXED_GEMM_CACHE_DIR=str(cache_dir),
               MIXED_GEMM_JIT=mode, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("CUDA_PATH", None)
    outs = [tmp_path / f"out{i}.pt" for i in range(procs_n)]
    logs = [tmp_path / f"worker{i}.log" for i in range(procs_n)]
    worker = Path(__file__).with_name("cold_start_worker.py")
    procs = []
    for out, path in zip(outs, logs):
        with open(path, "w") as f:  # a file, not a pipe: nothing blocks on output nobody reads yet
            procs.append(subprocess.Popen([sys.executable, str(worker), str(ready), str(go), str(out)], env=env,
                                          stdout=f, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + 300
        while len(list(ready.iterdir())) < procs_n:
            assert all(p.poll() is None for p in procs), [path.read_text()[-3000:] for path in logs]
            assert time.monotonic() < deadline, "workers never got ready"
            time.sleep(0.05)
        go.touch()
        for p, path in zip(procs, logs):
            p.wait(timeout=1200)
            assert p.returncode == 0, path.read_text()[-6000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    builds = collections.Counter(line.split()[0] for line in log.read_text().splitlines())
    assert builds and set(builds.values()) == {1}, builds  # each kernel compiled once, by one process
    names = _entries_verified(cache_dir)
    assert sorted(f"{n}.cu" for n in names) == sorted(builds)  # an entry per build, nothing else
    results = [torch.load(out) for out in outs]
    schedules = {r["schedule"] for r in results}
    assert len(schedules) == 1, schedules  # one choice for one problem
    for r in results[1:]:  # the same kernel gives the same bits, in every process
        assert torch.equal(r["second"], results[0]["second"])
    if mode == "block":  # the chosen kernel from the first call on
        assert all(r["running_first"] == r["schedule"] and torch.equal(r["first"], r["second"]) for r in results)
