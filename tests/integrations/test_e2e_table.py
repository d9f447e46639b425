"""The `mixed-gemm e2e` table on a made-up result: every row has the header's number of cells,
with and without the tinygemm peer, compiled or not; the command prints it once, with its head."""
from __future__ import annotations

import pytest

from mixed_gemm.integrations import e2e


def fake_result(names, compiled, decode_only=True, unfused=False):
    rows = []
    for b in (1, 16):
        row = {"batch": b}
        if unfused:
            row.update({f"{e2e.UNFUSED}_eager_tps": 150.0, f"{e2e.UNFUSED}_eager_ratio": 1.5})
        for i, name in enumerate(names):
            row[f"{name}_decode_ms"] = 1.0 / (i + 1)
            row[f"{name}_eager_tps"] = 100.0 * (i + 1)
            if compiled:
                row[f"{name}_compiled_tps"] = 200.0 * (i + 1)
                if decode_only:
                    row[f"{name}_compiled_decode_tps"] = 300.0 * (i + 1)
                    row[f"{name}_compiled_step_ms"] = 0.5 / (i + 1)
            if name != "fp16":
                prefix = "" if name == "mixed_gemm" else f"{name}_"
                row[f"{prefix}decode_speedup"] = float(i + 1)
                row[f"{prefix}eager_ratio"] = float(i + 1)
                if compiled:
                    row[f"{prefix}compiled_ratio"] = float(i + 1)
                    if decode_only:
                        row[f"{prefix}decode_ratio"] = float(i + 1)
                        row[f"{prefix}compiled_step_speedup"] = float(i + 1)
        rows.append(row)
    per = {n: float(i + 1) * 2**30 for i, n in enumerate(names)}
    return {"rows": rows, "weight_bytes": per, "peak_bytes": per, "ttft_ms": {n: 10.0 for n in names}}


@pytest.mark.parametrize("unfused", [True, False])  # False: --no-unfused, or a result saved before that column
@pytest.mark.parametrize("decode_only", [True, False])  # False: a result saved before these columns
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("names", [("fp16", "mixed_gemm"), ("fp16", "mixed_gemm", e2e.PEER)])
def test_rows_match_the_header(names, compiled, decode_only, unfused):
    lines = e2e.table(fake_result(names, compiled, decode_only, unfused), compiled)
    blank = lines.index("")
    main, memory = lines[:blank], lines[blank + 1:]
    widths = {line.count("|") for line in main}
    assert len(widths) == 1, main
    assert (e2e.PEER in main[0]) == (e2e.PEER in names)
    assert ("int4 unfused eager" in main[0]) == unfused and ("| 150 | 1.50x |" in main[2]) == unfused
    assert {line.count("|") for line in memory} == {len(names) + 2}
    assert "3.00x" in main[2] if e2e.PEER in names else "3.00x" not in main[2]


def test_decoding_experts_switches_grouped_mm_for_the_step_only():
    """transformers' experts with grouped_mm (host offsets, not capturable) decode with batched_mm,
    as generate does; the model's setting comes back afterwards."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3MoeConfig"):
        pytest.skip("this transformers has no Qwen3-MoE")
    cfg = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                                      num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, head_dim=16)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    if not hasattr(model, "set_experts_implementation"):
        pytest.skip("this transformers has no experts interface")
    model.set_experts_implementation({k: "grouped_mm" for k in model.get_experts_implementation()})
    with e2e.decoding_experts(model):
        assert set(model.get_experts_implementation().values()) == {"batched_mm"}
    assert set(model.get_experts_implementation().values()) == {"grouped_mm"}
    with e2e.decoding_experts(object()):  # no experts interface: nothing to switch
        pass


def test_the_command_prints_the_table_once_with_its_head(monkeypatch, capsys, tmp_path):
    """``mixed-gemm e2e`` on made-up measurements (no GPU, no model): the title, then the table's
    head once, then each batch's row once (streamed as measured), then the memory table; ``--out``
    holds the same table."""
    import types

    import torch

    from mixed_gemm import cli
    from mixed_gemm.profiler import timing

    class Model:
        config = types.SimpleNamespace(num_hidden_layers=2)

    models = (Model(), Model())
    unfused = Model()
    times = {id(models[0]): 2.0, id(models[1]): 1.0, id(unfused): 1.25}
    monkeypatch.setattr(timing, "gpu_missing", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2**30)
    monkeypatch.setattr(e2e, "build_models", lambda *a, **k: models)
    monkeypatch.setattr(e2e, "build_unfused", lambda *a, **k: unfused)
    monkeypatch.setattr(e2e, "weight_bytes", lambda m: 2**30 * times[id(m)])
    monkeypatch.setattr(e2e, "decode_step_ms", lambda m, b: times[id(m)])
    monkeypatch.setattr(e2e, "compiled_step_ms", lambda m, b: times[id(m)] / 2)
    monkeypatch.setattr(e2e, "generate_s", lambda m, b, compiled, new_tokens=e2e.NEW_TOKENS: times[id(m)] * new_tokens)
    monkeypatch.setattr(e2e, "ttft_ms", lambda m: 10 * times[id(m)])
    out = tmp_path / "e2e.md"
    assert cli.main(["e2e", "--layers", "2", "--batches", "1,16", "--reps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    head = [line for line in printed if line.startswith("| batch |")]
    rows = [line for line in printed if line.startswith(("| 1 |", "| 16 |"))]
    assert len(head) == 1 and len(rows) == 2, "\n".join(printed)
    assert printed.index(head[0]) < printed.index(rows[0]) < printed.index(rows[1])
    assert sum(line.startswith("# llama3-8b (2 layers") for line in printed) == 1
    assert sum(line.startswith("| weights + buffers |") for line in printed) == 1
    assert "| 1 | 2.00 | 1.00 | 2.00x |" in rows[0]
    # eager tok/s: fp16 1/2, fused 1/1 (2.00x), unfused 1/1.25 (1.60x), 48 tokens per 48 s of a token each
    assert "| 0 | 1 | 2.00x | 1 | 1.60x |" in rows[0] and "int4 fused eager tok/s" in head[0], rows[0]
    written = out.read_text().splitlines()
    assert written[0] == next(line for line in printed if line.startswith("# ")) and written[1] == ""
    assert written[2:5] == [head[0], printed[printed.index(head[0]) + 1], rows[0]]
    assert [line for line in written if line.startswith("| weights")] == \
        [line for line in printed if line.startswith("| weights")]


def test_router_and_norm_flags_reach_the_int4_model_and_the_title(monkeypatch):
    """``--no-router`` keeps transformers' routers (``build_models(routers=False)``), ``--no-norms``
    its RMSNorms; the title names the one-launch routers only for a mixture-of-experts preset that
    gets them."""
    import argparse

    from mixed_gemm import cli
    from mixed_gemm.cli.e2e import _fused
    from mixed_gemm.profiler import timing

    seen = {}

    def stop(*a, **k):
        seen.update(k)
        raise RuntimeError("stop after the build")

    import torch

    monkeypatch.setattr(timing, "gpu_missing", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(e2e, "build_models", stop)
    with pytest.raises(RuntimeError, match="stop after the build"):
        cli.main(["e2e", "--layers", "2", "--batches", "1", "--no-router"])
    assert seen["routers"] is False and seen["norms"] is True
    with pytest.raises(RuntimeError, match="stop after the build"):
        cli.main(["e2e", "--layers", "2", "--batches", "1", "--no-norms"])
    assert seen["routers"] is True and seen["norms"] is False

    def args(**kw):
        return argparse.Namespace(**dict(dict(no_fuse=False, no_residual=False, no_router=False, no_norms=False),
                                         **kw))

    both = "q|k|v, gate|up fused, residual epilogues"
    assert _fused(args(), "qwen3-30b-a3b") == f" ({both}, one-launch routers, one-launch norms)"
    assert _fused(args(no_router=True), "qwen3-30b-a3b") == f" ({both}, one-launch norms)"
    assert _fused(args(no_norms=True), "qwen3-30b-a3b") == f" ({both}, one-launch routers)"
    assert _fused(args(), "llama3-8b") == f" ({both}, one-launch norms)"
    assert _fused(args(no_fuse=True), "qwen3-30b-a3b") == ""
