"""Scripts that build what the repository ships (the tiny model)."""
