"""Day 49 as it stood: the decode forward through torch.compile, one graph per batch bucket,
with the paged attention read behind an opaque custom op."""
