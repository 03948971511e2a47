"""Day 62 as it stood: the engine's decode read for attention="triton" (block ids from the slot
table), which step goes where, and the list of kernel configurations compiled for an H200."""
