"""Day 37 as it stood: the engine core on a thread, one asyncio stream per request."""
