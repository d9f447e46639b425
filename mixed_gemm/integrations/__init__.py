"""Integrations with model libraries (transformers; GGUF Q4_1 files). Import the submodules:
they need packages the core does not (``pip install 'mixed-gemm[hf]'``). ``fuse.fuse_projections``
fuses q/k/v and gate/up of a loaded model (one launch each); ``shard`` and ``tp``
cut quantized layers into tensor-parallel shards and load a model per rank."""
