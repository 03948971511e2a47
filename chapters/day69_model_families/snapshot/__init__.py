"""Day 69's frozen piece: a registry from config.json to a family, and each family's hooks."""
