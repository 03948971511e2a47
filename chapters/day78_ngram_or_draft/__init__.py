"""Day 78: prompt lookup against a draft model on the shipped model, where each wins and loses."""
