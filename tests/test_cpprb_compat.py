"""cpprb's API on cpprb_ray: what a migrating user writes works, or fails saying what to use.

The parity tests run cpprb and cpprb_ray side by side on the same calls; they skip where cpprb
is not installed (the 3.7 venv). docs/migrating.md's table is checked against cpprb's own
method list here too.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import re
import sys
import zipfile

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import (
    MPPrioritizedReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    ReplayBuffer,
)

ENV = {"obs": {"shape": 3}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
CPPRB_CLASSES = ("ReplayBuffer", "PrioritizedReplayBuffer", "MPReplayBuffer",
                 "MPPrioritizedReplayBuffer")


def steps(count, start=0):
    values = np.arange(start, start + count, dtype=np.float64)
    return {"obs": np.stack([values, values + 0.5, -values], axis=1), "act": values.astype(int),
            "rew": values * 0.25, "done": (values % 4 == 3).astype(float)}


# -- size, env_dict, default_dtype -----------------------------------------------------------------

def test_float_size_with_a_whole_value_is_rows():
    with PrioritizedReplayBuffer(1e3, {"obs": {}}) as rb, ReplayBuffer(64.0, {"obs": {}}) as ub:
        assert rb.get_buffer_size() == 1000 and ub.get_buffer_size() == 64
    with MPReplayBuffer(np.float32(8), {"obs": {}}) as mp:
        assert mp.get_buffer_size() == 8


@pytest.mark.parametrize("size, message", [
    (1.5, "size must be a whole number of rows; got 1.5"),
    (float("nan"), "size must be a whole number of rows; got nan"),
    (float("inf"), "size must be a whole number of rows; got inf"),
    (-1, "size must be > 0; got -1"),
    (-4.0, "size must be > 0; got -4"),
    (0, "size must be > 0; got 0"),
])
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_bad_size_names_size(cls, size, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(size, {"obs": {}})


def test_env_dict_defaults_are_cpprbs():
    with ReplayBuffer(4, {"obs": {}, "act": {"shape": 2}, "flag": None}) as rb:
        specs = rb.env_dict
    assert specs["obs"] == {"shape": (1,), "dtype": np.dtype(np.float32)}
    assert specs["act"] == {"shape": (2,), "dtype": np.dtype(np.float32)}
    assert specs["flag"]["shape"] == (1,)


def test_default_dtype_fills_columns_without_one():
    env = {"obs": {"shape": 2}, "act": {"dtype": np.int8}, "rew": {}}
    with PrioritizedReplayBuffer(4, env, default_dtype=np.float64) as rb:
        dtypes = {name: spec["dtype"] for name, spec in rb.env_dict.items()}
        rb.add(obs=[0.1, 0.2], act=3, rew=1.0)
        assert rb.sample(1)["obs"].dtype == np.float64
    assert dtypes == {"obs": np.float64, "act": np.int8, "rew": np.float64}
    assert env == {"obs": {"shape": 2}, "act": {"dtype": np.int8}, "rew": {}}  # not modified
    with pytest.raises(TypeError, match="default_dtype must be a fixed-size plain numpy dtype"):
        ReplayBuffer(4, {"obs": {}}, default_dtype=object)


def test_alpha_is_the_third_positional_argument_as_in_cpprb():
    with PrioritizedReplayBuffer(8, {"obs": {}}, 0.0, seed=0) as rb:
        rb.add(obs=[1.0, 2.0], priorities=[1.0, 100.0])
        # alpha 0: every row weighs the same whatever its priority.
        assert np.allclose(rb.sample(16)["weights"], 1.0)


@pytest.mark.parametrize("cls, name, value, advice", [
    (ReplayBuffer, "alpha", 0.5, "PrioritizedReplayBuffer's argument"),
    (ReplayBuffer, "check_for_update", True, "PrioritizedReplayBuffer's argument"),
    (MPReplayBuffer, "eps", 0.1, "PrioritizedReplayBuffer's argument"),
])
def test_cpprb_arguments_not_taken_say_what_to_use(cls, name, value, advice):
    with pytest.raises(TypeError, match=re.escape(f"{cls.__name__}() does not take cpprb's "
                                                  f"{name}=")) as error:
        cls(8, {"obs": {}}, **{name: value})
    assert advice in str(error.value)


def test_unknown_arguments_are_still_refused():
    # cpprb ignores misspelled keyword arguments; a misspelling must not pass silently here.
    with pytest.raises(TypeError, match="alhpa"):
        PrioritizedReplayBuffer(8, {"obs": {}}, alhpa=0.5)


# -- check_for_update ------------------------------------------------------------------------------

def test_check_for_update_skips_slots_written_since_the_sample():
    with PrioritizedReplayBuffer(4, {"obs": {}}, check_for_update=True, seed=0) as rb:
        rb.add(obs=[1.0, 2.0, 3.0, 4.0])
        batch = rb.sample(64)
        sampled = np.unique(batch["indexes"])
        assert len(sampled) == 4
        rb.add(obs=[5.0, 6.0])                       # slots 0 and 1 are new rows now
        applied = rb.update_priorities(sampled, [7.0, 7.0, 9.0, 9.0])
        assert applied == 2
        assert rb.get_max_priority() == 9.0
        # The new rows kept the priority they were added with: the max seen (1.0) then.
        weights = rb.get_all_transitions()
        assert len(weights["obs"]) == 4
        # A fresh sample makes slots 0 and 1 updatable again.
        rb.sample(64)
        assert rb.update_priorities([0, 1], [2.0, 2.0]) == 2


def test_check_for_update_skips_slots_never_sampled_and_obeys_given_generations():
    with PrioritizedReplayBuffer(4, {"obs": {}}, check_for_update=True, seed=0) as rb:
        rb.add(obs=[1.0, 2.0])
        assert rb.update_priorities([0, 1], [3.0, 3.0]) == 0    # written, never sampled
        batch = rb.sample(8)
        rb.add(obs=[3.0, 4.0, 5.0, 6.0])                          # overwrites everything
        # Explicit generations are the sample's own: the same verdict.
        assert rb.update_priorities(batch["indexes"], np.ones(8), batch["generations"]) == 0
        with pytest.raises(IndexError, match="indexes must be in"):
            rb.update_priorities([7], [1.0])     # out of range: the update's own check
    with PrioritizedReplayBuffer(4, {"obs": {}}, seed=0) as plain:
        plain.add(obs=[1.0, 2.0])
        assert plain.update_priorities([0, 1], [3.0, 3.0]) == 2   # default: cpprb's default
    with pytest.raises(TypeError, match="check_for_update must be a bool"):
        PrioritizedReplayBuffer(4, {"obs": {}}, check_for_update="yes")


def test_mp_prioritized_views_check_for_updates_too():
    with MPPrioritizedReplayBuffer(4, {"obs": {}}, seed=1) as rb:
        view = pickle.loads(pickle.dumps(rb))
        try:
            assert type(view) is MPPrioritizedReplayBuffer
            rb.add(obs=[1.0, 2.0, 3.0, 4.0])
            batch = view.sample(16)
            rb.add(obs=[0.0] * 4)
            assert view.update_priorities(batch["indexes"], np.ones(16)) == 0
            batch = view.sample(16)
            assert view.update_priorities(batch["indexes"], np.full(16, 2.0)) == 16
        finally:
            view.close()
    with pytest.raises(ValueError, match="always checks for updates"):
        MPPrioritizedReplayBuffer(4, {"obs": {}}, check_for_update=False)


# -- get_all_transitions(shuffle=), is_Nstep, get_current_episode_len ------------------------------

def test_get_all_transitions_shuffle():
    with ReplayBuffer(16, ENV) as rb:
        rb.add(**steps(10))
        ordered = rb.get_all_transitions()
        np.random.seed(3)  # noqa: NPY002 (shuffle uses numpy's global state, as cpprb)
        mixed = rb.get_all_transitions(shuffle=True)
        np.random.seed(3)  # noqa: NPY002 (shuffle uses numpy's global state, as cpprb)
        again = rb.get_all_transitions(shuffle=True)
        with pytest.raises(TypeError, match="shuffle must be a bool"):
            rb.get_all_transitions(shuffle="yes")
    order = np.argsort(mixed["act"].ravel())
    assert not np.array_equal(mixed["act"].ravel(), ordered["act"].ravel())
    for name in ENV:   # one permutation for every column
        assert np.array_equal(mixed[name][order], ordered[name])
        assert np.array_equal(mixed[name], again[name])


def test_is_nstep_and_episode_length():
    env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    with ReplayBuffer(8, env, Nstep={"size": 2, "gamma": 0.9, "rew": "rew",
                                     "next": "next_obs"}) as rb:
        assert rb.is_Nstep() is True
        # cpprb counts the rows stored: the N-step transitions, one step behind here.
        rb.add(obs=[0, 1, 2], rew=[1, 1, 1], next_obs=[1, 2, 3], done=[0, 0, 0])
        assert rb.get_current_episode_len() == 2
        rb.on_episode_end()
        assert rb.get_current_episode_len() == 0
    with MPReplayBuffer(8, env) as plain:
        assert plain.is_Nstep() is False
        plain.add(obs=1, rew=1, next_obs=2, done=0)
        view = MPReplayBuffer.attach(plain.name)
        try:
            assert plain.get_current_episode_len() == 1
            assert view.get_current_episode_len() == 0   # counts from when it was attached
            view.add(obs=1, rew=1, next_obs=2, done=0)
            # The count is the buffer's: another writer's rows count too.
            assert view.get_current_episode_len() == 1 and plain.get_current_episode_len() == 2
            plain.clear()
            assert plain.get_current_episode_len() == 0
        finally:
            view.close()


# -- MP names --------------------------------------------------------------------------------------

def test_mp_names_take_cpprbs_arguments():
    assert cpprb_ray.MPReplayBuffer is MPReplayBuffer
    assert "MPPrioritizedReplayBuffer" in cpprb_ray.__all__
    ctx = multiprocessing.get_context("spawn")
    import logging
    with MPReplayBuffer(8, {"obs": {}}, np.float64, ctx=ctx, logger=logging.getLogger("x"),
                        backend="sharedctypes") as rb:
        assert rb.env_dict["obs"]["dtype"] == np.float64
        assert rb.backend == ("shm" if sys.version_info >= (3, 8) else "mmap")
    with MPPrioritizedReplayBuffer(8, {"obs": {}}, 0.5, eps=0.01, backend="mmap") as rb:
        assert rb.backend == "mmap" and isinstance(rb, PrioritizedReplayBuffer)
    with pytest.raises(TypeError, match="ctx must be None, a multiprocessing context"):
        MPReplayBuffer(8, {"obs": {}}, ctx="fork")
    with pytest.raises(TypeError, match="logger must be None or a logging.Logger"):
        MPPrioritizedReplayBuffer(8, {"obs": {}}, logger="log")
    with pytest.raises(ValueError, match="backend"):
        MPReplayBuffer(8, {"obs": {}}, backend="nccl")


def _mp_child_adds(rb):
    rb.add(obs=[1.0, 2.0, 3.0])
    rb.close()


def test_mp_buffer_shared_with_a_spawned_child():
    ctx = multiprocessing.get_context("spawn")
    with MPReplayBuffer(8, {"obs": {}}, ctx=ctx) as rb:
        child = ctx.Process(target=_mp_child_adds, args=(rb,))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert rb.get_all_transitions()["obs"].ravel().tolist() == [1.0, 2.0, 3.0]


# -- transitions files -----------------------------------------------------------------------------

def test_transitions_round_trip_keeps_dtypes_and_order(tmp_path):
    file = tmp_path / "t.npz"
    with PrioritizedReplayBuffer(16, ENV) as rb:
        rb.add(**steps(5))
        rb.save_transitions(str(file), safe=False)     # safe=False: the same safe form here
        saved = rb.get_all_transitions()
    with PrioritizedReplayBuffer(16, ENV) as copy:
        copy.load_transitions(file)                        # a PathLike works too
        loaded = copy.get_all_transitions()
        assert copy.get_max_priority() == 1.0
    for name in ENV:
        assert loaded[name].dtype == saved[name].dtype
        assert np.array_equal(loaded[name], saved[name])


def test_transitions_of_an_nstep_buffer(tmp_path):
    env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    spec = {"size": 3, "gamma": 0.5, "rew": "rew", "next": "next_obs"}
    file = tmp_path / "n.npz"
    with ReplayBuffer(16, env, Nstep=spec) as rb:
        for t in range(5):
            rb.add(obs=t, rew=1.0, next_obs=t + 1, done=float(t == 4))
        rb.save_transitions(file)
        saved = rb.get_all_transitions()
    with ReplayBuffer(16, env, Nstep=spec) as copy:
        copy.load_transitions(file)
        loaded = copy.get_all_transitions()
    assert sorted(loaded) == sorted(saved) and "discounts" in loaded
    for name in saved:
        assert np.array_equal(loaded[name], saved[name])
    with ReplayBuffer(16, env) as plain, pytest.raises(ValueError, match="N-step transitions"):
        plain.load_transitions(file)


def test_transitions_files_that_cannot_load_say_why(tmp_path):
    with ReplayBuffer(8, {"obs": {}}) as rb:
        rb.add(obs=[1.0])
        rb.save_transitions(tmp_path / "obs.npz")
        with ReplayBuffer(8, {"state": {}}) as other:
            with pytest.raises(ValueError, match=r"holds the columns \['obs'\]"):
                other.load_transitions(tmp_path / "obs.npz")
            assert other.get_stored_size() == 0
        (tmp_path / "junk.npz").write_bytes(b"not a zip")
        with pytest.raises(ValueError, match="not an .npz"):
            rb.load_transitions(tmp_path / "junk.npz")
        np.savez(tmp_path / "v2.npz", safe=True, version=2, data={}, Nstep=False)
        with pytest.raises(ValueError, match="format version 2"):
            rb.load_transitions(tmp_path / "v2.npz")
        np.savez(tmp_path / "partial.npz", version=1)
        with pytest.raises(ValueError, match="it has no 'safe'"):
            rb.load_transitions(tmp_path / "partial.npz")
        with pytest.raises(TypeError, match="safe must be a bool"):
            rb.save_transitions(tmp_path / "x.npz", safe=None)
        assert rb.get_stored_size() == 1


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_crafted_transitions_file_cannot_run_code(tmp_path):
    file = tmp_path / "evil.npz"
    payload = io.BytesIO()
    np.lib.format.write_array(payload, np.array({"obs": _RunsCode()}, dtype=object),
                              allow_pickle=True)
    with zipfile.ZipFile(file, "w") as archive:
        for key, value in (("safe", True), ("version", 1), ("Nstep", False)):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.array(value))
            archive.writestr(key + ".npy", member.getvalue())
        archive.writestr("data.npy", payload.getvalue())
    with ReplayBuffer(8, {"obs": {}}) as rb:
        with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
            rb.load_transitions(file)
        assert rb.get_stored_size() == 0


# -- cpprb side by side ----------------------------------------------------------------------------

def test_files_move_between_cpprb_and_cpprb_ray(tmp_path):
    cpprb = pytest.importorskip("cpprb")
    theirs = cpprb.ReplayBuffer(16, ENV)
    theirs.add(**steps(6))
    theirs.save_transitions(str(tmp_path / "cpprb.npz"))
    with ReplayBuffer(16, ENV) as ours:
        ours.load_transitions(tmp_path / "cpprb.npz")
        mine = ours.get_all_transitions()
        ours.add(**steps(3, start=6))
        ours.save_transitions(str(tmp_path / "ours.npz"))
        expected = ours.get_all_transitions()
    reference = theirs.get_all_transitions()
    for name in ENV:
        assert mine[name].dtype == reference[name].dtype
        assert np.array_equal(mine[name], reference[name])
    back = cpprb.PrioritizedReplayBuffer(16, ENV)
    back.load_transitions(str(tmp_path / "ours.npz"))
    loaded = back.get_all_transitions()
    assert back.get_stored_size() == 9
    for name in ENV:
        assert np.array_equal(loaded[name], expected[name])


@pytest.mark.parametrize("next_of", [None, "obs"])
def test_cpprb_unsafe_files_load_as_cpprb_loads_them(tmp_path, next_of):
    """cpprb's safe=False files hold its raw ring and its cache of episode ends: they load into
    a buffer with or without next_of, as the rows cpprb's own loader adds."""
    cpprb = pytest.importorskip("cpprb")
    theirs = cpprb.ReplayBuffer(6, {"obs": {"shape": (2, 3)}, "done": {}}, next_of="obs",
                                stack_compress="obs")
    frames = np.arange(40.0).reshape(20, 2)
    stack = lambda t: frames[t:t + 3].T   # noqa: E731 (a frame stack: the last axis)
    for episode, steps in ((0, 4), (10, 5)):   # two episodes, the ring wraps
        for t in range(episode, episode + steps):
            theirs.add(obs=stack(t), next_obs=stack(t + 1), done=float(t == episode + steps - 1))
        theirs.on_episode_end()
    theirs.save_transitions(str(tmp_path / "unsafe.npz"), safe=False)
    expected = theirs.get_all_transitions()
    env = {"obs": {"shape": (2, 3)}, "done": {}}
    if next_of is None:
        env["next_obs"] = {"shape": (2, 3)}
    with ReplayBuffer(6, env, next_of=next_of) as ours:
        ours.load_transitions(tmp_path / "unsafe.npz")
        rows = ours.get_all_transitions()
    got = sorted(zip(rows["obs"].tolist(), rows["next_obs"].tolist()))
    assert got == sorted(zip(expected["obs"].tolist(), expected["next_obs"].tolist()))


def _pair(cpprb, name, *args, **kwargs):
    theirs = getattr(cpprb, name)(*args, **kwargs)
    ours = getattr(cpprb_ray, name)(*args, **kwargs)
    return theirs, ours


@pytest.mark.parametrize("name", CPPRB_CLASSES)
def test_api_parity_side_by_side(name, tmp_path):
    """The same constructor call and the same calls of every shared method on cpprb and
    cpprb_ray: the same stored sizes, indexes, transitions, shapes, dtypes and priorities."""
    cpprb = pytest.importorskip("cpprb")
    prioritized = "Prioritized" in name
    theirs, ours = _pair(cpprb, name, 1e1, ENV)
    try:
        assert ours.get_buffer_size() == theirs.get_buffer_size() == 10
        for count in (1, 3, 4):
            batch = steps(count, start=ours.get_stored_size())
            first_ours, first_theirs = ours.add(**batch), theirs.add(**batch)
            assert first_ours == first_theirs
            assert ours.get_stored_size() == theirs.get_stored_size()
            assert ours.get_next_index() == theirs.get_next_index()
        single = {"obs": [1.0, 2.0, 3.0], "act": 7, "rew": 0.5, "done": 0.0}
        assert ours.add(**single) == theirs.add(**single)
        ours.on_episode_end()
        theirs.on_episode_end()
        assert ours.is_Nstep() == theirs.is_Nstep() is False
        all_ours, all_theirs = ours.get_all_transitions(), theirs.get_all_transitions()
        assert sorted(all_ours) == sorted(all_theirs)
        for key in all_theirs:
            assert all_ours[key].dtype == all_theirs[key].dtype, key
            assert np.array_equal(all_ours[key], all_theirs[key]), key
        shuffled_ours = ours.get_all_transitions(shuffle=True)
        assert {k: v.shape for k, v in shuffled_ours.items()} == \
               {k: v.shape for k, v in theirs.get_all_transitions(shuffle=True).items()}

        sample_ours, sample_theirs = ours.sample(32), theirs.sample(32)
        assert set(sample_theirs) <= set(sample_ours)
        for key, value in sample_theirs.items():
            assert sample_ours[key].shape == value.shape, key
            if key != "indexes":       # cpprb's are uint64 / platform ints; ours int64
                assert sample_ours[key].dtype == value.dtype, key
        if prioritized:
            assert ours.get_max_priority() == theirs.get_max_priority() == 1.0
            # Both check for updates (MP: always; plain: off, so this applies everywhere).
            indexes = np.arange(ours.get_stored_size())
            priorities = np.linspace(0.5, 4.0, len(indexes))
            if name.startswith("MP"):
                ours.sample(1)
                theirs.sample(1)
            theirs.update_priorities(indexes, priorities)
            ours.update_priorities(indexes, priorities)
            assert ours.get_max_priority() == pytest.approx(theirs.get_max_priority())
            # Proportional sampling: the row with priority 4 is drawn most often by both.
            top = int(indexes[-1])
            drawn_ours = np.bincount(ours.sample(4000, beta=0.5)["indexes"], minlength=10)
            drawn_theirs = np.bincount(theirs.sample(4000, beta=0.5)["indexes"].astype(np.int64),
                                       minlength=10)
            assert drawn_ours.argmax() == drawn_theirs.argmax() == top
            weights = ours.sample(64, beta=0.5)["weights"]
            assert weights.dtype == theirs.sample(64, beta=0.5)["weights"].dtype
        file_ours, file_theirs = tmp_path / "ours.npz", tmp_path / "theirs.npz"
        if hasattr(theirs, "save_transitions"):
            ours.save_transitions(str(file_ours))
            theirs.save_transitions(str(file_theirs))
            with np.load(file_ours, allow_pickle=True) as a, \
                    np.load(file_theirs, allow_pickle=True) as b:
                assert sorted(a.files) == sorted(b.files)
        ours.clear()
        theirs.clear()
        assert ours.get_stored_size() == theirs.get_stored_size() == 0
        assert ours.get_next_index() == theirs.get_next_index() == 0
    finally:
        ours.close()


def test_every_cpprb_method_exists_here_and_is_in_the_migration_table():
    cpprb = pytest.importorskip("cpprb")
    with open(os.path.join(DOCS, "migrating.md")) as handle:
        table = handle.read()
    for name in CPPRB_CLASSES:
        theirs = getattr(cpprb, name)
        for method in (m for m in dir(theirs) if not m.startswith("_")):
            assert hasattr(getattr(cpprb_ray, name), method), f"{name}.{method}"
            assert f"`{method}" in table, f"docs/migrating.md lacks {name}.{method}"
        signature = (theirs.__doc__ or "").splitlines()[0]
        for argument in re.findall(r"(\w+)=", signature):
            assert f"`{argument}" in table, f"docs/migrating.md lacks {name}'s {argument}="


# -- floats into integer and bool columns ------------------------------------------------------

CAST_ENV = {"obs": {}, "act": {"dtype": np.int64}, "flag": {"dtype": np.bool_}}
WHOLE_FLOAT_ADDS = [dict(obs=np.zeros(8), act=np.zeros(8), flag=np.zeros(8)),
                    dict(obs=1.0, act=1.0, flag=1.0),
                    dict(obs=2.0, act=np.float32(2), flag=np.float64(0.0)),
                    dict(obs=[3.0, 4.0], act=[3.0, -4.0], flag=[1.0, 0.0])]


@pytest.mark.parametrize("options", [
    {}, {"Nstep": {"size": 2, "gamma": 0.9, "rew": "rew", "next": "next_obs"}},
    {"next_of": "obs", "lanes": 1}], ids=["plain", "nstep", "laned"])
def test_whole_floats_go_into_integer_and_bool_columns_as_cpprb_takes_them(options):
    """cpprb stores act=np.zeros(8), act=1.0 and act=np.float32(2) into an int64 column (and
    0.0/1.0 into a bool one); cpprb_ray raised TypeError "cannot cast float64 to it (same_kind
    casting)". Whole numbers go in as those integers, in every add path."""
    env = dict(CAST_ENV)
    extra = {"next_obs": 0.0} if options else {}
    if "Nstep" in options:
        env.update(rew={}, next_obs={}, done={})
        extra.update(rew=1.0, done=0.0)
    with ReplayBuffer(32, env, **options) as rb:
        for values in WHOLE_FLOAT_ADDS:
            count = len(np.atleast_1d(values["obs"]))
            rb.add(**values, **{k: np.full(count, v) for k, v in extra.items()})
        rb.on_episode_end()
        stored = rb.get_all_transitions()
    assert stored["act"].dtype == np.int64 and stored["flag"].dtype == np.bool_
    assert stored["act"].ravel().tolist() == [0] * 8 + [1, 2, 3, -4]
    assert stored["flag"].ravel().tolist() == [False] * 8 + [True, False, True, False]


def test_whole_floats_are_stored_as_cpprb_stores_them():
    cpprb = pytest.importorskip("cpprb")
    theirs = cpprb.ReplayBuffer(32, CAST_ENV)
    with ReplayBuffer(32, CAST_ENV) as ours:
        for values in WHOLE_FLOAT_ADDS:
            ours.add(**values)
            theirs.add(**values)
        mine, cpprbs = ours.get_all_transitions(), theirs.get_all_transitions()
    for key in CAST_ENV:
        np.testing.assert_array_equal(mine[key], cpprbs[key], err_msg=key)
        assert mine[key].dtype == cpprbs[key].dtype, key


@pytest.mark.parametrize("values, message", [
    (dict(act=1.5), "column 'act' has dtype int64; got 1.5, not a whole number"),
    (dict(act=np.array([1.0, np.nan, 2.0]), obs=np.zeros(3), flag=np.zeros(3)),
     r"column 'act' has dtype int64; got nan at index \(1,\), not a whole number"),
    (dict(act=np.float32(np.inf)), "got inf, not a whole number"),
    (dict(act=-np.inf), "got -inf, not a whole number"),
    (dict(act=1e19), r"got 1e\+19, not a whole number within \[-9223372036854775808, "),
    (dict(flag=0.5), "column 'flag' has dtype bool; got 0.5, not 0 or 1"),
    (dict(flag=[1.0, 2.0], obs=[0.0, 0.0], act=[0, 0]), r"got 2.0 at index \(1,\), not 0 or 1"),
])
def test_a_float_an_integer_column_cannot_hold_is_refused_by_name_and_position(values, message):
    """Where cpprb's astype would store 1.5 as 1, NaN or inf as whatever the platform gives,
    cpprb_ray refuses, naming the column and the first bad position; nothing is added."""
    with ReplayBuffer(32, CAST_ENV) as rb:
        rb.add(obs=0.0, act=0, flag=False)
        with pytest.raises(ValueError, match=message):
            rb.add(**dict(dict(obs=0.0, act=0, flag=False), **values))
        assert rb.get_stored_size() == 1
