"""``sample(..., out=batch)`` allocates nothing: counted with tracemalloc over 1,000 calls on
every sampler of a handle that sees its segment (the ring's, uniform and prioritized, with
check_for_update, the lanes', with and without frames, and the sequences').

tracemalloc sees every Python object and every numpy array's data (numpy reports its buffers
to it). The peak of traced memory across the calls, above what was traced before them, must
stay below the smallest output array: a throwaway array of the batch (a weights array a
uniform sample used to fill and drop) would put the peak past it, while the result dict each
call returns (a few hundred bytes, freed by the next) does not.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer

BATCH = 4096
ENV = {"obs": {"shape": 4}, "act": {"dtype": "int64"}, "rew": {}}
FRAMES_ENV = {"obs": {"shape": (4, 4, 2), "dtype": "uint8"}, "act": {"dtype": "int64"}}

CASES = {
    "uniform": (ReplayBuffer, ENV, {}),
    "prioritized": (PrioritizedReplayBuffer, ENV, {}),
    "check_for_update": (PrioritizedReplayBuffer, ENV, {"check_for_update": True}),
    "lanes-uniform": (ReplayBuffer, ENV, {"lanes": 2}),
    "lanes-prioritized": (PrioritizedReplayBuffer, ENV, {"lanes": 2}),
    "frames": (PrioritizedReplayBuffer, FRAMES_ENV,
               {"next_of": "obs", "stack_compress": "obs"}),
    "sequences": (PrioritizedReplayBuffer, ENV, {"sequence": {"length": 4}, "lanes": 2}),
}


def fill(rb, env):
    rng = np.random.default_rng(0)
    for _ in range(4):
        rows = {name: rng.integers(0, 200, (64,) + tuple(np.atleast_1d(spec.get("shape", 1))))
                .astype(spec.get("dtype", "float32")) for name, spec in env.items()}
        if "next_obs" in rb.env_dict:
            rows["next_obs"] = rows["obs"]
        rb.add(**rows)


def traced_peak(call, times):
    """Peak traced bytes above the start while `call` runs `times` times."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for _ in range(times):
            call()
        _, peak = tracemalloc.get_traced_memory()
        return peak - start
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("case", sorted(CASES))
def test_sample_into_out_allocates_nothing(case):
    cls, env, options = CASES[case]
    with cls(4096, env, seed=0, **options) as rb:
        fill(rb, env)
        out = rb.sample(BATCH)
        smallest = min(array.nbytes for array in out.values())
        assert smallest >= 4 * BATCH
        for _ in range(10):   # warm: caches and interned objects made once
            rb.sample(BATCH, out=out)
        peak = traced_peak(lambda: rb.sample(BATCH, out=out), 1000)
        assert peak < smallest, (case, peak, smallest)
        # ... while a sample without out= (fresh arrays, or spares that someone still holds)
        # does allocate: the measure sees an array of the batch.
        held = []
        fresh = traced_peak(lambda: held.append(rb.sample(BATCH)), 3)
        assert fresh > smallest, (case, fresh, smallest)
