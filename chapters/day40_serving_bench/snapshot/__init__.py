"""Day 40 as it stood: the serving benchmark's arithmetic, in plain Python."""
