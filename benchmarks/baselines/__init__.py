"""Frozen earlier versions of kernels, timed beside the current ones by benchmarks/kernels.py."""
