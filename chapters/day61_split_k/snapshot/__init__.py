"""Day 61 as it stood: split-K in plain torch (segments, partial outputs and log-sum-exps, the
merge) and the rule that picks the number of segments from the batch shape."""
