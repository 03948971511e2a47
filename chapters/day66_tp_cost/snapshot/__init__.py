"""Day 66's frozen cost model: the bytes each collective moves in one decode step."""
