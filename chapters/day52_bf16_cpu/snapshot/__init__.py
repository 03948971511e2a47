"""Day 52 as it stood: dtype="auto" on a CPU, chosen from the processor's bf16 flags."""
