"""Day 39 as it stood: SSE framing and parsing, and the disconnect watcher."""
