"""Sequences: nogil kernels only (cimported by _seqstore); nothing at Python level."""
