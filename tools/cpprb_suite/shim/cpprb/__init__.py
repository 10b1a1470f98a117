"""A stand-in ``cpprb`` for running cpprb's own test files against cpprb_ray.

It re-exports cpprb_ray's names under cpprb's: what a user's ``import cpprb`` would find after
changing only the import. tools/cpprb_suite/run.py puts its folder first on ``sys.path`` for
the cpprb_ray run only; it is never installed.
"""

from cpprb_ray import (  # noqa: F401
    HindsightReplayBuffer,
    LaBERlazy,
    LaBERmax,
    LaBERmean,
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReverseReplayBuffer,
    SelectiveReplayBuffer,
    create_before_add_func,
    create_buffer,
    create_env_dict,
    train,
)

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "SelectiveReplayBuffer",
    "ReverseReplayBuffer",
    "LaBERmean",
    "LaBERlazy",
    "LaBERmax",
    "HindsightReplayBuffer",
    "create_buffer",
    "train",
]
