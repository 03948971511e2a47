"""Day 50 as it stood: the gathered mapping (a chunked index of each row's own context cells),
the attention read over it, and the price of each read's intermediate tensors."""
