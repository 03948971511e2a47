"""Day 54 as it stood: what each C++ op must compute (its PyTorch reference, with the op's own
in-place signature), the Llama forward rewritten around those ops, and the small-M matmul's
weight layout and choice rule. The C++ itself lives in the package; a frozen copy of it would
need its own 40-second build."""
