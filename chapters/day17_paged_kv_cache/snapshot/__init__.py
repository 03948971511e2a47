"""Day 17 as it stood: block and slot tables, the batched paged cache, reference attention."""
