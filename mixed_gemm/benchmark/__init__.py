"""``mixed-gemm bench``: mg.matmul against torch fp16 (and, with ``--compare``, tinygemm, gemlite and humming-kernels) on model shapes."""
