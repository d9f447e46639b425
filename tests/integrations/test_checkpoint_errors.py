"""A defective checkpoint (truncated or corrupt file, missing shard, a config naming another
quantization method, bad tensors) raises a ValueError/TypeError naming the file and the key, from
``load_quantized`` and ``load_quantized_tp`` alike, and leaves nothing loaded; ``save_quantized``
names what it cannot write and writes nothing.

``CASES`` is the table: defect -> how to make it from a valid checkpoint, the exception, and the
words its message holds. Checkpoints are tiny Llama models saved in ``tmp_path`` (no download).
The GPU variants (``-m gpu``) load onto the GPU, prove the CUDA context usable after each failure
and that a failed load leaves no device memory allocated.
"""
from __future__ import annotations

import gc
import json
import shutil
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Sequence

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from mixed_gemm.integrations import hqq as hqq_mod  # noqa: E402
from mixed_gemm.integrations import tp as tp_mod  # noqa: E402
from mixed_gemm.integrations import transformers as tf_mod  # noqa: E402
from mixed_gemm.integrations.hqq import load_hqq  # noqa: E402
from mixed_gemm.integrations.tp import load_quantized_tp  # noqa: E402
from mixed_gemm.integrations.transformers import load_quantized, quantize_model, save_quantized  # noqa: E402
from mixed_gemm.nn import QuantLinear  # noqa: E402

WEIGHTS, INDEX, CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
LATE = "model.layers.1.self_attn.v_proj"  # read after most other layers (keys load in sorted order)


def tiny_llama(seed=0):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Dict[str, Path]:
    """A valid AWQ and GPTQ checkpoint of a tiny Llama (group 32), written once per module."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for fmt in ("awq", "gptq"):
        out[fmt] = save_quantized(quantize_model(tiny_llama(), bits=4, group_size=32, progress=False),
                                  root / fmt, format=fmt)
    return out


# ------------------------------------------------------------------ ways to damage a checkpoint
def tensors(d: Path, name=WEIGHTS) -> Dict[str, torch.Tensor]:
    return dict(safetensors_torch.load_file(str(d / name)))


def rewrite(d: Path, fn: Callable[[Dict[str, torch.Tensor]], None]) -> None:
    t = tensors(d)
    fn(t)
    safetensors_torch.save_file(t, str(d / WEIGHTS), metadata={"format": "pt"})


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def split(d: Path) -> None:
    """model.safetensors -> two shards and an index (as large checkpoints are saved)."""
    t = tensors(d)
    keys = sorted(t)
    halves = (keys[: len(keys) // 2], keys[len(keys) // 2:])
    for name, part in zip(SHARDS, halves):
        safetensors_torch.save_file({k: t[k] for k in part}, str(d / name), metadata={"format": "pt"})
    (d / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {k: n for n, part in zip(SHARDS, halves)
                                                                       for k in part}}))
    (d / WEIGHTS).unlink()


def edit_config(d: Path, fn: Callable[[dict], None]) -> None:
    config = json.loads((d / CONFIG).read_text())
    fn(config)
    (d / CONFIG).write_text(json.dumps(config))


def qc(**changes):
    return lambda d: edit_config(d, lambda c: c["quantization_config"].update(changes))


def poke(key: str, value, index=(0, 0)):
    def fn(t):
        t[key] = t[key].clone()
        t[key][index] = value
    return lambda d: rewrite(d, fn)


def drop(key: str):
    return lambda d: rewrite(d, lambda t: t.pop(key))


def replace(key: str, make):
    return lambda d: rewrite(d, lambda t: t.__setitem__(key, make(t[key])))


def both(*steps):
    def fn(d):
        for step in steps:
            step(d)
    return fn


@dataclass(frozen=True)
class Case:
    name: str
    damage: Callable[[Path], None]
    exc: type
    needles: Sequence[str]  # the file or key, and the rule
    fmt: str = "awq"


CASES = [
    Case("truncated", lambda d: truncate(d / WEIGHTS), ValueError, [WEIGHTS, "not a readable safetensors file"]),
    Case("truncated-header", lambda d: truncate(d / WEIGHTS, 0.0005), ValueError,
         [WEIGHTS, "not a readable safetensors file"]),
    Case("empty-file", lambda d: truncate(d / WEIGHTS, 0), ValueError, [WEIGHTS, "not a readable safetensors file"]),
    Case("corrupt-header", lambda d: (d / WEIGHTS).write_bytes(b"\xff" * 8 + (d / WEIGHTS).read_bytes()[8:]),
         ValueError, [WEIGHTS, "not a readable safetensors file"]),
    Case("truncated-shard", both(split, lambda d: truncate(d / SHARDS[1], 0.9)), ValueError,
         [SHARDS[1], "not a readable safetensors file"]),
    Case("missing-shard", both(split, lambda d: (d / SHARDS[1]).unlink()), ValueError,
         [INDEX, "lists shards missing", SHARDS[1]]),
    Case("corrupt-index", both(split, lambda d: (d / INDEX).write_text("{\"weight_map\": ")), ValueError,
         [INDEX, "not a safetensors index"]),
    Case("other-method", qc(quant_method="bitsandbytes"), ValueError, [CONFIG, "quantization_config.quant_method"]),
    Case("other-gptq-format", qc(checkpoint_format="marlin"), ValueError,
         [CONFIG, "quantization_config.checkpoint_format"], "gptq"),
    Case("other-bits", qc(bits=8), ValueError, [CONFIG, "quantization_config.bits"]),
    Case("no-quantization-config", lambda d: edit_config(d, lambda c: c.pop("quantization_config")), ValueError,
         [CONFIG, "has no quantization_config"]),
    Case("no-config", lambda d: (d / CONFIG).unlink(), ValueError, [CONFIG, "no such file"]),
    Case("corrupt-config", lambda d: (d / CONFIG).write_text("{"), ValueError, [CONFIG, "not a readable model config"]),
    Case("nan-scales", poke(f"{LATE}.scales", float("nan"), (1, 5)), ValueError,
         [WEIGHTS, LATE, "scales: expected finite values"]),
    Case("inf-scales-shard", both(poke(f"{LATE}.scales", float("inf")), split), ValueError,
         [SHARDS[1], LATE, "scales: expected finite values"]),
    Case("dtype-scales", replace(f"{LATE}.scales", lambda t: t.to(torch.int32)), TypeError,
         [LATE, "scales: expected dtype"]),
    Case("dtype-qweight", replace(f"{LATE}.qweight", lambda t: t.to(torch.int64)), TypeError,
         [LATE, "qweight: expected dtype torch.int32"]),
    Case("shape-qweight", replace(f"{LATE}.qweight", lambda t: t[:, :-1].contiguous()), ValueError,
         [LATE, "qweight: expected shape"]),
    Case("group-mismatch", qc(group_size=64), ValueError, ["scales: expected shape", "group_size=64"]),
    Case("range-g_idx", both(qc(desc_act=True), poke(f"{LATE}.g_idx", 99, 7)), ValueError,
         [LATE, "g_idx: expected values in [0, 2)"], "gptq"),
    Case("range-g_idx-row", both(qc(desc_act=True), poke("model.layers.1.self_attn.o_proj.g_idx", 99, 7)), ValueError,
         ["model.layers.1.self_attn.o_proj", "g_idx: expected values in [0, 2)"], "gptq"),
    Case("missing-scales", drop(f"{LATE}.scales"), ValueError, [LATE]),
    Case("missing-tensor", drop("model.norm.weight"), ValueError, ["model.norm.weight"]),
    Case("shape-tensor", replace("model.embed_tokens.weight", lambda t: t[:-1].contiguous()), ValueError,
         ["model.embed_tokens.weight", "expected shape (256, 64)"]),
    Case("unknown-tensor", lambda d: rewrite(d, lambda t: t.__setitem__("model.extra.weight", torch.ones(2))),
         ValueError, ["model.extra.weight", "has no place in the model"]),
]

LOADERS = {
    "load_quantized": lambda d, dev, **kw: load_quantized(d, device=dev, progress=False, **kw),
    "load_quantized_tp": lambda d, dev, **kw: load_quantized_tp(d, tp_rank=0, tp_size=1, device=dev, **kw),
}


def _damaged(saved, case: Case, tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(saved[case.fmt], d)
    case.damage(d)
    return d


def _check(loader, d: Path, case: Case, dev: str):
    with pytest.raises(case.exc) as info:
        LOADERS[loader](d, dev, dtype=torch.float16)
    for needle in case.needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"
    return info


def test_table_ids_are_unique():
    assert len({c.name for c in CASES}) == len(CASES)


def test_the_checkpoints_load(saved):
    """The undamaged checkpoints load through both loaders: each case fails for its defect."""
    for fmt in ("awq", "gptq"):
        for loader in LOADERS:
            model = LOADERS[loader](saved[fmt], "cpu", dtype=torch.float32)
            assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 2 * 7


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_defect_cpu(saved, tmp_path, case, loader):
    _check(loader, _damaged(saved, case, tmp_path), case, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_defect_gpu(saved, tmp_path, case, loader):
    from cuda_check import assert_cuda_usable

    d = _damaged(saved, case, tmp_path)
    assert_cuda_usable()  # (allocates what the kernels keep, so the count below is the load's own)
    gc.collect()
    before = torch.cuda.memory_allocated()
    info = _check(loader, d, case, "cuda")
    gc.collect()
    assert torch.cuda.memory_allocated() == before, "a failed load left tensors on the GPU"
    del info
    assert_cuda_usable()


@pytest.mark.parametrize("args,exc,needle", [
    (dict(dtype=torch.int32), TypeError, "dtype: expected torch.float16"),
    (dict(device="tpu:9"), ValueError, "device: expected a torch device"),
    (dict(model_dir="nowhere"), ValueError, "model_dir: nowhere is not a directory"),
])
@pytest.mark.parametrize("loader", list(LOADERS))
def test_bad_arguments(saved, loader, args, exc, needle):
    args = dict(args)
    model_dir = args.pop("model_dir", saved["awq"])
    with pytest.raises(exc, match=needle):
        LOADERS[loader](model_dir, args.pop("device", "cpu"), **args)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_nothing_half_loaded_stays(saved, tmp_path, monkeypatch, loader):
    """A load failing at a late layer drops every tensor and layer it made, even while the caller
    holds the exception (whose traceback would otherwise keep the loader's frames alive)."""
    made = []

    def keep(fn):
        def wrapper(model, key, value):
            made.append((type(value).__name__, weakref.ref(value)))
            return fn(model, key, value)
        return wrapper

    for mod in (tf_mod, tp_mod):
        monkeypatch.setattr(mod, "set_tensor", keep(mod.set_tensor))
        monkeypatch.setattr(mod, "set_submodule", keep(mod.set_submodule))
    case = next(c for c in CASES if c.name == "nan-scales")
    info = _check(loader, _damaged(saved, case, tmp_path), case, "cpu")
    gc.collect()
    kinds = [kind for kind, _ in made]
    assert kinds.count("Parameter") + kinds.count("Tensor") > 5 and sum("QuantLinear" in k for k in kinds) > 5  # loaded some
    assert [kind for kind, ref in made if ref() is not None] == []
    del info


# ------------------------------------------------------------------ hqq's qmodel.pt
HQQ = "qmodel.pt"
HQQ_LATE = "model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def saved_hqq(tmp_path_factory) -> Path:
    """A valid checkpoint in the hqq package's format (config.json + qmodel.pt), written once."""
    return save_quantized(quantize_model(tiny_llama(), bits=4, group_size=32, progress=False),
                          tmp_path_factory.mktemp("checkpoints") / "hqq", format="hqq")


def hqq_edit(fn: Callable[[dict], object]):
    """Rewrite qmodel.pt with ``fn``'s changes to its ``{module name: state dict}`` (``fn`` may return
    a whole new object to save instead)."""
    def damage(d: Path):
        weights = torch.load(d / HQQ, map_location="cpu", weights_only=True)
        new = fn(weights)
        torch.save(weights if new is None else new, d / HQQ)
    return damage


def hqq_late(**changes):
    """``HQQ_LATE``'s state changed and moved to the end of the file (read after every other module)."""
    def fn(weights):
        state = dict(weights.pop(HQQ_LATE))
        for key, value in changes.items():
            if value is None:
                state.pop(key)
            else:
                state[key] = value(state[key])
        weights[HQQ_LATE] = state
    return hqq_edit(fn)


def _nan_at(t, index=(3, 0)):
    t = t.clone()
    t[index] = float("nan")
    return t


HQQ_CASES = {
    "truncated": (lambda d: truncate(d / HQQ), ValueError, [HQQ, "not a readable qmodel.pt"]),
    "truncated-end": (lambda d: truncate(d / HQQ, 0.99), ValueError, [HQQ, "not a readable qmodel.pt"]),
    "empty-file": (lambda d: truncate(d / HQQ, 0), ValueError, [HQQ, "not a readable qmodel.pt"]),
    "corrupt": (lambda d: (d / HQQ).write_bytes(b"\xff" * 64 + (d / HQQ).read_bytes()[64:]), ValueError,
                [HQQ, "not a readable qmodel.pt"]),
    "not-a-dict": (hqq_edit(lambda w: list(w)), ValueError, [HQQ, "expected a {module name: state dict}"]),
    "nan-scale": (hqq_late(scale=_nan_at), ValueError, [HQQ, HQQ_LATE, "scales: expected finite values"]),
    "no-nbits": (hqq_late(nbits=None), ValueError, [HQQ, HQQ_LATE, "lacks 'nbits'"]),
    "axis": (hqq_late(axis=lambda a: 0), ValueError, [HQQ, HQQ_LATE, "only axis=1"]),
    "shape-tensor": (hqq_edit(lambda w: w["model.norm"].__setitem__("weight", torch.ones(3))), ValueError,
                     [HQQ, "model.norm.weight", "expected shape (64,)"]),
    "unknown-module": (hqq_edit(lambda w: w.__setitem__("model.extra", dict(w[HQQ_LATE]))), ValueError,
                       [HQQ, "model.extra", "no such module"]),
}

HQQ_LOADERS = {
    "load_quantized": lambda d, dev: load_quantized(d, device=dev, dtype=torch.float16, progress=False),
    "load_hqq": lambda d, dev: load_hqq(d, device=dev, dtype=torch.float16),
}


def _check_hqq(saved_hqq, tmp_path, case, loader, dev):
    d = tmp_path / "ckpt"
    shutil.copytree(saved_hqq, d)
    damage, exc, needles = HQQ_CASES[case]
    damage(d)
    with pytest.raises(exc) as info:
        HQQ_LOADERS[loader](d, dev)
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"
    return info


def test_the_hqq_checkpoint_loads(saved_hqq):
    for loader in HQQ_LOADERS:
        model = HQQ_LOADERS[loader](saved_hqq, "cpu")
        assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 2 * 7


@pytest.mark.parametrize("loader", list(HQQ_LOADERS))
@pytest.mark.parametrize("case", list(HQQ_CASES))
def test_hqq_defect_cpu(saved_hqq, tmp_path, case, loader):
    _check_hqq(saved_hqq, tmp_path, case, loader, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(HQQ_CASES))
def test_hqq_defect_gpu(saved_hqq, tmp_path, case):
    from cuda_check import assert_cuda_usable

    assert_cuda_usable()
    gc.collect()
    before = torch.cuda.memory_allocated()
    info = _check_hqq(saved_hqq, tmp_path, case, "load_hqq", "cuda")
    gc.collect()
    assert torch.cuda.memory_allocated() == before, "a failed load left tensors on the GPU"
    del info
    assert_cuda_usable()


def test_hqq_nothing_half_loaded_stays(saved_hqq, tmp_path, monkeypatch):
    """A qmodel.pt failing at its last layer drops every tensor and layer the load made, even while
    the caller holds the exception."""
    made = []

    def keep(fn):
        def wrapper(model, key, value):
            made.append((type(value).__name__, weakref.ref(value)))
            return fn(model, key, value)
        return wrapper

    monkeypatch.setattr(hqq_mod, "set_tensor", keep(hqq_mod.set_tensor))
    monkeypatch.setattr(hqq_mod, "set_submodule", keep(hqq_mod.set_submodule))
    info = _check_hqq(saved_hqq, tmp_path, "nan-scale", "load_hqq", "cpu")
    gc.collect()
    kinds = [kind for kind, _ in made]
    assert kinds.count("Parameter") + kinds.count("Tensor") > 5 and kinds.count("QuantLinear") > 5  # loaded some
    assert [kind for kind, ref in made if ref() is not None] == []
    del info


# ------------------------------------------------------------------ save_quantized
def _quantized(bits=4):
    return quantize_model(tiny_llama(), bits=bits, group_size=32, progress=False)


def _poison(model):
    model.model.layers[0].self_attn.q_proj.scales[1, 3] = float("nan")  # e.g. set through a state dict hook
    return model


def _mixed(model):
    model.model.layers[0].mlp.down_proj = QuantLinear.from_linear(nn.Linear(128, 64), bits=8, group_size=32)
    return model


SAVE_CASES = {
    "model-type": (lambda: "a model", {}, TypeError, "model: expected an nn.Module"),
    "not-quantized": (lambda: tiny_llama(), {}, ValueError, "model: has no QuantLinear layers"),
    "no-config": (lambda: nn.Sequential(QuantLinear.from_linear(nn.Linear(64, 64), group_size=32)), {}, ValueError,
                  "model: expected a transformers model"),
    "format": (_quantized, dict(format="exl2"), ValueError, "format: expected 'awq', 'gptq' or 'hqq'"),
    "format-bits": (lambda: _quantized(bits=8), dict(format="awq"), ValueError, "format: 'awq' checkpoints are 4-bit"),
    "mixed-kinds": (lambda: _mixed(_quantized()), {}, ValueError, "model: a checkpoint holds one"),
    "nan-scales": (lambda: _poison(_quantized()), {}, ValueError,
                   "model.layers.0.self_attn.q_proj: s: expected finite values"),
}


@pytest.mark.parametrize("case", list(SAVE_CASES))
def test_save_defect(tmp_path, case):
    make, kw, exc, needle = SAVE_CASES[case]
    with pytest.raises(exc) as info:
        save_quantized(make(), tmp_path / "out", **kw)
    assert needle in str(info.value)
    assert not (tmp_path / "out" / WEIGHTS).exists() and not (tmp_path / "out" / CONFIG).exists()
