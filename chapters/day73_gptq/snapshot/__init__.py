"""Day 73's frozen piece: rounding a layer's columns one at a time, each column's error paid back
by the columns not yet rounded."""
