"""The CPU speed layer: the C++ ops and their loader, the measurements that choose dtype,
packing and kernels, huge pages, thread binding, the fused forward and the CPU prefill read.

May import: ``nanoserve.config``.
"""
