"""Day 64 as it stood: Megatron's split of a Llama over tensor-parallel ranks, as data."""
