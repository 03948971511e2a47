"""Day 75's frozen piece: the byte ceiling of a decode step, and the two ways a four-bit weight
meets its activation (widened to the activation's dtype, or both rounded to int8 blocks)."""
