"""Day 31 as it stood: the scheduler wired to the model."""
