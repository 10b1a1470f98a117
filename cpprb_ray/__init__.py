"""cpprb_ray: shared-memory prioritized experience replay for distributed reinforcement learning.

One buffer lives in one shared-memory segment; the Python object is a thin handle that pickles by
name and re-attaches in place in any process on the host (multiprocessing children, Ray tasks and
actors). The API is cpprb's: a cpprb user changes only the import.

Examples
--------
>>> from cpprb_ray import PrioritizedReplayBuffer
>>> with PrioritizedReplayBuffer(16, {"obs": {"shape": 3}}) as rb:
...     _ = rb.add(obs=[1.0, 2.0, 3.0])
...     print(rb.sample(2)["obs"].shape)
(2, 3)
"""

from cpprb_ray._orphans import list_buffers, remove_buffer, remove_orphans
from cpprb_ray._ownership import install_sigterm_handler
from cpprb_ray._store import LaneError
from cpprb_ray.buffer import PrioritizedReplayBuffer, ReplayBuffer, attach
from cpprb_ray.factory import create_buffer, dict2buffer
from cpprb_ray.hindsight import HindsightReplayBuffer
from cpprb_ray.laber import LaBERlazy, LaBERmax, LaBERmean
from cpprb_ray.multiprocess import MPPrioritizedReplayBuffer, MPReplayBuffer
from cpprb_ray.nstep_buffer import NstepBuffer
from cpprb_ray.rate_limiters import MinSize, RateLimiter, SampleToInsertRatio
from cpprb_ray.reverse import ReverseReplayBuffer
from cpprb_ray.selective import SelectiveReplayBuffer
from cpprb_ray.sequences import sequence_priority
from cpprb_ray.training import train
from cpprb_ray.util import create_before_add_func, create_env_dict

__all__ = [
    "HindsightReplayBuffer",
    "LaBERlazy",
    "LaBERmax",
    "LaBERmean",
    "LaneError",
    "MPPrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MinSize",
    "NstepBuffer",
    "PrioritizedReplayBuffer",
    "RateLimiter",
    "ReplayBuffer",
    "ReverseReplayBuffer",
    "SampleToInsertRatio",
    "SelectiveReplayBuffer",
    "attach",
    "create_before_add_func",
    "create_buffer",
    "create_env_dict",
    "dict2buffer",
    "install_sigterm_handler",
    "list_buffers",
    "remove_buffer",
    "remove_orphans",
    "sequence_priority",
    "train",
]
__version__ = "0.1.0"
