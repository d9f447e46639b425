"""Where a compiled ``generate`` token's host time goes, per model (issue #25: compiled generate at
batch 1 is host-bound): per later token wall time, and cProfile of one static-cache generate after
warm-up (graphs recorded), top functions by own time.

    python bench/diag_host_generate.py [--layers 8] [--batch 1] [--out DIR]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

from mixed_gemm.integrations import e2e


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    torch._dynamo.config.recompile_limit = 64
    fp16, int4 = e2e.build_models("llama3-8b", a.layers, lm_head="int4")
    models = {"fp16": fp16, "int4": int4, "peer": e2e.build_peer(fp16)}
    for name, model in models.items():
        for _ in range(2):
            e2e.generate_s(model, a.batch, True)
        per = []
        for _ in range(3):
            full = e2e.generate_s(model, a.batch, True)
            first = e2e.generate_s(model, a.batch, True, new_tokens=1)
            per.append((full - first) / (e2e.NEW_TOKENS - 1) * 1e3)
        step = e2e.compiled_step_ms(model, a.batch)
        prof = cProfile.Profile()
        prof.enable()
        e2e.generate_s(model, a.batch, True)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        with open(f"{a.out}/host-{name}.txt", "w") as f:
            f.write(s.getvalue())
        tot = pstats.Stats(prof).total_tt
        print(f"{name}: per later token {sorted(per)[1]:.3f} ms (median of 3), compiled step {step:.3f} ms, "
              f"cProfile total {tot * 1e3:.1f} ms per generate of {e2e.NEW_TOKENS}", flush=True)


if __name__ == "__main__":
    main()
