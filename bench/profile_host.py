"""Where an eager decode step's host time goes: cProfile of one forward (batch x 1 token, no
cache) of the e2e Llama-3-8B-shaped model, fp16 and mixed_gemm int4 (fused, residual epilogues),
top functions by own time.

    python bench/profile_host.py [--layers 8] [--batch 1] [--top 25]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mixed_gemm.integrations import e2e  # noqa: E402


@torch.no_grad()
def profile(model, batch: int, top: int, calls: int = 20) -> str:
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    for _ in range(3):
        model(ids, use_cache=False)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        model(ids, use_cache=False)
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    total = sum(v[2] for v in stats.stats.values()) / calls * 1e3
    return f"{total:.2f} ms of Python per forward (profiled)\n" + out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    fp16, int4 = e2e.build_models("llama3-8b", a.layers, lm_head="int4")
    for name, model in (("fp16", fp16), ("int4", int4)):
        print(f"== {name}")
        text = profile(model, a.batch, a.top)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        print("\n".join(lines[:a.top + 12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
