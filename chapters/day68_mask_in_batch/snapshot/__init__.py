"""Day 68's frozen piece: the compile-once cache of grammars, as a plain LRU over spec keys."""
