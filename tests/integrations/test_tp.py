"""Tensor parallelism on the CPU: two processes (torch.multiprocessing spawn) over gloo, fixed
seeds. Every format x both parallel styles through the real all-reduce / all-gather, and an AWQ
and a GPTQ act-order checkpoint loaded with load_quantized_tp: TP=2 logits equal TP=1 (fused per
rank too). The two-GPU run (NCCL, 70B shapes, timing, memory) is bench/tp_two_gpu.py."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

transformers = pytest.importorskip("transformers")

from tolerance import assert_elementwise  # noqa: E402
from tp_cases import CASES, K, TP, make_layer, reference, shard_kwargs  # noqa: E402


def _worker(rank, fn, rendezvous, args):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=TP)
    try:
        torch.manual_seed(1234)  # the same fresh inputs on every rank
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def _spawn(fn, tmp_path, *args):
    torch.set_num_threads(1)  # two ranks on a 2-core machine
    mp.spawn(_worker, args=(fn, str(tmp_path / "rendezvous"), args), nprocs=TP, join=True)


# ------------------------------------------------------------------ layers
def _layers(rank):
    from mixed_gemm.integrations.shard import shard_linear

    torch.set_num_threads(1)
    for case in CASES:
        layer = make_layer(case)
        x = torch.randn(3, 2, K)
        ref = reference(case, layer, x)
        for style in ("column", "row"):
            mod = shard_linear(*layer.checkpoint, layer.bias, style=style, tp_rank=rank, tp_size=TP,
                               **shard_kwargs(case, layer))
            if style == "column":
                y = mod(x)
                parts = [torch.empty_like(y) for _ in range(TP)]
                dist.all_gather(parts, y.contiguous())
                y = torch.cat(parts, dim=-1)
            else:
                ks = K // TP
                y = mod(x[..., rank * ks:(rank + 1) * ks].contiguous())  # all-reduced inside
                mod.input_is_parallel = False  # the layer takes its own columns of the whole x
                assert torch.equal(mod(x), y)
            try:
                assert_elementwise(y, ref, K)
            except AssertionError as e:
                raise AssertionError(f"{case.name} {style}-parallel, rank {rank}: {e}") from None


def test_every_format_and_style_over_gloo(tmp_path):
    _spawn(_layers, tmp_path)


# ------------------------------------------------------------------ models
def tiny_llama(seed=0):
    """Heads and widths that split over 2 ranks at group 32: q N=64, k/v N=32, o K=64, down K=128."""
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def _act_order(model, group):
    """Every quantized layer re-made as a GPTQ act-order layer (random g_idx): save_quantized
    writes it as a desc_act checkpoint."""
    import mixed_gemm as mg
    from mixed_gemm.integrations.loading import set_submodule
    from mixed_gemm.nn import QuantLinear

    gen = torch.Generator().manual_seed(5)
    for name, m in [(n, m) for n, m in model.named_modules() if isinstance(m, QuantLinear)]:
        q, s, z = m.packed().unpack()
        g_idx = (torch.arange(m.in_features) // group)[torch.randperm(m.in_features, generator=gen)].int()
        ckpt = mg.pack(q, s, z, format="gptq", bits=4, group_size=group, g_idx=g_idx)
        set_submodule(model, name, QuantLinear.from_checkpoint(*ckpt, format="gptq", bits=4, group_size=group,
                                                               g_idx=g_idx))
    return model


def _model(rank, ckpt, kinds):
    from mixed_gemm.integrations.fuse import fuse_projections
    from mixed_gemm.integrations.tp import load_quantized_tp
    from mixed_gemm.integrations.tp_fuse import fuse_all_reduce_norms
    from mixed_gemm.integrations.transformers import load_quantized
    from mixed_gemm.nn.parallel import ColumnParallelQuantLinear, RowParallelQuantLinear

    torch.set_num_threads(1)
    ids = torch.randint(0, 256, (2, 9))
    full = load_quantized(ckpt, dtype=torch.float32, device="cpu", progress=False)
    tp = load_quantized_tp(ckpt, dtype=torch.float32, device="cpu")
    attn, mlp = tp.model.layers[0].self_attn, tp.model.layers[0].mlp
    assert isinstance(attn.k_proj, ColumnParallelQuantLinear) and attn.k_proj.out_features == 16
    assert isinstance(mlp.down_proj, RowParallelQuantLinear) and mlp.down_proj.in_features == 64
    assert (mlp.down_proj.input_index is not None) == kinds["act_order"]  # act-order row shards are regrouped
    with torch.no_grad():
        want = full(ids).logits
        got = tp(ids).logits
        assert_elementwise(got, want, 128)
        n = fuse_projections(tp)
        assert n == (0 if kinds["act_order"] else 4)  # act-order layers keep their own K permutation
        assert_elementwise(tp(ids).logits, want, 128)
        assert fuse_all_reduce_norms(tp) == 2  # all-reduce + skip + next norm as one op
        first, last = (layer._mg_tp for layer in tp.model.layers)
        assert first.next_slot is last.slot and last.next_norm is None
        assert not attn.o_proj.reduce_results and not mlp.down_proj.reduce_results
        for _ in range(2):  # the hand-over is consumed, so a second forward starts clean
            fused = tp(ids).logits
            assert_elementwise(fused, want, 128)
            assert last.slot.value is None
        if not kinds["act_order"]:  # Dynamo traces the hand-over (the identity check, the slot's writes)
            compiled = torch.compile(tp, backend="aot_eager")
            for _ in range(2):
                assert torch.equal(compiled(ids).logits, fused)
        other = torch.empty_like(got)
        dist.broadcast(other.copy_(got), src=0)
        assert torch.equal(other, got)  # every rank computes the same logits


@pytest.mark.parametrize("fmt,act_order", [("awq", False), ("gptq", True)])
def test_load_quantized_tp_matches_tp1(tmp_path, fmt, act_order):
    from mixed_gemm.integrations.transformers import quantize_model, save_quantized

    model = quantize_model(tiny_llama(), bits=4, group_size=32, progress=False)
    if act_order:
        _act_order(model, 32)
    save_quantized(model, tmp_path / "ckpt", format=fmt)
    _spawn(_model, tmp_path, str(tmp_path / "ckpt"), {"act_order": act_order})


def test_rules_named_before_loading(tmp_path):
    from mixed_gemm.integrations.tp import load_quantized_tp
    from mixed_gemm.integrations.transformers import quantize_model, save_quantized

    save_quantized(quantize_model(tiny_llama(), bits=4, group_size=64, progress=False), tmp_path, format="awq")
    with pytest.raises(ValueError, match=r"o_proj \(row-parallel, N=64, K=64\): tp_size: row-parallel shards K in "
                                         r"whole groups: K/tp_size=32 must be a multiple of group_size=64"):
        load_quantized_tp(tmp_path, tp_rank=0, tp_size=2, device="cpu")
    with pytest.raises(ValueError, match="tp_size: column-parallel attention splits num_key_value_heads=2"):
        load_quantized_tp(tmp_path, tp_rank=0, tp_size=4, device="cpu")
