"""The `mixed-gemm e2e` table on a made-up result: every row has the header's number of cells,
with and without the tinygemm peer, compiled or not."""
from __future__ import annotations

import pytest

from mixed_gemm.integrations import e2e


def fake_result(names, compiled, decode_only=True):
    rows = []
    for b in (1, 16):
        row = {"batch": b}
        for i, name in enumerate(names):
            row[f"{name}_decode_ms"] = 1.0 / (i + 1)
            row[f"{name}_eager_tps"] = 100.0 * (i + 1)
            if compiled:
                row[f"{name}_compiled_tps"] = 200.0 * (i + 1)
                if decode_only:
                    row[f"{name}_compiled_decode_tps"] = 300.0 * (i + 1)
            if name != "fp16":
                prefix = "" if name == "mixed_gemm" else f"{name}_"
                row[f"{prefix}decode_speedup"] = float(i + 1)
                row[f"{prefix}eager_ratio"] = float(i + 1)
                if compiled:
                    row[f"{prefix}compiled_ratio"] = float(i + 1)
                    if decode_only:
                        row[f"{prefix}decode_ratio"] = float(i + 1)
        rows.append(row)
    per = {n: float(i + 1) * 2**30 for i, n in enumerate(names)}
    return {"rows": rows, "weight_bytes": per, "peak_bytes": per, "ttft_ms": {n: 10.0 for n in names}}


@pytest.mark.parametrize("decode_only", [True, False])  # False: a result saved before that column
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("names", [("fp16", "mixed_gemm"), ("fp16", "mixed_gemm", e2e.PEER)])
def test_rows_match_the_header(names, compiled, decode_only):
    lines = e2e.table(fake_result(names, compiled, decode_only), compiled)
    blank = lines.index("")
    main, memory = lines[:blank], lines[blank + 1:]
    widths = {line.count("|") for line in main}
    assert len(widths) == 1, main
    assert (e2e.PEER in main[0]) == (e2e.PEER in names)
    assert {line.count("|") for line in memory} == {len(names) + 2}
    assert "3.00x" in main[2] if e2e.PEER in names else "3.00x" not in main[2]
