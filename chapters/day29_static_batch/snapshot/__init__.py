"""Day 29 as it stood: static batches over the paged cache, with their bills counted."""
