"""Day 71's frozen piece: the comparison that holds a family against transformers."""
