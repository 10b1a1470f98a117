"""Invalid input raises a clear exception that names the culprit, and changes nothing.

For calls on a live buffer the whole observable state (sizes, max priority, every stored row and
the trees) is compared before and after; constructors must leave no segment behind (conftest's
leak check), and attach must refuse anything that is not a whole cpprb_ray buffer with a
ValueError instead of crashing.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import cpprb_ray
from cpprb_ray import PrioritizedReplayBuffer, ReplayBuffer, _segment

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:   # conftest by name, whatever pytest's import mode
    sys.path.insert(0, TESTS_DIR)

from conftest import ours  # noqa: E402

ENV = {"obs": {"shape": 3}, "act": {"dtype": np.int64}, "rew": {}}
HEADER_BYTES = 256    # the fixed header fields, after an 8-byte magic (see _store.pyx)


def rows(start: int, count: int) -> dict:
    k = np.arange(start, start + count)
    return {"obs": k[:, None] + np.array([0.0, 0.25, 0.5]), "act": k, "rew": k * 1.0}


def state(rb) -> tuple:
    """Everything observable about a buffer's content."""
    root_sum, sums, root_min, mins = rb._store.check_tree()
    maximum = rb.get_max_priority() if isinstance(rb, PrioritizedReplayBuffer) else None
    return (rb.get_stored_size(), rb.get_next_index(), maximum, rb.get_all_transitions(),
            root_sum, sums, root_min, mins)


def assert_same_state(before: tuple, after: tuple) -> None:
    assert before[:3] == after[:3]
    assert sorted(before[3]) == sorted(after[3])
    for key in before[3]:
        np.testing.assert_array_equal(before[3][key], after[3][key], err_msg=key)
    assert before[4] == after[4] and before[6] == after[6]
    np.testing.assert_array_equal(before[5], after[5])
    np.testing.assert_array_equal(before[7], after[7])


@pytest.fixture(params=[PrioritizedReplayBuffer, ReplayBuffer], ids=["per", "uniform"])
def filled(request, backend):
    """A buffer of capacity 8 holding 5 rows with distinct priorities (per)."""
    rb = request.param(8, ENV, backend=backend, seed=0)
    if request.param is PrioritizedReplayBuffer:
        rb.add(**rows(0, 5), priorities=[0.5, 1.0, 2.0, 3.0, 4.0])
    else:
        rb.add(**rows(0, 5))
    yield rb
    rb.close()


@pytest.fixture
def per(backend):
    rb = PrioritizedReplayBuffer(8, ENV, backend=backend, seed=0)
    rb.add(**rows(0, 5), priorities=[0.5, 1.0, 2.0, 3.0, 4.0])
    yield rb
    rb.close()


def check_refused(rb, call, error, match):
    before = state(rb)
    with pytest.raises(error, match=match):
        call()
    assert_same_state(before, state(rb))


# ---------------------------------------------------------------------------------------------
# add


ONE = {"obs": [1.0, 2.0, 3.0], "act": 1, "rew": 0.5}
BAD_ADDS = {
    "missing column": ({"obs": [1.0, 2.0, 3.0], "act": 1}, ValueError, "rew"),
    "unknown column": (dict(ONE, bogus=1.0), ValueError, "bogus"),
    "wrong shape": (dict(ONE, obs=[1.0, 2.0]), ValueError, "obs"),
    "wrong batch shape": (dict(rows(0, 2), obs=np.ones((2, 4))), ValueError, "obs"),
    "scalar for a vector column": (dict(ONE, obs=1.0), ValueError, "obs"),
    "too many axes": (dict(ONE, rew=np.ones((2, 1, 1))), ValueError, "rew"),
    "float into int64": (dict(ONE, act=1.5), ValueError, "act.*1.5, not a whole number"),
    "fraction in a float batch into int64": (dict(rows(0, 2), act=np.array([1.0, 2.5])),
                                             ValueError, r"act.*2.5 at index \(1,\)"),
    "inf into int64": (dict(ONE, act=float("inf")), ValueError, "act.*inf, not a whole"),
    "2**63 as a float into int64": (dict(ONE, act=2.0**63), ValueError,
                                    "act.*within \\[-9223372036854775808"),
    "str values": (dict(ONE, obs=["a", "b", "c"]), TypeError, "obs"),
    "str scalar": (dict(ONE, rew="0.5"), TypeError, "rew"),
    "object values": (dict(ONE, rew=object()), TypeError, "rew"),
    "complex into float": (dict(ONE, rew=1j), TypeError, "rew"),
    "too large int": (dict(ONE, act=2 ** 70), ValueError,
                      r"column 'act' has dtype int64; got 1180591620717411303424, outside"),
    # A Python int is taken by its value: one past the column's range is refused, where numpy's
    # same_kind cast of its int64 array had wrapped it (300 stored as 44, 2**63 as -2**63).
    "int past int64": (dict(ONE, act=2 ** 63), ValueError, r"column 'act' .* outside its range"),
    "ints past int64 in a list": (dict(rows(0, 2), act=[1, 2 ** 63]), ValueError,
                                  r"column 'act' .* got 9223372036854775808, outside"),
    "ragged list in a column": (dict(rows(0, 2), obs=[[1.0, 2.0, 3.0], [1.0, 2.0]]), ValueError,
                                r"column 'obs' must be a rectangular array"),
    "ragged batch": (dict(rows(0, 3), act=np.arange(2)), ValueError, "ragged"),
    "ragged batch, single first": (dict(rows(0, 3), obs=[1.0, 2.0, 3.0]), ValueError, "ragged"),
    "empty batch": (rows(0, 0), ValueError, "at least one row"),
}


@pytest.mark.parametrize("case", sorted(BAD_ADDS))
def test_bad_add(filled, case):
    columns, error, match = BAD_ADDS[case]
    check_refused(filled, lambda: filled.add(**columns), error, match)


NARROW = {"obs": {"shape": 2, "dtype": np.uint8}, "act": {"dtype": np.int8},
          "next_obs": {"shape": 2, "dtype": np.uint8}, "rew": {}, "done": {}}
ADD_PATHS = {
    "plain": {},
    "N-step": {"Nstep": {"size": 2, "gamma": 0.5, "rew": "rew", "next": "next_obs"}},
    "frames": {"next_of": "obs", "lanes": 1},
}


@pytest.mark.parametrize("path", sorted(ADD_PATHS))
def test_python_ints_are_taken_by_their_value_in_every_add_path(path):
    """A Python int goes into any integer column it fits (cpprb takes 1 into a uint8 column;
    numpy's same_kind rule for its int64 array refused it), and one that does not fit is
    refused naming the column, never wrapped (300 into int8 had stored 44)."""
    with ReplayBuffer(16, NARROW, **ADD_PATHS[path]) as rb:
        rb.add(obs=[0, 255], act=-128, next_obs=[1, 2], rew=0.5, done=0)
        rb.add(obs=[[3, 4], [5, 6]], act=[127, 0], next_obs=[[4, 5], [6, 7]], rew=[1.0, 1.0],
               done=[0, 1])
        before = rb.get_all_transitions()
        for bad, column in ((dict(act=300), "act"), (dict(act=[1, -129]), "act"),
                            (dict(obs=[0, 256]), "obs"), (dict(obs=[-1, 0]), "obs"),
                            (dict(act=2**63), "act"), (dict(act=10**400), "act")):
            one = dict(obs=[0, 1], act=1, next_obs=[1, 2], rew=0.0, done=0)
            if isinstance(bad.get("act"), list):
                one = dict(obs=[[0, 1], [2, 3]], act=None, next_obs=[[1, 2], [3, 4]],
                           rew=[0.0, 0.0], done=[0, 0])
            one.update(bad)
            with pytest.raises(ValueError, match=rf"column '{column}' has dtype \w+; got "
                                                 rf"-?\d+(\.\.\.)?, outside its range"):
                rb.add(**one)
            after = rb.get_all_transitions()
            assert all(np.array_equal(before[key], after[key]) for key in before), bad
        rows_stored = rb.get_all_transitions()
        assert rows_stored["act"].dtype == np.int8 and rows_stored["obs"].dtype == np.uint8
        assert rows_stored["act"].ravel().tolist()[:1] == [-128]


def test_add_no_arguments(filled):
    check_refused(filled, filled.add, ValueError, "obs")


BAD_PRIORITIES = {
    "nan": ([1.0, math.nan], ValueError),
    "inf": ([1.0, math.inf], ValueError),
    "negative": ([1.0, -0.5], ValueError),
    "too few": ([1.0], ValueError),
    "too many": ([1.0, 2.0, 3.0], ValueError),
    "2-D": ([[1.0], [2.0]], ValueError),
    "strings": (["1", "2"], TypeError),
    "bools": ([True, False], TypeError),
}


@pytest.mark.parametrize("case", sorted(BAD_PRIORITIES))
def test_bad_add_priorities(per, case):
    priorities, error = BAD_PRIORITIES[case]
    check_refused(per, lambda: per.add(**rows(10, 2), priorities=priorities), error,
                  "priorities")


def test_bad_single_priority(per):
    check_refused(per, lambda: per.add(**ONE, priorities=math.nan), ValueError, "priorities")
    check_refused(per, lambda: per.add(**ONE, priorities=-1.0), ValueError, "priorities")
    # An int past any float: named, and shown cut (its 401 digits hid the message).
    check_refused(per, lambda: per.add(**ONE, priorities=10**400), ValueError,
                  r"priorities must be finite and >= 0; got 10{23}\.\.\. at position 0")


# ---------------------------------------------------------------------------------------------
# sample


@pytest.mark.parametrize("batch_size, error", [
    (0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("4", TypeError),
    (None, TypeError), (np.float64(3), TypeError),
    # Past int64 (an OverflowError of the conversion, naming nothing, before), and past what
    # any output could hold (its scratch's size would wrap).
    pytest.param(2**63, ValueError, id="2**63"), pytest.param(10**400, ValueError, id="10**400"),
    pytest.param(np.uint64(2**63), ValueError, id="np.uint64(2**63)"),
    pytest.param(2**62, ValueError, id="2**62"), pytest.param(2**61 + 5, ValueError, id="2**61+5"),
    # An np.integer whose int() is a datetime.timedelta: refused as not an int, by name.
    pytest.param(np.timedelta64(2, "s"), TypeError, id="timedelta64"),
])
def test_bad_batch_size(filled, batch_size, error):
    check_refused(filled, lambda: filled.sample(batch_size), error, "batch_size")


@pytest.mark.parametrize("beta, error", [
    (-0.1, ValueError), (math.nan, ValueError), (math.inf, ValueError), ("0.4", TypeError),
    (None, TypeError), pytest.param(10**400, ValueError, id="10**400"),
    pytest.param(np.timedelta64(2, "s"), TypeError, id="timedelta64"),
])
def test_bad_beta(per, beta, error):
    check_refused(per, lambda: per.sample(4, beta=beta), error, "beta")


def test_sample_empty_changes_nothing(backend):
    with PrioritizedReplayBuffer(4, ENV, backend=backend) as rb:
        check_refused(rb, lambda: rb.sample(2), ValueError, "empty")


# ---------------------------------------------------------------------------------------------
# update_priorities


BAD_UPDATES = {
    "index out of range": (([0, 8], [1.0, 1.0]), IndexError, "indexes"),
    "index far out of range": (([2 ** 40], [1.0]), IndexError, "indexes"),
    "index not yet written": (([1, 5], [1.0, 1.0]), IndexError, "indexes"),
    "negative index": (([1, -1], [1.0, 1.0]), IndexError, "indexes"),
    # Whole floats are indexes, as in cpprb (tests/test_cpprb_api.py); a fraction is none.
    "fractional indexes": (([0.0, 1.5], [1.0, 1.0]), ValueError,
                           "indexes must be whole numbers; got 1.5 at position 1"),
    "nan indexes": (([math.nan], [1.0]), ValueError, "indexes must be whole numbers"),
    "float index past int64": (([2.0**70], [1.0]), IndexError, "indexes must be below"),
    "str indexes": ((["0"], [1.0]), TypeError, "indexes"),
    "2-D indexes": (([[0, 1]], [1.0, 1.0]), ValueError, "indexes"),
    "2-D int64 array indexes": ((np.array([[0, 1]], dtype=np.int64), [1.0, 1.0]), ValueError,
                                "indexes"),
    "too few priorities": (([0, 1], [1.0]), ValueError, "priorities"),
    "too many priorities": (([0, 1], [1.0, 2.0, 3.0]), ValueError, "priorities"),
    "nan priority": (([0, 1], [1.0, math.nan]), ValueError, "priorities"),
    "inf priority": (([0, 1], [math.inf, 1.0]), ValueError, "priorities"),
    "negative priority": (([0, 1], [1.0, -2.0]), ValueError, "priorities"),
    "too few generations": (([0, 1], [1.0, 1.0], [2]), ValueError, "generations"),
    "too many generations": (([0, 1], [1.0, 1.0], [2, 2, 2]), ValueError, "generations"),
    "float generations": (([0, 1], [1.0, 1.0], [2.0, 2.0]), TypeError, "generations"),
    "negative generations": (([0, 1], [1.0, 1.0], [2, -2]), ValueError,
                             "generations must be >= 0; got -2 at position 1"),
    # Python ints past int64 and uint64 are numpy's object arrays: they were "must be real
    # numbers; got dtype object" (a priority) or "must be integers" (an index), for ints.
    "priority past any float": (([0], [10 ** 400]), ValueError, "priorities must be finite"),
    "index past uint64": (([2 ** 64], [1.0]), IndexError, "indexes must be below the stored"),
    "index below int64": (([-2 ** 63 - 1], [1.0]), IndexError, "indexes"),
    "generation past uint64": (([0], [1.0], [2 ** 64]), ValueError, "generations must be in"),
    "timedelta64 indexes": ((np.array([0], "m8[s]"), [1.0]), TypeError, "indexes"),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_bad_update(per, case):
    arguments, error, match = BAD_UPDATES[case]
    check_refused(per, lambda: per.update_priorities(*arguments), error, match)


def test_bad_update_keeps_earlier_entries_unapplied(per):
    """Validation happens before anything is written: a bad last entry blocks the good ones."""
    sample = per.sample(4)
    indexes = np.append(sample["indexes"], 7)
    check_refused(per, lambda: per.update_priorities(indexes, np.full(5, 9.0)), IndexError,
                  "indexes")


# ---------------------------------------------------------------------------------------------
# constructor


BAD_CONSTRUCTORS = {
    "size 0": (dict(size=0), ValueError, "size"),
    "size negative": (dict(size=-4), ValueError, "size"),
    "size float": (dict(size=8.5), ValueError, "size"),
    "size bool": (dict(size=True), TypeError, "size"),
    "size str": (dict(size="8"), TypeError, "size"),
    # More than a file holds: refused before anything is made (it was fallocate's
    # OverflowError, naming nothing; 2**62 also wrapped the tree's int64 size).
    "size past a file": (dict(size=1 << 62), ValueError, "size 4611686018427387904 makes a "
                         r"segment of more than 2\*\*63 - 1 bytes"),
    "size past a file, rows": (dict(size=1 << 55, env_dict={"obs": {"shape": 1024}}),
                               ValueError, "size 36028797018963968 makes a segment"),
    # Past int64: checking alpha against the size converted it first (an OverflowError).
    "size past int64": (dict(size=1 << 63), ValueError, "size 9223372036854775808 makes a"),
    "size past any float": (dict(size=10**400), ValueError,
                            r"size 10{23}\.\.\. makes a segment"),
    "empty env_dict": (dict(env_dict={}), ValueError, "env_dict"),
    "env_dict not a dict": (dict(env_dict=[("obs", {})]), TypeError, "env_dict"),
    "alpha negative": (dict(alpha=-0.1), ValueError, "alpha"),
    "alpha nan": (dict(alpha=math.nan), ValueError, "alpha"),
    "alpha str": (dict(alpha="0.6"), TypeError, "alpha"),
    "alpha past any float": (dict(alpha=10**400), ValueError, "alpha must be finite"),
    "alpha timedelta64": (dict(alpha=np.timedelta64(1, "s")), TypeError, "alpha"),
    "size timedelta64": (dict(size=np.timedelta64(8, "s")), TypeError, "size must be an int"),
    "seed timedelta64": (dict(seed=np.timedelta64(8, "s")), TypeError, "seed"),
    "shape timedelta64": (dict(env_dict={"obs": {"shape": np.timedelta64(3, "s")}}), TypeError,
                          "shape"),
    # numpy arrays have at most 64 dimensions (32 before numpy 2), and a batch adds one: such a
    # buffer took rows it could never return ("maximum supported dimension", naming nothing).
    "shape past numpy's dimensions": (dict(env_dict={"obs": {"shape": (1,) * 64}}), ValueError,
                                      r"env_dict\['obs'\]\['shape'\] has 64 dimensions"),
    # A NUL ended the name where the system read it: 'a\0b' made (and attached to) 'a'.
    "name with NUL": (dict(name="cpprb_ray_nul\0tail"), ValueError, "name must be .* NUL"),
    "path with NUL": (dict(backend="mmap", path="/tmp/cpprb_ray_test_never_created\0x"),
                      ValueError, "path must not contain NUL"),
    "eps past any float": (dict(eps=10**400), ValueError, "eps must be finite"),
    "lock_timeout past any float": (dict(lock_timeout=10**400), ValueError,
                                    "lock_timeout must be finite"),
    "eps negative": (dict(eps=-1e-6), ValueError, "eps"),
    "eps nan": (dict(eps=math.nan), ValueError, "eps"),
    "unknown dtype": (dict(env_dict={"obs": {"dtype": "notadtype"}}), TypeError, "dtype"),
    "object dtype": (dict(env_dict={"obs": {"dtype": object}}), TypeError, "dtype"),
    "str dtype": (dict(env_dict={"obs": {"dtype": str}}), TypeError, "dtype"),
    "record dtype": (dict(env_dict={"obs": {"dtype": [("a", "f4"), ("b", "i4")]}}),
                     TypeError, "dtype"),
    "shape 0": (dict(env_dict={"obs": {"shape": 0}}), ValueError, "shape"),
    "shape negative": (dict(env_dict={"obs": {"shape": -2}}), ValueError, "shape"),
    "shape with a 0": (dict(env_dict={"obs": {"shape": (3, 0)}}), ValueError, "shape"),
    "shape str": (dict(env_dict={"obs": {"shape": "3"}}), TypeError, "shape"),
    "shape float": (dict(env_dict={"obs": {"shape": 3.0}}), TypeError, "shape"),
    "reserved key indexes": (dict(env_dict={"indexes": {}}), ValueError, "indexes"),
    "reserved key weights": (dict(env_dict={"obs": {}, "weights": {}}), ValueError, "weights"),
    "reserved key priorities": (dict(env_dict={"priorities": {}}), ValueError, "priorities"),
    "unknown spec key": (dict(env_dict={"obs": {"shape": 3, "dtpye": "f4"}}), ValueError,
                         "dtpye"),
    "backend bogus": (dict(backend="bogus"), ValueError, "backend"),
    "path with shm": (dict(backend="shm", path="/tmp/cpprb_ray_test_never_created"),
                      ValueError, "path"),
    "seed negative": (dict(seed=-1), ValueError, "seed"),
    "seed float": (dict(seed=1.5), TypeError, "seed"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONSTRUCTORS))
def test_bad_constructor(case):
    overrides, error, match = BAD_CONSTRUCTORS[case]
    arguments = dict(size=8, env_dict=ENV, alpha=0.6, eps=1e-4, backend="auto")
    arguments.update(overrides)
    if arguments["backend"] == "shm" and not cpprb_ray._memory.shm_available():
        match = "shm"                            # Python 3.7: no shm backend at all
    with pytest.raises(error, match=match):
        PrioritizedReplayBuffer(arguments.pop("size"), arguments.pop("env_dict"), **arguments)
    assert not os.path.exists("/tmp/cpprb_ray_test_never_created")


def _segment_files() -> set:
    return {os.path.join("/dev/shm", name) for name in os.listdir("/dev/shm")
            if name.startswith("cpprb_ray")} if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, ReplayBuffer])
def test_negative_seed_leaves_nothing_behind(backend, cls):
    before = _segment_files()
    with pytest.raises(ValueError, match="seed"):
        cls(8, ENV, backend=backend, seed=-1)
    # Only this process's: another run on this host makes segments meanwhile.
    leaked = {path for path in _segment_files() - before if ours(path)}
    for path in leaked:               # clean up here, and say what leaked in this test
        os.unlink(path)
    assert not leaked


@pytest.mark.parametrize("case", ["size 0", "size float", "empty env_dict", "shape 0",
                                  "object dtype", "reserved key indexes", "backend bogus"])
def test_bad_constructor_uniform(case):
    overrides, error, match = BAD_CONSTRUCTORS[case]
    arguments = dict(size=8, env_dict=ENV, backend="auto")
    arguments.update(overrides)
    with pytest.raises(error, match=match):
        ReplayBuffer(arguments.pop("size"), arguments.pop("env_dict"), **arguments)


def test_uniform_buffer_takes_no_alpha():
    with pytest.raises(TypeError, match="alpha"):
        ReplayBuffer(8, ENV, alpha=0.6)


def test_name_that_exists(backend):
    with PrioritizedReplayBuffer(8, ENV, backend=backend) as rb:
        rb.add(**rows(0, 2))
        before = state(rb)
        with pytest.raises(FileExistsError):
            PrioritizedReplayBuffer(8, ENV, backend=backend, name=os.path.basename(rb.name))
        assert_same_state(before, state(rb))
        assert os.path.exists(rb.name if backend == "mmap" else "/dev/shm/" + rb.name)


def test_path_that_exists(tmp_path):
    path = tmp_path / "taken.bin"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        PrioritizedReplayBuffer(8, ENV, backend="mmap", path=path)
    assert path.read_bytes() == b"precious"


def test_name_and_path_together(tmp_path):
    with pytest.raises(ValueError, match="name"):
        PrioritizedReplayBuffer(8, ENV, backend="mmap", name="cpprb_ray_test_both",
                                path=tmp_path / "both.bin")
    assert not (tmp_path / "both.bin").exists()
    assert not os.path.exists("/dev/shm/cpprb_ray_test_both")


@pytest.mark.parametrize("name", ["", "a/b", "x" * 300])
def test_bad_name(backend, name):
    with pytest.raises(ValueError, match="name"):
        PrioritizedReplayBuffer(8, ENV, backend=backend, name=name)


# ---------------------------------------------------------------------------------------------
# attach: missing, foreign, truncated, corrupt


def test_attach_missing(backend):
    name = "cpprb_ray_test_missing_" + os.urandom(6).hex()
    target = name if backend == "shm" else os.path.join("/dev/shm", name)
    with pytest.raises(FileNotFoundError):
        PrioritizedReplayBuffer.attach(target)
    with pytest.raises(FileNotFoundError):
        cpprb_ray.attach(target)


def test_attach_bad_argument():
    with pytest.raises(TypeError, match="name_or_path"):
        cpprb_ray.attach(42)
    with pytest.raises(ValueError, match="name_or_path must not contain NUL"):
        cpprb_ray.attach("/tmp/cpprb_ray_test_never_created\0x")
    # A name far too long is shown cut: the message had echoed all 5000 characters.
    with pytest.raises(ValueError, match=r"^name must be 1-200 characters .{0,100}\.\.\.$"):
        cpprb_ray.attach("x" * 5000)


def test_numbers_in_messages_are_cut():
    # A size or lane count of 10**400 was echoed whole (401 digits) in its error.
    with pytest.raises(ValueError) as caught:
        ReplayBuffer(8, {"obs": {"shape": 4, "dtype": np.uint8}}, lanes=10**400)
    assert "lanes=100000000000000000000000..." in str(caught.value)
    assert len(str(caught.value)) < 200


def test_update_takes_python_ints_past_int64_as_add_does(per):
    # add took priorities=2**64 (1.8e19); update refused the same int as "not real numbers".
    per.update_priorities([0], [2**64])
    per.add(**ONE, priorities=2**64)
    assert per.get_max_priority() == float(2**64)


def _real_bytes(backend: str, prioritized: bool = True) -> bytes:
    cls = PrioritizedReplayBuffer if prioritized else ReplayBuffer
    with cls(64, ENV, backend=backend) as rb:
        rb.add(**rows(0, 10))
        path = rb.name if backend == "mmap" else os.path.join("/dev/shm", rb.name)
        with open(path, "rb") as handle:
            return handle.read()


def _field_offset(real: bytes, field: str) -> int:
    """Where header field `field` lives: the 8 bytes whose change changes what read_header reads
    (so these tests do not hard-code the header's order)."""
    reference = _segment.read_header(bytearray(real))[field]
    for offset in range(8, HEADER_BYTES, 8):
        data = bytearray(real)
        data[offset:offset + 8] = bytes(b ^ 0x5A for b in data[offset:offset + 8])
        if _segment.read_header(data)[field] != reference:
            return offset
    raise AssertionError(f"header field {field!r} not found")


def _set_field(data: bytearray, field: str, value: int) -> None:
    struct.pack_into("<Q", data, _field_offset(bytes(data), field), value)


def _get_field(data: bytes, field: str) -> int:
    return _segment.read_header(bytearray(data))[field]


def _with_layout(data: bytes, edit) -> bytearray:
    """A copy of a buffer's bytes whose layout JSON went through `edit` (header kept coherent)."""
    data = bytearray(data)
    start, length = _get_field(data, "layout_offset"), _get_field(data, "layout_length")
    document = json.loads(bytes(data[start:start + length]))
    edit(document)
    text = json.dumps(document).encode()
    data[start:start + max(length, len(text))] = text.ljust(length, b" ")
    _set_field(data, "layout_length", len(text))
    return data


def _header_edit(field: str, value: int):
    def edit(real: bytes) -> bytes:
        data = bytearray(real)
        _set_field(data, field, value)
        return bytes(data)
    return edit


def _bytes_edit(offset: int, replacement: bytes):
    def edit(real: bytes) -> bytes:
        data = bytearray(real)
        data[offset:offset + len(replacement)] = replacement
        return bytes(data)
    return edit


def _layout_edit(change):
    return lambda real: bytes(_with_layout(real, change))


def _offset_outside(document):
    document["columns"][0]["offset"] = 1 << 40


def _no_columns(document):
    document["columns"] = []


def _row_bytes_lie(document):
    document["columns"][0]["row_bytes"] += 4


def _dtype_unknown(document):
    document["columns"][0]["dtype"] = "notadtype"


def _shape_missing(document):
    del document["columns"][0]["shape"]


def _columns_not_a_list(document):
    document["columns"] = 7


def CORRUPTIONS_TREE_MISALIGNED(real: bytes) -> bytes:  # noqa: N802 - a CORRUPTIONS entry
    data = bytearray(real)
    _set_field(data, "tree_offset", _get_field(real, "tree_offset") + 4)
    return bytes(data)


def CORRUPTIONS_ROWS_MISALIGNED(real: bytes) -> bytes:  # noqa: N802 - a CORRUPTIONS entry
    data = bytearray(real)
    _set_field(data, "data_offset", _get_field(real, "data_offset") + 4)
    return bytes(data)


CORRUPTIONS = {
    "empty file": lambda real: b"",
    "one byte": lambda real: b"\x00",
    "garbage": lambda real: np.random.default_rng(0).integers(0, 256, len(real),
                                                              dtype=np.uint8).tobytes(),
    "zeros": lambda real: bytes(len(real)),
    "text file": lambda real: b"hello, I am not a replay buffer\n" * 500,
    "truncated to the header": lambda real: real[:256],
    "truncated before the layout ends": lambda real: real[:600],
    "truncated to the first page": lambda real: real[:4096],
    "truncated to half": lambda real: real[:len(real) // 2],
    "truncated by one page": lambda real: real[:len(real) - 4096],
    "bad magic": _bytes_edit(0, b"CPPRBRAX"),
    "bad version": _header_edit("version", 99),
    "total size too large": _header_edit("total_size", 1 << 40),
    "capacity too large": _header_edit("capacity", 1 << 40),
    "capacity zero": _header_edit("capacity", 0),
    "capacity 2**63": _header_edit("capacity", 1 << 63),
    "capacity 2**64 - 1": _header_edit("capacity", (1 << 64) - 1),
    "tree offset outside": _header_edit("tree_offset", 1 << 40),
    "tree offset misaligned": lambda real: CORRUPTIONS_TREE_MISALIGNED(real),
    "rows misaligned": lambda real: CORRUPTIONS_ROWS_MISALIGNED(real),
    "rows outside": _header_edit("data_offset", 1 << 40),
    "next index out of range": _header_edit("next_index", 64),
    "stored size out of range": _header_edit("stored_size", 65),
    "layout length huge": _header_edit("layout_length", 1 << 62),
    "layout offset moved": _header_edit("layout_offset", 1024),
    "layout not json": _bytes_edit(512, b"\xff\xfe{]:,"),
    "layout zeroed": _bytes_edit(513, bytes(39)),
    "layout column outside": _layout_edit(_offset_outside),
    "layout no columns": _layout_edit(_no_columns),
    "layout row bytes lie": _layout_edit(_row_bytes_lie),
    "layout dtype unknown": _layout_edit(_dtype_unknown),
    "layout column without shape": _layout_edit(_shape_missing),
    "layout columns not a list": _layout_edit(_columns_not_a_list),
}


def _plant(backend: str, data: bytes) -> tuple:
    """Write `data` as a segment; returns (what attach takes, the file to remove)."""
    name = "cpprb_ray_test_bad_" + os.urandom(6).hex()
    path = os.path.join("/dev/shm", name)
    if backend == "mmap" and not os.path.isdir("/dev/shm"):  # pragma: no cover
        path = os.path.join(cpprb_ray._memory.default_mmap_dir(), name)
    with open(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "wb") as handle:
        handle.write(data)
    return (name if backend == "shm" else path), path


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_attach_refuses_bad_segments(backend, case):
    data = CORRUPTIONS[case](_real_bytes(backend))
    target, path = _plant(backend, data)
    try:
        for attach in (PrioritizedReplayBuffer.attach, ReplayBuffer.attach, cpprb_ray.attach):
            with pytest.raises(ValueError):
                attach(target)
        # The orphan tools list a segment that carries our magic as not valid (so that it can be
        # removed), and refuse to touch anything else.
        listed = [entry for entry in cpprb_ray.list_buffers() if entry["path"] == path]
        assert all(not entry["valid"] and entry["problem"] for entry in listed)
        if listed:
            assert cpprb_ray.remove_buffer(target)
            assert not os.path.exists(path)
        elif data:
            with pytest.raises(ValueError):
                cpprb_ray.remove_buffer(target)
            assert os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_attach_accepts_an_intact_copy(backend):
    """The corruption tests are not vacuous: the same bytes, untouched, attach fine."""
    real = _real_bytes(backend)
    target, path = _plant(backend, real)
    try:
        with PrioritizedReplayBuffer.attach(target) as view:
            assert view.get_stored_size() == 10
            np.testing.assert_array_equal(view.get_all_transitions()["act"][:, 0], np.arange(10))
        edited = _with_layout(real, lambda document: None)
        os.unlink(path)
        target, path = _plant(backend, bytes(edited))
        with PrioritizedReplayBuffer.attach(target) as view:
            assert view.sample(4)["obs"].shape == (4, 3)
    finally:
        os.unlink(path)


@pytest.mark.parametrize("edit", ["object dtype", "negative shape", "zero shape", "void dtype",
                                  "reserved name"])
def test_attach_refuses_crafted_columns(backend, edit):
    """A layout that parse_env_dict would refuse is corrupt (an object column would make a
    sample copy raw pointers and crash)."""
    def change(document):
        column = document["columns"][0]
        if edit == "object dtype":
            column["dtype"], column["row_bytes"] = "|O", 24
        elif edit == "negative shape":
            column["shape"], column["row_bytes"] = [-3], -12
        elif edit == "zero shape":
            column["shape"], column["row_bytes"] = [0], 0
        elif edit == "void dtype":
            column["dtype"], column["row_bytes"] = "|V0", 0
        else:
            column["name"] = "weights"

    target, path = _plant(backend, bytes(_with_layout(_real_bytes(backend), change)))
    try:
        with pytest.raises(ValueError):
            view = PrioritizedReplayBuffer.attach(target)
            view.close()                 # never sample it: with the bug an object column crashes
    finally:
        os.unlink(path)


# ---------------------------------------------------------------------------------------------
# priorities whose tree weight (p + eps) ** alpha overflows


@pytest.mark.parametrize("how", ["add", "update"])
def test_priority_whose_weight_overflows(backend, how):
    with PrioritizedReplayBuffer(8, ENV, alpha=2.0, backend=backend, seed=0) as rb:
        rb.add(**rows(0, 3), priorities=[1.0, 2.0, 3.0])
        if how == "add":
            check_refused(rb, lambda: rb.add(**rows(3, 1), priorities=[1e200]), ValueError,
                          "priorities")
        else:
            check_refused(rb, lambda: rb.update_priorities([0], [1e200]), ValueError,
                          "priorities")


def test_priorities_whose_total_overflows(backend):
    """Either refuse such priorities, or sample them correctly: never a silent wrong law."""
    with PrioritizedReplayBuffer(4, {"x": {}}, alpha=2.0, eps=0.0, backend=backend,
                                 seed=0) as rb:
        try:
            rb.add(x=[0.0, 1.0], priorities=[1e154, 1e154])
        except ValueError as error:
            assert "priorities" in str(error)
            assert rb.get_stored_size() == 0
            return
        sample = rb.sample(64, beta=0.4)
        assert np.isfinite(sample["weights"]).all()
        np.testing.assert_array_equal(np.bincount(sample["indexes"], minlength=2), [32, 32])


MUTEX_SCRIPT = """
import os, signal, sys
from cpprb_ray import PrioritizedReplayBuffer
signal.alarm(3)          # a hang ends here, by SIGALRM, instead of stalling the suite
try:
    view = PrioritizedReplayBuffer.attach(sys.argv[1])
except ValueError:
    sys.exit(0)          # refused: fine
try:
    view.sample(2)
except (ValueError, OSError):
    pass                 # a clear error on use: fine too
view.close()
"""


def test_corrupt_mutex_never_hangs():
    """The lock region (bytes 256..512) overwritten with 0x01: never a hang or a crash."""
    real = _real_bytes("mmap")
    data = bytearray(real)
    data[256:512] = b"\x01" * 256
    target, path = _plant("mmap", bytes(data))
    try:
        child = subprocess.run([sys.executable, "-c", MUTEX_SCRIPT, target], capture_output=True,
                               text=True, env=_child_env(), timeout=60)
        assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    finally:
        os.unlink(path)


def _child_env() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(cpprb_ray.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env
