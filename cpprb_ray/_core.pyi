"""The store's nogil core has no Python API; this module only exports C functions."""
