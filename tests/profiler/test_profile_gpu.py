"""`mixed-gemm profile` end to end on a small sweep (GPU): writes a profile selection reads,
a CSV, resumes from a partial file, merges into an existing profile."""
import csv
import json
import math

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import FAMILIES
from mixed_gemm.cli import main
from mixed_gemm.profiler.workload import random_weights
from mixed_gemm.select import PROFILE_ENV, Profile, profiles

pytestmark = pytest.mark.gpu

SCHEDULES = "t16x64x128_w1x1x4_s4,t16x64x128_w1x1x4_s4_kfused2,t64x128x64_w2x2x1_s4,dequant_mm"


def test_profile_sweep_resume_merge_and_select(tmp_path, monkeypatch, capsys):
    out = tmp_path / "gpu.json"
    old = Profile({"name": "x"}, {}, [dict(dtype="f16", bits=4, zero_mode="int", group_size=128, n=512, k=512, m=1,
                                           schedule="t16x64x128_w1x1x4_s4", us=1.0)])
    old.save(out)
    # A partial sweep left by an interrupted run: one measurement, plus a line cut in half.
    partial = tmp_path / "gpu.partial.jsonl"
    row = dict(dtype="f16", bits=4, zero_mode="int", group_size=128, n=1024, k=2048, m=1, label="1024x2048",
               schedule="sm80:t64x128x64_w2x2x1_s4", us=1e6, status="success", disposition="not_verified")
    partial.write_text(json.dumps(row) + "\n" + '{"dtype": "f1')
    rc = main(["profile", "--shapes", "1024:2048", "--ms", "1,200", "--schedules", SCHEDULES,
               "--out", str(out), "--replays", "3", "--quiet"])
    assert rc == 0
    assert "resuming: 1 measurements" in capsys.readouterr().out
    assert not partial.exists()
    prof = Profile.load(out)
    assert prof.gpu["name"] == torch.cuda.get_device_name() and prof.gpu["compute_capability"]
    assert set(prof.versions) == {"driver", "nvcc", "cutlass", "torch", "mixed_gemm"}
    key = ("f16", 4, "int", 128, 1024, 2048)
    assert prof.has(key, 1) and prof.has(key, 200) and prof.has(("f16", 4, "int", 128, 512, 512), 1)  # merged
    assert prof.lookup(key, 1)[1] != "sm80:t64x128x64_w2x2x1_s4"  # the resumed row's 1 s never wins
    with open(out.with_suffix(".csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and {r["schedule"] for r in rows} == {
        "sm80:t16x64x128_w1x1x4_s4", "sm80:t16x64x128_w1x1x4_s4_kfused2", "sm80:t64x128x64_w2x2x1_s4",
        "dequant_mm:dequant_mm"}
    resumed = [r for r in rows if r["m"] == "1" and r["schedule"] == "sm80:t64x128x64_w2x2x1_s4"]
    assert resumed[0]["Runtime"] == f"{1e6 / 1e3:.6f}"  # taken from the partial file, not re-measured
    for m in ("1", "200"):  # per M, the fastest timed schedule is verified and wins; no other is verified
        timed = sorted((r for r in rows if r["m"] == m and r["Runtime"]), key=lambda r: float(r["Runtime"]))
        assert [r["Disposition"] for r in timed][0] == "passed"
        assert all(r["Disposition"] == "not_verified" for r in timed[1:])
        assert prof.lookup(key, int(m))[1] == timed[0]["schedule"]
    # Selection reads it.
    monkeypatch.setenv(PROFILE_ENV, str(out))
    profiles.clear_cache()
    mg.select.clear_selection()
    try:
        w = random_weights(1024, 2048, layout="sm80+sm90a")[0]  # the copies the sweep timed (sm80 tiles)
        mg.matmul(torch.randn(1, 2048, device="cuda").half(), w)
        chosen = mg.explain(1, w)
        assert (chosen.schedule, chosen.source) == (prof.lookup(key, 1)[1], "profile gpu.json M=1")
    finally:
        profiles.clear_cache()
        mg.select.clear_selection()
    # A targeted sweep merged with --keep-faster leaves an entry measured faster in place.
    fast = dict(prof.entry(key, 1), us=0.001, schedule="sm80:t16x64x128_w1x1x4_s4")
    prof.add(fast)
    prof.save(out)
    assert main(["profile", "--shapes", "1024:2048", "--ms", "1", "--schedules", "t64x128x64_w2x2x1_s4",
                 "--out", str(out), "--replays", "3", "--quiet", "--keep-faster", "--fresh"]) == 0
    assert Profile.load(out).entry(key, 1)["us"] == 0.001


def test_families_sweep_against_the_profile(tmp_path):
    """``--families F --against-profile``: F's candidates and the profile's entry, timed in one run;
    the fastest verified of them is the new entry (a stale, faster-looking ``us`` does not stay)."""
    out = tmp_path / "gpu.json"
    key, old = ("f16", 4, "int", 128, 1024, 2048), "sm80:t64x128x64_w2x2x1_s4"
    Profile({"name": "x"}, {}, [dict(dtype="f16", bits=4, zero_mode="int", group_size=128, n=1024, k=2048, m=200,
                                     schedule=old, us=1e-3)]).save(out)
    assert main(["profile", "--shapes", "1024:2048", "--ms", "200", "--families", "dequant_mm", "--against-profile",
                 "--out", str(out), "--replays", "3", "--quiet"]) == 0
    with open(out.with_suffix(".csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["Runtime"]]
    timed = {r["schedule"] for r in rows}
    assert old in timed and {s.split(":")[0] for s in timed} == {"dequant_mm", "sm80"}  # the sm80 copy was packed too
    fastest = min(rows, key=lambda r: float(r["Runtime"]))
    entry = Profile.load(out).entry(key, 200)
    assert entry["schedule"] == fastest["schedule"] and entry["us"] > 1e-3


def test_bench_runs_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc = main(["bench", "--shapes", "1024:1024", "--ms", "1,64", "--compare", "--plot", str(tmp_path / "p.png"),
               "--out", str(tmp_path / "t.md"), "--json", str(tmp_path / "r.json")])
    assert rc == 0
    text = (tmp_path / "t.md").read_text()
    assert "| 1024x1024 | 1024 | 1024 | 1 |" in text and "Eager host overhead" in text
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert [r["m"] for r in rows] == [1, 64]
    for r in rows:  # measured (positive, finite) times, the speedup their ratio; no time is asserted
        assert math.isfinite(r["us"]) and r["us"] > 0 and math.isfinite(r["fp16_us"]) and r["fp16_us"] > 0
        assert r["speedup"] == pytest.approx(r["fp16_us"] / r["us"], rel=1e-6)
        assert r["tflops"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / (r["us"] * 1e-6) / 1e12, rel=1e-6)
        assert r["schedule"].startswith(tuple(f"{f.name}:" for f in FAMILIES))
        assert f"| 1024x1024 | 1024 | 1024 | {r['m']} |" in text  # each measured row is in the table
