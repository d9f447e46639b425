"""A copy of a profile whose grouped moe_sm90s entries name the same schedule fused: gate|up with the
gather (``--gather``, ``_g``: x's routed rows read by index in the producer, no gather pass; the
256-row int4 tiles) and down with the combine (``--combine``, ``_f``: the top-k sum added into fp32
rows in the epilogue, no stored rows and no combine pass), for an A/B of the layer against the
profile as shipped (``bench/device/run.sh moe-fused-profile moe-ab``). ``--prefill SCHEDULE``
(and ``--prefill-down SCHEDULE``) also put that moe_sm90s gate|up (down) schedule where the profile
names another family from ``--prefill-from`` tokens on (moe_sm90a at 4096 tokens in the H100 profile).

    python bench/moe_fused_profile.py --out /tmp/h100.json [--profile profiles/h100.json] [--gather]
        [--combine] [--prefill w13_t256x128x64_s0_g_p] [--prefill-down w2_t256x128x64_s0_p_f]
        [--prefill-from 4096]

Prints each entry it changed. No GPU needed.
"""
from __future__ import annotations

import argparse
import json

from mixed_gemm.kernels.moe_sm90s import MoeSm90sConfig
from mixed_gemm.kernels.moe_sm90s.catalog import default_catalog


def fused(schedule: str, dtype: str, gather: bool, combine: bool):
    """``schedule`` (``family:schedule``) fused as asked for its stage, or None where it is not a
    moe_sm90s schedule, is fused already, or the catalog has no such kernel."""
    family, _, name = schedule.partition(":")
    if family != "moe_sm90s":
        return None
    config = MoeSm90sConfig.from_schedule(name, dtype=dtype)
    if config.stage == "w13" and gather and not (config.gather or config.half_issue):
        config = config.replace(gather=True)
    elif config.stage == "w2" and combine and not config.combine:
        config = config.replace(combine=True)
    else:
        return None
    return f"moe_sm90s:{config.schedule}" if config.kernel in default_catalog() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="profiles/h100.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gather", action="store_true", help="gate|up entries with the gather (_g)")
    ap.add_argument("--combine", action="store_true", help="down entries with the combine (_f)")
    ap.add_argument("--prefill", default="", help="a moe_sm90s gate|up schedule for the prefill entries")
    ap.add_argument("--prefill-down", default="", help="a moe_sm90s down schedule for the prefill entries")
    ap.add_argument("--prefill-from", type=int, default=4096, help="tokens from which --prefill applies")
    a = ap.parse_args()
    prefill = {"w13": a.prefill, "w2": a.prefill_down}
    for stage, schedule in prefill.items():
        if schedule and MoeSm90sConfig.from_schedule(schedule).stage != stage:  # a bad spelling fails here too
            raise SystemExit(f"--prefill{'-down' if stage == 'w2' else ''}: {schedule!r} is not a {stage} schedule")
    data = json.load(open(a.profile))
    for entry in data.get("grouped", []):
        if entry["bits"] != 4:
            continue
        new = fused(entry["schedule"], entry["dtype"], a.gather, a.combine)
        if new is None and prefill[entry["stage"]] and entry["tokens"] >= a.prefill_from:
            new = f"moe_sm90s:{prefill[entry['stage']]}"
        if new and new != entry["schedule"]:
            print(f"{entry['dtype']} E={entry['experts']} top-{entry['top_k']} N={entry['n']} K={entry['k']} "
                  f"tokens={entry['tokens']}: {entry['schedule']} -> {new}")
            entry["schedule"] = new
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
