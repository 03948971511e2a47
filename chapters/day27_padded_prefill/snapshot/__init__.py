"""Day 27 as it stood: one padded forward for a batch of prompts."""
