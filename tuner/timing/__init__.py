"""Timing and checking a compiled model: side-by-side latencies in fresh processes, per-kernel profiles,
the machine's roofline, verification against references and accuracy reports."""
