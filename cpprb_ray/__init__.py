"""cpprb_ray"""
