"""Day 10 as it stood: SamplingParams and the sampler."""
