"""Day 80: reading a tool call and a chain of thought out of a stream the server did not write."""
