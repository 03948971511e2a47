"""Day 79: a tool call is a grammar."""
