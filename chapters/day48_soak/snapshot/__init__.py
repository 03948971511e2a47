"""Day 48 as it stood: the rule that judges a soak."""
