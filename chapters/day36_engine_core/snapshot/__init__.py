"""Day 36 as it stood: one long-lived engine core, stepped from outside."""
