"""Day 58 as it stood: the row compactor and its gates, and the coverage count over Day 33's
scheduler with compaction slotted in between growth and admission."""
