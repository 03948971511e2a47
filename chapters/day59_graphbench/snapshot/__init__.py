"""Day 59 as it stood: the arms graphbench runs on a card, and how it reads inter-token
latency, as a typical gap and a tail, from what the client saw."""
