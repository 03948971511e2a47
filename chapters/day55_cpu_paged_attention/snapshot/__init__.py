"""Day 55 as it stood: the C++ CPU paged decode-attention kernel (``decode_attention.cpp``, a
frozen copy of the source) and its algorithm written out in plain torch (``paged_decode.py``):
blocks read through the table, the GQA group scored together, an online softmax over 16-token
tiles, splits of 512 tokens combined per row, and the bytes the kernel allocates."""
