"""Day 76's frozen piece: what k proposals are worth (the expected tokens of a verify step and
the speed-up they buy), and how a verify step's tokens are laid out as decode entries."""
