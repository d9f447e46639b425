"""``mixed-gemm info`` in-process and as ``python -m mixed_gemm.cli``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mixed_gemm
from mixed_gemm import cli

REPO = Path(__file__).resolve().parents[1]
LABELS = (
    "mixed_gemm",
    "torch",
    "CUDA runtime (torch)",
    "CUDA driver",
    "nvcc",
    "CUTLASS headers",
    "GPU",
    "kernel families",
    "kernel cache",
)


def _check_info(out: str, cache: Path) -> None:
    lines = {line.split("  ")[0]: line for line in out.splitlines() if line.strip()}
    for label in LABELS:
        assert label in lines, f"no {label!r} line in:\n{out}"
    assert mixed_gemm.__version__ in lines["mixed_gemm"]
    assert str(cache) in lines["kernel cache"]
    assert "unavailable" not in lines["torch"]
    import torch

    if torch.version.cuda is None:
        assert "none (CPU build)" in lines["CUDA runtime (torch)"]
    if not torch.cuda.is_available():
        assert "no CUDA GPU visible" in lines["GPU"]
    # One line per family (the first carries the label), each saying whether it runs here.
    from mixed_gemm.kernels import FAMILIES

    fam_lines = out.split("kernel families", 1)[1].splitlines()[: len(FAMILIES) * max(1, torch.cuda.device_count())]
    for fam in FAMILIES:
        assert any(line.strip().startswith(f"{fam.name}: layout {fam.layout};") for line in fam_lines), out
    if not torch.cuda.is_available():
        assert all(line.rstrip().endswith("no CUDA GPU visible") for line in fam_lines)
    # Driver and nvcc vary by machine, but each must print a result, not a traceback.
    assert "Traceback" not in out


def test_info_in_process(tmp_cache, capsys):
    assert cli.main(["info"]) == 0
    _check_info(capsys.readouterr().out, tmp_cache)


def test_info_without_nvcc(tmp_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("nvcc") and "not found" in line for line in out.splitlines())
    _check_info(out, tmp_cache)


def test_info_subprocess(tmp_cache, tmp_path):
    pythonpath = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    proc = subprocess.run(
        [sys.executable, "-m", "mixed_gemm.cli", "info"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    _check_info(proc.stdout, tmp_cache)


def test_every_command_is_registered():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert sorted(commands) == ["bench", "build", "e2e", "generate", "info", "profile", "profile-moe"]
    for name, sub in commands.items():
        assert sub.get_default("func") is not None, name


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2
    assert "usage: mixed-gemm" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert mixed_gemm.__version__ in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["profile", "--shapes", "256:256", "--ms", "1"],
                                  ["bench", "--shapes", "256:256", "--ms", "1"], ["e2e", "--layers", "2"],
                                  ["profile-moe", "--tokens", "1"], ["bench", "--moe", "mixtral-8x7b"]])
def test_gpu_commands_without_a_gpu(argv, monkeypatch, capsys):
    from mixed_gemm.profiler import timing

    monkeypatch.setattr(timing, "gpu_missing", lambda: "no CUDA GPU is visible (test)")
    assert cli.main(argv) == 1
    assert f"mixed-gemm {argv[0]}: no CUDA GPU is visible" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["bench", "--model", "gpt5"], "mixed-gemm bench: error: --model: expected comma-separated presets from llama3-8b"),
    (["profile", "--shapes", "4096"], "mixed-gemm profile: error: --shapes: expected N:K pairs"),
    (["profile", "--ms", "1,x"], "mixed-gemm profile: error: --ms: expected comma-separated positive integers"),
    (["profile", "--families", "sm90x"], "mixed-gemm profile: error: --families: expected comma-separated families from"),
    (["e2e", "--model", "gpt5"], "mixed-gemm e2e: error: --model: expected one preset of llama3-8b"),
    (["e2e", "--batches", "1,0"], "mixed-gemm e2e: error: --batches: expected comma-separated positive integers"),
    (["e2e", "--model", "qwen3-30b-a3b", "--compare"], "no MoE peer yet"),
])
def test_gpu_commands_reject_bad_arguments(argv, msg, capsys):
    """(Every subcommand's argument rules: tests/test_bad_input_moe_cli.py.)"""
    assert cli.main(argv) == 2
    assert msg in capsys.readouterr().err


def test_build_compiles_what_the_gpu_can_select(monkeypatch):
    """Without a GPU (or with --all) every catalog; with one, what selection can pick there (its
    profile, every family's heuristics, the stand-ins): the contents of a kernel package for it."""
    from mixed_gemm.cli.build import build_items, catalog
    from mixed_gemm.kernels import base
    from mixed_gemm.select import coverage, profiles

    everything = catalog("")
    monkeypatch.setattr(base, "compute_capability", lambda i: None)
    assert build_items("", False) == everything  # no GPU: a cache for anywhere
    monkeypatch.setattr(base, "compute_capability", lambda i: (9, 0))
    monkeypatch.setattr(base, "sm_count", lambda i: 132)
    monkeypatch.setattr(profiles, "device_profile", lambda i: coverage.shipped_profile((9, 0)))
    assert build_items("", True) == everything
    hopper = build_items("", False)
    h100 = coverage.selectable_for((9, 0), 132, coverage.shipped_profile((9, 0)))
    assert [c.kernel_name for _, c in hopper] == [c.kernel_name for _, c in h100]
    # A package for the arch holds that and what the H200's own profile entries pick.
    packaged = {c.kernel_name for _, c in coverage.selectable("sm90a")}
    assert {c.kernel_name for _, c in hopper} < packaged
    assert {f.name for f, _ in hopper} == {"sm90s", "sm90a", "gemv", "sm80", "dequant_mm"}  # sm90s: Family.packaged
    # The sm80 tiles the H100 can select read the one copy or the low widths' layout (since the int8
    # 16-token entries went to sm90s, only the low widths'): no sm80-layout kernel on the H100.
    assert {c.layout for f, c in hopper if f.name == "sm80"} <= {"sm90a", "lowbit"}
    assert "lowbit" in {c.layout for f, c in hopper if f.name == "sm80"}
    assert build_items("mg_sm90a_f16", False) == [(f, c) for f, c in hopper if "mg_sm90a_f16" in c.kernel_name]


def test_bench_repeat_is_a_positive_count_and_dense_only(capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["bench"]).repeat == 1 and parser.parse_args(["bench", "--repeat", "5"]).repeat == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--repeat", "0"])
    assert "--repeat" in capsys.readouterr().err
    assert cli.main(["bench", "--moe", "mixtral-8x7b", "--repeat", "3"]) == 2
    assert "--repeat applies to the dense tables" in capsys.readouterr().err


def test_bench_takes_a_list_of_widths_profile_one(capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["bench", "--bits", "2,3,4"]).bits == [2, 3, 4]
    assert parser.parse_args(["profile", "--bits", "3"]).bits == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--bits", "2,5"])
    assert "expected comma-separated widths from (1, 2, 3, 4, 7, 8), got '2,5'" in capsys.readouterr().err


def test_bench_table_by_width():
    from mixed_gemm.benchmark.report import by_width

    rows = {2: [dict(m=1, speedup=4.0, gemlite_speedup=3.0), dict(m=1, speedup=9.0)], 7: [dict(m=1, speedup=3.0)]}
    assert by_width(rows, [1], compare=True)[2:] == ["| 2 | 6.00x (gemlite 3.00x) |", "| 7 (1:2 sparse) | 3.00x |"]
