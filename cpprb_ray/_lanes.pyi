"""Lanes and frames: nogil kernels only (cimported by _store); nothing at Python level."""
