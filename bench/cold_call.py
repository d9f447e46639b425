"""The first ``matmul`` on an empty kernel cache, for a problem whose chosen kernel is an unbuilt
sm90a library (int4 g128 fp16, N = K = 4096, M = 64 on the H100), three ways: ``MIXED_GEMM_JIT=block``
(the call compiles its kernel), ``async`` (a stand-in runs, the chosen kernel compiles in the
background) and with a kernel package installed. Each scenario runs in a fresh process with an
empty cache; the table gives the first call's time and when the chosen kernel runs.

    python bench/cold_call.py [--wheel WHEEL] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, mixed_gemm as mg
n = k = 4096; m = 64
gen = torch.Generator(device="cuda").manual_seed(1)
q = torch.randint(0, 16, (n, k), device="cuda", generator=gen, dtype=torch.uint8)
s = ((torch.rand(n, k // 128, device="cuda", generator=gen) + 0.5) / 512).half()
z = torch.randint(0, 16, (n, k // 128), device="cuda", generator=gen).half()
w = mg.prepack(q, s, z, format="plain", bits=4, group_size=128)
x = torch.randn(m, k, device="cuda", generator=gen).half()
ref = x.float() @ mg.reference.dequantize(q, s, z, group_size=128).t()
err = lambda y: ((y.float() - ref).norm() / ref.norm()).item()
torch.cuda.synchronize()
t1 = time.perf_counter()
y = mg.matmul(x, w); torch.cuda.synchronize()
t2 = time.perf_counter()
choice = mg.explain(m, w)
first = dict(import_s=t1 - t0, first_call_s=t2 - t1, chosen=choice.schedule, ran=choice.running, err=err(y))
# Keep calling (a server's later requests) until the chosen kernel runs; time to the switch.
switched = None
while time.perf_counter() - t2 < 600:
    y = mg.matmul(x, w); torch.cuda.synchronize()
    if mg.explain(m, w).running == choice.schedule:
        switched = time.perf_counter() - t1
        break
    time.sleep(0.05)
first.update(switch_s=switched, err_after=err(y))
ts = []
for _ in range(20):
    a = time.perf_counter(); mg.matmul(x, w); torch.cuda.synchronize(); ts.append(time.perf_counter() - a)
first["warm_call_ms"] = sorted(ts)[10] * 1e3
print("RESULT " + json.dumps(first))
"""


def scenario(name: str, jit: str, site: str | None) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, MIXED_GEMM_JIT=jit, MIXED_GEMM_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
        if site:
            env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, cwd=ROOT)
        line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
        if proc.returncode or line is None:
            raise SystemExit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result = json.loads(line[len("RESULT "):])
        result.update(scenario=name, process_s=time.perf_counter() - start)
        return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--wheel", help="a kernel package wheel for the 'package' scenario")
    ap.add_argument("--out", help="write the table here (markdown)")
    args = ap.parse_args()
    runs = [scenario("before (JIT=block)", "block", None), scenario("after (JIT=async)", "async", None)]
    if args.wheel:
        site = tempfile.mkdtemp()
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", site,
                        args.wheel], check=True)
        runs.append(scenario("kernel package installed", "async", site))
    lines = ["| scenario | first matmul (s) | ran first | chosen kernel running after (s) | rel err first / after | warm call (ms) |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        switch = "-" if r["switch_s"] is None else f"{r['switch_s']:.1f}"
        lines.append(f"| {r['scenario']} | {r['first_call_s']:.2f} | {r['ran']} | {switch} | "
                     f"{r['err']:.1e} / {r['err_after']:.1e} | {r['warm_call_ms']:.3f} |")
    lines.append(f"\nchosen: {runs[0]['chosen']}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
