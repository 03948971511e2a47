"""The CUDA path: recorded decode windows, compiled decode, the batch buckets both use, and the
Triton kernels (run under Triton's interpreter where there is no card).

May import: ``nanoserve.config``.
"""
