"""Day 30 as it stood: the request state machine, the scheduler, the host-only harness."""
