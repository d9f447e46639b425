"""Measuring kernels on the GPU: cold-L2 CUDA-graph timing, problem presets, the config sweep
behind ``mixed-gemm profile`` and the comparison behind ``mixed-gemm bench``."""
