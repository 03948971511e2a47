"""Day 64's frozen split: which slice of every tensor a rank holds, from config.json alone."""
