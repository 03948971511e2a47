"""Benchmarks and harnesses that the chapters' tables come from."""
