"""Day 54 as it stood: the decode step's small ops fused into C++ CPU kernels (the norm with the
residual add, RoPE with the cache write, SiLU-and-multiply) and a small-M bf16 matmul chosen by
measurement; the snapshot keeps the PyTorch side of it."""
