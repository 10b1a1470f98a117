"""Benchmarks of cpprb_ray (scripts, not tests): run them with ``python benchmarks/<name>.py``."""
