"""A copy of a profile whose grouped gate|up entries on moe_sm90s's 256-row int4 tiles name the same
schedule with the gather (``_g``: x's routed rows read by index in the producer, no gather pass),
for an A/B of the layer against the profile as shipped (``bench/device/run.sh moe-gather-profile
moe-ab``). ``--prefill SCHEDULE`` also puts that moe_sm90s gate|up schedule where the profile names
another family from ``--prefill-from`` tokens on (moe_sm90a at 4096 tokens in the H100 profile).

    python bench/moe_gather_profile.py --out /tmp/h100.json [--profile profiles/h100.json]
        [--prefill w13_t256x128x64_s0_g_p --prefill-from 4096]

Prints each entry it changed. No GPU needed.
"""
from __future__ import annotations

import argparse
import json

from mixed_gemm.kernels.moe_sm90s import MoeSm90sConfig
from mixed_gemm.kernels.moe_sm90s.catalog import default_catalog


def gathered(schedule: str, dtype: str):
    """``schedule`` (``family:schedule``) with the gather, or None where the catalog has no such kernel."""
    family, _, name = schedule.partition(":")
    if family != "moe_sm90s":
        return None
    config = MoeSm90sConfig.from_schedule(name, dtype=dtype)
    if config.stage != "w13" or config.gather or config.half_issue:
        return None
    with_gather = config.replace(gather=True)
    return f"moe_sm90s:{with_gather.schedule}" if with_gather.kernel in default_catalog() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="profiles/h100.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill", default="", help="a moe_sm90s gate|up schedule for the prefill entries")
    ap.add_argument("--prefill-from", type=int, default=4096, help="tokens from which --prefill applies")
    a = ap.parse_args()
    if a.prefill:
        MoeSm90sConfig.from_schedule(a.prefill)  # a bad spelling fails here, not on the GPU
    data = json.load(open(a.profile))
    for entry in data.get("grouped", []):
        if entry["stage"] != "w13" or entry["bits"] != 4:
            continue
        new = gathered(entry["schedule"], entry["dtype"])
        if new is None and a.prefill and entry["tokens"] >= a.prefill_from:
            new = f"moe_sm90s:{a.prefill}"
        if new and new != entry["schedule"]:
            print(f"{entry['dtype']} E={entry['experts']} top-{entry['top_k']} N={entry['n']} K={entry['k']} "
                  f"tokens={entry['tokens']}: {entry['schedule']} -> {new}")
            entry["schedule"] = new
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
