"""Day 56 as it stood: the speed switches as four separate flags, and the one rule that ties two
of them together on the command line."""
