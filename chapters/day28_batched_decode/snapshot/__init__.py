"""Day 28 as it stood: one decode step for B rows at different lengths."""
