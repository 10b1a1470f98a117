"""cpprb.util's names (gymnasium helpers), re-exported from cpprb_ray."""

from cpprb_ray.util import create_before_add_func, create_env_dict  # noqa: F401
