"""Day 67 as it stood: a request's grammar as a mask over the vocabulary, step by step."""
