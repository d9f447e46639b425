"""profile-moe --against-profile (moe_sweep.run) on the CPU: the "current" plan it times is what
selection runs, so a profile naming a base (an H200 profile over the H100's) is read with the base
underneath, while the winners merge into the file's own entries only."""
import json
import types

import torch

from mixed_gemm.profiler import moe_sweep

GPU = {"name": "NVIDIA H200", "compute_capability": "9.0", "sms": 132}


def _entry(dtype, schedule, tokens=1):
    return dict(dtype=dtype, bits=4, zero_mode="int", group_size=128, experts=64, top_k=6, n=2048, k=1408,
                stage="w2", tokens=tokens, schedule=schedule, us=9.0)


def test_current_reads_the_base_and_winners_stay_own(tmp_path, monkeypatch):
    base = {"format": 2, "gpu": GPU, "versions": {}, "entries": [],
            "grouped": [_entry("f16", "moe_gemv:w2_s2_w4x2_u8_ds_split2")]}
    own = {"format": 2, "gpu": GPU, "versions": {}, "base": "h100.json", "entries": [],
           "grouped": [_entry("bf16", "moe_gemv:w2_s1_w1x16_u8_ds_sw")]}
    (tmp_path / "h100.json").write_text(json.dumps(base))
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(own))
    seen = {}

    def fake_sweep(models, tokens, dtype, replays, families=None, current=None, bits=4, jobs=None):
        problem = moe_sweep.MoeProblem(tokens=1, top_k=6, experts=64, n=2048, k=1408, dtype="f16", bits=4,
                                       zero_mode="int", group_size=128, layout="sm90a", stage="w2")
        seen["f16"] = current.lookup_grouped(problem)
        return [_entry("f16", "moe_gemv:w2_s1_w1x16_u16_ds_sw", tokens=2)]

    monkeypatch.setattr(moe_sweep, "sweep", fake_sweep)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132))
    moe_sweep.run(["deepseek-v2-lite"], [1], torch.float16, out=path, against_profile=True)
    assert seen["f16"] == (1, "moe_gemv:w2_s2_w4x2_u8_ds_split2")  # the base's f16 entry, not the own bf16 one
    saved = json.loads(path.read_text())
    assert saved["base"] == "h100.json"
    assert [e["dtype"] for e in saved["grouped"]] == ["bf16", "f16"]  # own entries plus the winner, no base copy
