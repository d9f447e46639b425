"""Session 23: time the catalog's new gemv shapes against the shipped winner of each profile entry,
in the same process, and merge the faster into a copy of the shipped profile.

  python bench/session23_prof.py OUT.json CASE [CASE ...]   CASE = dtype:bits:group:ms:substr|substr

Each (shape, M) sweeps the family candidates whose schedule contains one of the substrings, plus
the entry's shipped winner; the profile entry becomes the faster of them (both measured here, so
the host's run-to-run drift does not decide). Stops taking new sweeps after BUDGET_S seconds.
"""
import os
import sys
import time

import torch

from mixed_gemm.kernels import Problem, layout_for
from mixed_gemm.profiler.candidates import candidate_schedules
from mixed_gemm.profiler.problems import MODELS
from mixed_gemm.profiler.sweep import SweepSpec, run_sweep
from mixed_gemm.select.profiles import Profile, entry_key

out = sys.argv[1]
budget = float(os.environ.get("BUDGET_S", "300"))
shapes = [(f"{model}/{name}", n, k) for model in ("llama3-8b", "llama3-70b") for name, n, k in MODELS[model]]
only = os.environ.get("SHAPES")
if only:
    shapes = [s for s in shapes if s[0] in only.split(",")]
dev = torch.cuda.current_device()
sms = torch.cuda.get_device_properties(dev).multi_processor_count
t0 = time.time()
for case in sys.argv[2:]:
    dtype, bits, group, ms, subs = case.split(":")
    bits, group, subs = int(bits), int(group), subs.split("|")
    layout = layout_for(dev, bits)
    for label, n, k in shapes:
        for m in map(int, ms.split(",")):
            if time.time() - t0 > budget:
                print(f"budget {budget:.0f} s spent: stopping before {dtype} u{bits} {label} M={m}", flush=True)
                sys.exit(0)
            problem = Problem(m=m, n=n, k=k, dtype=dtype, bits=bits, zero_mode="int", group_size=group, layout=layout)
            new = [s for s in candidate_schedules(problem, sms, dev) if any(sub in s for sub in subs)]
            if not new:
                continue
            key = dict(dtype=dtype, bits=bits, zero_mode="int", group_size=group, n=n, k=k)
            old = Profile.load(out, with_base=False).entry(entry_key(dict(key, m=m)), m)
            schedules = new + ([old["schedule"]] if old and old["schedule"] not in new else [])
            run_sweep(SweepSpec(problems=[(label, n, k)], ms=[m], dtype=dtype, bits=bits, group_size=group,
                                schedules=schedules, out=out, merge=True, progress=False, log=lambda s: None))
            won = Profile.load(out, with_base=False).entry(entry_key(dict(key, m=m)), m)
            was = f"{old['schedule']} {old['us']}" if old else "none"
            print(f"{dtype} u{bits} g{group} {label} M={m}: {won['schedule']} {won['us']} (was {was}; "
                  f"{len(new)} new)", flush=True)
