"""Day 57 as it stood: the capture list, the static buffers a window reads and writes, the
copy-in with its padded rows, and an eager window that checks its buffers never moved."""
