"""Day 78's frozen pieces: prompt lookup and its replay over finished text (``lookup``), and
what a proposal must cost for speculation to pay (``speedup``)."""
