"""``mixed-gemm bench``: mg.matmul against torch fp16 (and tinygemm) on model shapes."""
