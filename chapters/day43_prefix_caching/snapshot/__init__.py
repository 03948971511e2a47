"""Day 43 as it stood: a block pool whose freed full blocks can be found again by hash."""
