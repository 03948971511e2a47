"""Day 41 as it stood: the token budget and chunked prefill, scheduled host-only."""
