"""Day 60 as it stood: the paged decode kernel's arithmetic in plain torch (one program per row
and KV head, the GQA heads packed, an online softmax over tiles read through block ids)."""
