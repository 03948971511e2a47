"""Day 35 as it stood: the stress test's verdict, computed from plain records."""
