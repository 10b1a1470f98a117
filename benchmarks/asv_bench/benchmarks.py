"""asv benchmark classes over benchmarks/_workloads.py: the cases compare.py measures, for
cpprb_ray's buffer and tree, warm (asv times consecutive calls; compare.py has the cold ones).

The buffer is filled in setup(), once per parameter combination and process, as compare.py
fills it; every timed call takes the next input of a pool drawn before timing. cpprb_ray is the
one the interpreter imports: the commit's build under ``asv run``, the installed or in-place one
with ``--python=same``.
"""

from __future__ import annotations

import os
import sys

# benchmarks/ holds the workload definitions; asv imports this folder on its own.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import _workloads as workloads  # noqa: E402

SEED = 0
EXPONENTS = [10, 16, 20]


class _Suite:
    """Common setup: library `key` at 2**exponent rows, one call per operation."""

    key = ""
    operations: tuple = ()

    def setup(self, exponent, batch=0):
        import cpprb_ray

        module = workloads.import_library(self.key, cpprb_ray)
        self.adapter = workloads.make(self.key, module, 2**exponent, SEED)
        inputs = workloads.Inputs(SEED + 1)
        self.calls = {}
        for operation in self.operations:
            case = workloads.Case(operation, exponent,
                                  batch if operation in workloads.BATCHED else 0, "warm")
            self.calls[operation] = workloads.call(self.key, self.adapter, case, inputs)

    def teardown(self, exponent, batch=0):
        self.adapter.close()


class Buffer(_Suite):
    """cpprb_ray's PrioritizedReplayBuffer: sample, update and the learner step."""

    key = "cpprb_ray"
    operations = ("sample", "update", "learner step")
    params = (EXPONENTS, list(workloads.BATCHES))
    param_names = ["log2_capacity", "batch"]

    def time_sample(self, exponent, batch):
        self.calls["sample"]()

    def time_update(self, exponent, batch):
        self.calls["update"]()

    def time_learner_step(self, exponent, batch):
        self.calls["learner step"]()


class BufferAdd(_Suite):
    """cpprb_ray's PrioritizedReplayBuffer: add(1) and add(64) into the full buffer."""

    key = "cpprb_ray"
    operations = ("add(1)", "add(64)")
    params = (EXPONENTS,)
    param_names = ["log2_capacity"]

    def time_add_1(self, exponent):
        self.calls["add(1)"]()

    def time_add_64(self, exponent):
        self.calls["add(64)"]()


class Tree(Buffer):
    """cpprb_ray's segment tree: sample, update and the learner step (Buffer's timings, on
    the tree alone)."""

    key = "cpprb_ray_tree"
