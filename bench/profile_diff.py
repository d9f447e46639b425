"""Entries of profile B (a merged sweep) that differ from profile A (the shipped one): one line each,
old schedule and µs -> new. ``python bench/profile_diff.py A.json B.json``"""
import json
import sys


def entries(path):
    return {(e["dtype"], e["bits"], e["zero_mode"], e["group_size"], e["n"], e["k"], e["m"]): e
            for e in json.load(open(path))["entries"]}


old, new = entries(sys.argv[1]), entries(sys.argv[2])
for key in sorted(new, key=str):
    a, b = old.get(key), new[key]
    if a is None or a["schedule"] != b["schedule"]:
        was = f"{a['schedule']} {a['us']:.1f}" if a else "-"
        print(f"{key[0]} u{key[1]} {key[4]}x{key[5]} M={key[6]}: {was} -> {b['schedule']} {b['us']:.1f} µs")
