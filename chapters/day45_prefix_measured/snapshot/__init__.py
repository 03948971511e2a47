"""Day 45 as it stood: vLLM's prefix_repetition workload, and what a prefix cache can find in it."""
