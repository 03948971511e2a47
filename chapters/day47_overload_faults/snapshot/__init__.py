"""Day 47 as it stood: the admission rule at the door, counted over the inbox and the queue."""
