"""Day 79's frozen piece: a tool_choice turned into the JSON schema a forced call must match,
and the forced output read back as calls, in plain Python."""
