"""bench/tp_two_gpu.py and bench/tp_decode.py through torchrun: on two GPUs (NCCL, 70B shapes:
logits / outputs TP=2 vs TP=1, decode-step timing, 80-layer memory; our all-reduce against NCCL),
and as CPU dry runs (gloo, tiny shapes; tp_decode.py also at four ranks) so the scripts themselves
stay runnable where there is no GPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "tp_two_gpu.py"
DECODE = ROOT / "bench" / "tp_decode.py"


def _torchrun(*args, env=None, timeout=330, script=SCRIPT, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), str(script), *args]
    # The checkout first, then whatever path the parent had (where nvidia-cutlass may be installed
    # outside site-packages, as on the GPU machine's /tmp/site): the ranks compile what they lack.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, **(env or {}))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_script_dry_run_on_cpu():
    out = _torchrun("--preset", "tiny", "--layers", "2", "--mem-layers", "3", env={"CUDA_VISIBLE_DEVICES": ""},
                    timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "| logits, TP=2 vs TP=1 |" in out.stdout and "PASS" in out.stdout.splitlines()[-1]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_llama70b_shapes():
    out = _torchrun()
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "PASS" in out.stdout.splitlines()[-1]


def test_decode_bench_dry_run_on_cpu():
    out = _torchrun("--preset", "tiny", "--layers", "2", env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120, script=DECODE)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "| check, TP=2 fused vs TP=1 |" in out.stdout and "PASS" in out.stdout.splitlines()[-1]


def test_decode_bench_dry_run_at_four_ranks_on_cpu():
    """The TP size is the world size: four gloo ranks (one thread each) split the tiny preset."""
    out = _torchrun("--preset", "tiny", "--layers", "2", env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"},
                    timeout=120, script=DECODE, nproc=4)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "| check, TP=4 fused vs TP=1 |" in out.stdout and "PASS" in out.stdout.splitlines()[-1]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_decode_bench_two_gpus_short():
    """A short run of every part: the check, the all-reduce micro-benchmark, 4 layers at TP=1 and TP=2."""
    out = _torchrun("--layers", "4", "--batches", "1,16", "--compile", "0", "--micro-rows", "1,64", timeout=600,
                    script=DECODE)
    print(out.stdout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "PASS" in out.stdout.splitlines()[-1] and "| all-reduce 16 KB |" in out.stdout
