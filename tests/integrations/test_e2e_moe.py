"""`mixed-gemm e2e --model qwen3-30b-a3b` on the CPU: its default batches, the memory check that
sends the full 48 layers through the one-model-at-a-time run, and that run's output on made-up
measurements (no GPU, no model): the title, then the table's head once, each batch's row once, the
memory table, and fp16 built, measured and freed before the int4 model is built."""
from __future__ import annotations

import types

import pytest

from mixed_gemm.integrations import e2e, e2e_moe

H100_BYTES = 85_000_000_000  # torch's total_memory of an "80 GB" H100


def test_default_batches():
    assert e2e_moe.default_batches("qwen3-30b-a3b") == "1,16"
    assert e2e_moe.default_batches("llama3-8b") == "1,16,64"


def test_the_full_moe_preset_runs_one_model_at_a_time():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3MoeConfig"):
        pytest.skip("this transformers has no Qwen3-MoE")
    full, fp16 = e2e_moe.one_at_a_time("qwen3-30b-a3b", 0, H100_BYTES)
    assert full and 60e9 < fp16 < 62e9  # 48 layers of 128 experts, embeddings and head: ~61 GB
    few, fp16_16 = e2e_moe.one_at_a_time("qwen3-30b-a3b", 16, H100_BYTES)
    assert not few and fp16_16 < fp16 / 2  # both models fit: they alternate as before
    assert e2e_moe.one_at_a_time("llama3-70b", 0, H100_BYTES) == (False, 0)  # dense: never measured in turn


def test_the_in_turn_run_prints_the_table_once(monkeypatch, capsys, tmp_path):
    import torch

    from mixed_gemm import cli
    from mixed_gemm.profiler import timing

    events = []
    step = {"fp16": 2.0, "int4": 1.0}  # ms

    def build(preset, layers):
        model = types.SimpleNamespace(kind="fp16")
        events.append(("build", model.kind))
        return model

    def quantize(model, *args):
        model.kind = "int4"
        events.append(("quantize", args))
        return model

    def measured(what):
        def fn(model, *args, **kwargs):
            events.append((what, model.kind))
            return {"step": step, "gen": {"fp16": 0.5, "int4": 0.25}, "ttft": {"fp16": 40.0, "int4": 20.0}}[what][model.kind]
        return fn

    monkeypatch.setattr(timing, "gpu_missing", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(total_memory=H100_BYTES))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2**30)
    monkeypatch.setattr(e2e_moe, "fp16_bytes", lambda preset, layers: 61_000_000_000)
    monkeypatch.setattr(e2e_moe, "_free", lambda: events.append(("free", None)))
    monkeypatch.setattr(e2e, "build_fp16", build)
    monkeypatch.setattr(e2e, "quantize_in_place", quantize)
    monkeypatch.setattr(e2e, "compiled_step_ms", measured("step"))
    monkeypatch.setattr(e2e, "generate_s", lambda m, b, compiled, new_tokens=e2e.NEW_TOKENS:
                        measured("gen")(m) * new_tokens)
    monkeypatch.setattr(e2e, "ttft_ms", measured("ttft"))
    monkeypatch.setattr(e2e, "weight_bytes", lambda m: 2**30 * (57 if m.kind == "fp16" else 16))
    out = tmp_path / "e2e.md"
    assert cli.main(["e2e", "--model", "qwen3-30b-a3b", "--reps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    titles = [line for line in printed if line.startswith("# ")]
    assert len(titles) == 1 and titles[0].startswith("# qwen3-30b-a3b (48 layers")
    assert "one after another" in titles[0] and "61 GB of fp16 weights" in titles[0]
    head = [line for line in printed if line.startswith("| batch |")]
    rows = [line for line in printed if line.startswith(("| 1 |", "| 16 |"))]
    assert len(head) == 1 and len(rows) == 2, "\n".join(printed)  # the default batches: 1 and 16
    assert printed.index(head[0]) < printed.index(rows[0]) < printed.index(rows[1])
    assert len({line.count("|") for line in head + rows}) == 1
    # 2000 µs vs 1000 µs; 47 tokens in (48 - 1) x 0.5 s vs x 0.25 s; 48 in 24 s vs 12 s.
    assert rows[0] == "| 1 | 2000 | 1000 | 2.00x | 2 | 4 | 2.00x | 2 | 4 | 2.00x |"
    assert rows[1] == "| 16 | 2000 | 1000 | 2.00x | 32 | 64 | 2.00x | 32 | 64 | 2.00x |"
    assert sum(line.startswith("| weights + buffers |") for line in printed) == 1
    assert "| time to first token, 512-token prompt | 40.0 ms | 20.0 ms |" in printed
    # fp16 measured and freed before the int4 model exists; the int4 model is the same seeded build, quantized.
    kinds = [e for e in events if e[0] in ("build", "quantize", "free")]
    assert [k for k, _ in kinds] == ["build", "free", "build", "quantize", "free"]
    assert not any(e == ("step", "int4") for e in events[:events.index(("free", None))])
    written = out.read_text().splitlines()
    assert written[0] == titles[0] and written[2:3] == head and rows[0] in written


def test_in_turn_refuses_no_compiled(monkeypatch, capsys):
    import torch

    from mixed_gemm import cli
    from mixed_gemm.profiler import timing

    monkeypatch.setattr(timing, "gpu_missing", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(total_memory=H100_BYTES))
    monkeypatch.setattr(e2e_moe, "fp16_bytes", lambda preset, layers: 61_000_000_000)
    assert cli.main(["e2e", "--model", "qwen3-30b-a3b", "--no-compiled"]) == 2
    assert "measured one model at a time, compiled only" in capsys.readouterr().err
