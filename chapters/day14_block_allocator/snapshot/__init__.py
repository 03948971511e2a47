"""Day 14 as it stood: the BlockAllocator."""
