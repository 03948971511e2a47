"""Day 51 as it stood: prompts packed into one token stream, each attending to itself only."""
