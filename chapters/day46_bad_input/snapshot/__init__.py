"""Day 46 as it stood: one bad request per category, and the rule that judges the answer."""
