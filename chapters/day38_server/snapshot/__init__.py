"""Day 38 as it stood: the OpenAI error shape and one route, over any greedy generate function."""
