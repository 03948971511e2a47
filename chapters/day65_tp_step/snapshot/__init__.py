"""Day 65's frozen step message and journal replay, in plain Python."""
