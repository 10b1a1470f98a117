"""cpprb.PyReplayBuffer's names (the module cpprb's tests import dict2buffer and NstepBuffer
from), re-exported from cpprb_ray."""

from cpprb_ray import (  # noqa: F401
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    NstepBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReverseReplayBuffer,
    SelectiveReplayBuffer,
    create_buffer,
    dict2buffer,
    train,
)
