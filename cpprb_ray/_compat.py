"""cpprb's spellings that cpprb_ray's own API says differently: one place for each translation.

A cpprb user changes only the import; what cpprb accepts and cpprb_ray keeps (a float ``size``
such as ``1e6``, ``default_dtype``, ``check_for_update``, ``save_transitions`` files) is
translated here, and what cpprb_ray does not take is refused with what to use instead. The full
table is docs/migrating.md.
"""

from __future__ import annotations

import functools
import inspect
import io
import os
import pickle
import warnings
import zipfile
from typing import Any, Callable, Dict, Mapping, Tuple, TypeVar

import numpy as np

from cpprb_ray import _rules

# cpprb's save_transitions format: np.savez_compressed with these keys; "data" is the dict that
# get_all_transitions returns (a pickled 0-d object array), "version" 1 is the only one cpprb
# has written. cpprb 10+ adds "next_of" (None unless safe=False with next_of).
TRANSITIONS_VERSION = 1
TRANSITIONS_KEYS = ("safe", "version", "data", "Nstep", "cache", "next_of")

F = TypeVar("F", bound=Callable[..., Any])

# cpprb constructor arguments that cpprb_ray's signatures do not have, and what to use instead.
# An entry stops applying as soon as the constructor takes the name itself.
REFUSED_ARGUMENTS = {
    "next_of": "next_of= (observations stored once) is not available in this version; give "
               "the next observation its own env_dict column (e.g. 'next_obs')",
    "stack_compress": "stack_compress= is not available in this version; store the stacked "
                      "frames as a column of their full shape",
    "alpha": "alpha= is PrioritizedReplayBuffer's argument (uniform buffers have none)",
    "eps": "eps= is PrioritizedReplayBuffer's argument (uniform buffers have none)",
    "check_for_update": "check_for_update= is PrioritizedReplayBuffer's argument (uniform "
                        "buffers have no update_priorities)",
}


def cpprb_arguments(init: F) -> F:
    """Wrap a constructor so that cpprb's arguments it does not take raise a TypeError saying
    what to use instead (cpprb silently ignores unknown keyword arguments; Python's own
    message for them would not say what to do).

    Examples
    --------
    >>> from cpprb_ray import ReplayBuffer
    >>> ReplayBuffer(8, {"obs": {}}, alpha=0.5)
    Traceback (most recent call last):
    ...
    TypeError: ReplayBuffer() does not take cpprb's alpha=: alpha= is PrioritizedReplayBuffer's ...
    """
    accepted = set(inspect.signature(init).parameters)

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        for name, advice in REFUSED_ARGUMENTS.items():
            if name in kwargs and name not in accepted:
                raise TypeError(f"{type(self).__name__}() does not take cpprb's {name}=: "
                                f"{advice}")
        init(self, *args, **kwargs)

    return checked  # type: ignore[return-value]


def mmap_path(mmap_prefix: Any, backend: str, path: Any) -> Tuple[str, Any]:
    """cpprb's ``mmap_prefix``: (backend, path) of a buffer in the file
    ``{mmap_prefix}.cpprb_ray`` (cpprb writes a file per column, ``{mmap_prefix}_{name}.dat``;
    cpprb_ray's buffer is one segment). Without it, `backend` and `path` as given.

    Examples
    --------
    >>> mmap_path("runs/rb", "auto", None)
    ('mmap', 'runs/rb.cpprb_ray')
    >>> mmap_path(None, "shm", None)
    ('shm', None)
    """
    if mmap_prefix is None:
        return backend, path
    if not isinstance(mmap_prefix, (str, os.PathLike)):
        raise TypeError(f"mmap_prefix must be a str (a file name prefix); got "
                        f"{type(mmap_prefix).__name__}")
    if backend not in ("auto", "mmap") or path is not None:
        raise ValueError("give mmap_prefix= or backend= / path=, not both")
    return "mmap", os.fspath(mmap_prefix) + ".cpprb_ray"


def whole_size(size: Any) -> Any:
    """cpprb's ``size`` may be a float with a whole value (``1e6``): that value as an int.

    Anything else is returned as it is, for the constructor's own checks (an int, or an error
    naming ``size``).

    Examples
    --------
    >>> whole_size(1e6), whole_size(16)
    (1000000, 16)
    >>> whole_size(1.5)
    Traceback (most recent call last):
    ...
    ValueError: size must be a whole number of rows; got 1.5
    """
    if isinstance(size, (float, np.floating)):
        if not np.isfinite(size) or size != int(size):
            raise ValueError(f"size must be a whole number of rows; got {size!r}")
        return int(size)
    return size


def with_default_dtype(env_dict: Any, default_dtype: Any) -> Any:
    """cpprb's ``default_dtype``: `env_dict` with that dtype for every column that names none.

    None leaves `env_dict` as it is (columns without a dtype are float32, as in cpprb).

    Examples
    --------
    >>> import numpy as np
    >>> env = with_default_dtype({"obs": {"shape": 2}, "act": {"dtype": "int8"}}, np.float64)
    >>> env["obs"]["dtype"], env["act"]["dtype"]
    (dtype('float64'), 'int8')
    >>> with_default_dtype({"obs": {}}, "object")
    Traceback (most recent call last):
    ...
    TypeError: default_dtype must be a fixed-size plain numpy dtype; got 'object'
    """
    if default_dtype is None:
        return env_dict
    try:
        dtype = _rules.column_dtype(default_dtype, "obs")
    except TypeError:
        raise TypeError(f"default_dtype must be a fixed-size plain numpy dtype; got "
                        f"{default_dtype!r}") from None
    if not isinstance(env_dict, Mapping):
        return env_dict    # the env_dict check says what is wrong with it
    return {name: (dict(spec, dtype=dtype) if isinstance(spec, Mapping) and "dtype" not in spec
                   else {"dtype": dtype} if spec is None else spec)
            for name, spec in env_dict.items()}


class SampledGenerations:
    """cpprb's ``check_for_update``: the generation each slot had when this handle last sampled
    it, so that ``update_priorities(indexes, priorities)`` skips the slots written since.

    One uint64 per slot (cpprb keeps one bool per slot), allocated on the first sample. A slot
    this handle never sampled has generation 0, which no stored row has: its update is skipped.

    Examples
    --------
    >>> import numpy as np
    >>> memo = SampledGenerations(4)
    >>> memo.remember(np.array([1, 3]), np.array([2, 6], dtype=np.uint64))
    >>> memo.generations_of([3, 1, 0, 9])
    array([6, 2, 0, 0], dtype=uint64)
    """

    __slots__ = ("_generations",)

    def __init__(self, capacity: int) -> None:
        self._generations = np.zeros(capacity, dtype=np.uint64)

    def remember(self, indexes: np.ndarray, generations: np.ndarray) -> None:
        self._generations[indexes] = generations

    def generations_of(self, indexes: Any) -> np.ndarray:
        """The remembered generations (0: never sampled; out of range: 0 too, left for the
        update's own index check to refuse)."""
        array = _rules.index_vector(indexes, "indexes", True)
        inside = (array >= 0) & (array < len(self._generations))
        found = np.zeros(len(array), dtype=np.uint64)
        found[inside] = self._generations[array[inside]]
        return found


def shuffled(transitions: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """get_all_transitions(shuffle=True): every column in one random row order, drawn from
    numpy's global random state as cpprb does (``np.random.seed`` makes it repeatable).

    Examples
    --------
    >>> import numpy as np
    >>> np.random.seed(0)
    >>> rows = shuffled({"obs": np.arange(5.0), "act": np.arange(5)})
    >>> bool((rows["obs"] == rows["act"]).all()), sorted(rows["act"].tolist())
    (True, [0, 1, 2, 3, 4])
    """
    count = len(next(iter(transitions.values()))) if transitions else 0
    order = np.random.permutation(count)  # noqa: NPY002 (cpprb's global random state)
    return {name: column[order] for name, column in transitions.items()}


def save_transitions(transitions: Dict[str, np.ndarray], file: Any, *, nstep: bool) -> None:
    """Write `transitions` (get_all_transitions's dict) to `file` in cpprb's format.

    Examples
    --------
    >>> import io, numpy as np
    >>> file = io.BytesIO()
    >>> save_transitions({"obs": np.ones((2, 1), np.float32)}, file, nstep=False)
    >>> _ = file.seek(0)
    >>> data, is_nstep = read_transitions(file)
    >>> data["obs"].ravel(), is_nstep
    (array([1., 1.], dtype=float32), False)
    """
    if isinstance(file, (str, os.PathLike)):
        file = os.fspath(file)
    # Object entries (the dict, None) as cpprb writes them: pickled 0-d object arrays.
    members: Dict[str, Any] = {"safe": True, "version": TRANSITIONS_VERSION,
                               "data": transitions, "Nstep": nstep, "cache": None,
                               "next_of": None}
    np.savez_compressed(file, **members)


# What a transitions file's pickles may name: numpy's array reconstruction, nothing else (a
# pickle that names anything more is not one np.savez wrote). numpy 2 writes numpy._core,
# numpy 1 numpy.core; either is read by either.
_NUMPY_GLOBALS = {"_reconstruct", "ndarray", "dtype", "scalar", "_frombuffer"}
_NUMPY_MODULES = {"numpy", "numpy.core.multiarray", "numpy._core.multiarray",
                  "numpy.core.numeric", "numpy._core.numeric"}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _NUMPY_MODULES and name in _NUMPY_GLOBALS:
            if name in ("ndarray", "dtype"):
                return getattr(np, name)
            for candidate in (module, module.replace("numpy._core", "numpy.core"),
                              module.replace("numpy.core", "numpy._core")):
                try:
                    return getattr(__import__(candidate, fromlist=[name]), name)
                except (ImportError, AttributeError):
                    continue
        raise pickle.UnpicklingError(f"a transitions file names {module}.{name}, which is not "
                                     f"numpy's array reconstruction; refused")


def _read_member(archive: zipfile.ZipFile, key: str, file: Any) -> Any:
    try:
        raw = archive.read(key + ".npy")
    except KeyError:
        raise ValueError(f"{file!r} is not a cpprb transitions file: it has no {key!r}") from None
    stream = io.BytesIO(raw)
    version = np.lib.format.read_magic(stream)
    reader = (np.lib.format.read_array_header_1_0 if version == (1, 0)
              else np.lib.format.read_array_header_2_0)
    _, _, dtype = reader(stream)
    if dtype.hasobject:
        return _NumpyOnlyUnpickler(stream).load()[()]
    stream.seek(0)
    return np.lib.format.read_array(stream, allow_pickle=False)[()]


def read_transitions(file: Any) -> Tuple[Dict[str, np.ndarray], bool]:
    """(transitions, whether they are N-step transitions) from a file in cpprb's format.

    Unlike ``np.load(allow_pickle=True)``, the pickled parts may hold numpy arrays and dicts
    only: a crafted file cannot run code. ValueError for anything cpprb_ray cannot load, with
    the reason.
    """
    try:
        archive = zipfile.ZipFile(os.fspath(file) if isinstance(file, os.PathLike) else file)
    except zipfile.BadZipFile:
        raise ValueError(f"{file!r} is not a cpprb transitions file (not an .npz)") from None
    with archive:
        version = _read_member(archive, "version", file)
        if version != TRANSITIONS_VERSION:
            raise ValueError(f"{file!r} is a transitions file of format version {version}; "
                             f"this cpprb_ray reads version {TRANSITIONS_VERSION}")
        safe = bool(_read_member(archive, "safe", file))
        data = _read_member(archive, "data", file)
        nstep = bool(_read_member(archive, "Nstep", file))
        if not isinstance(data, dict) or not all(isinstance(v, np.ndarray)
                                                 for v in data.values()):
            raise ValueError(f"{file!r}: its 'data' is not a dict of arrays")
        if not safe:
            if nstep:
                raise ValueError(f"{file!r} holds N-step transitions saved by cpprb with "
                                 f"safe=False; save them with safe=True to load them here")
            data = unsafe_rows(data, _read_member(archive, "cache", file),
                               _read_member(archive, "next_of", file), file)
    return data, nstep


def unsafe_rows(data: Dict[str, np.ndarray], cache: Any, next_of: Any,
                file: Any = "") -> Dict[str, np.ndarray]:
    """The rows of a transitions file cpprb wrote with ``safe=False`` (its ring as stored:
    `data` in slot order, `cache` the values of the slots at episode ends, `next_of` the names
    whose ``next_<name>`` is the next slot's), each row whole: what cpprb's own loader adds.

    Examples
    --------
    >>> import numpy as np
    >>> rows = unsafe_rows({"a": np.array([[1.0], [2.0], [3.0]])},
    ...                    {1: {"next_a": np.array([9.0])}}, np.array(["a"]))
    >>> rows["a"].ravel().tolist(), rows["next_a"].ravel().tolist()
    ([1.0, 2.0, 3.0], [2.0, 9.0, 1.0])
    """
    cache = {} if cache is None else cache
    names = [] if next_of is None else [str(n) for n in np.asarray(next_of).reshape(-1)]
    if not isinstance(cache, dict) or not all(isinstance(v, dict) for v in cache.values()):
        raise ValueError(f"{file!r}: its 'cache' is not a dict of dicts")
    missing = [n for n in names if n not in data]
    if missing or not data:
        raise ValueError(f"{file!r}: its next_of names {missing}, which it does not hold")
    size = len(next(iter(data.values())))
    rows = {name: np.array(column, copy=True) for name, column in data.items()}
    for name in names:
        # Each slot's next is the slot after it (the ring's last wraps to its first), unless
        # the cache kept the slot's own (an episode's end): cpprb's loader does the same.
        rows["next_" + name] = np.roll(data[name], -1, axis=0)
    for index, values in cache.items():
        if not isinstance(index, (int, np.integer)) or not 0 <= index < size:
            continue   # cpprb's loader adds a cached slot only where its data has one
        for key, value in values.items():
            if key not in rows:
                raise ValueError(f"{file!r}: its cache holds {key!r}, which is no column")
            rows[key][index] = value
    return rows


def check_context(ctx: Any) -> None:
    """cpprb's MP buffers' ``ctx``: a multiprocessing context or a SyncManager. cpprb_ray
    needs neither (a handle re-attaches in any process, whatever the start method), so it is
    checked and otherwise unused.

    Examples
    --------
    >>> import multiprocessing
    >>> check_context(multiprocessing.get_context("spawn"))
    >>> check_context("spawn")
    Traceback (most recent call last):
    ...
    TypeError: ctx must be None, a multiprocessing context ... or a SyncManager; got str

    A manager that was shut down is refused as cpprb refuses it (ProcessError): whatever the
    caller meant to share through it is gone.
    """
    import multiprocessing.context
    import multiprocessing.managers

    if ctx is not None and not isinstance(ctx, (multiprocessing.context.BaseContext,
                                                multiprocessing.managers.SyncManager)):
        raise TypeError(f"ctx must be None, a multiprocessing context "
                        f"(multiprocessing.get_context()) or a SyncManager; got "
                        f"{type(ctx).__name__}")
    state = getattr(getattr(ctx, "_state", None), "value", None)
    shutdown = multiprocessing.managers.State.SHUTDOWN  # type: ignore[attr-defined]
    if isinstance(ctx, multiprocessing.managers.SyncManager) and state == shutdown:
        raise multiprocessing.ProcessError("ctx is a SyncManager that was shut down")


def mp_backend(backend: str) -> str:
    """cpprb's MP ``backend`` names in cpprb_ray's terms: "sharedctypes" is "auto" (the segment
    is shared either way), "SharedMemory" is "shm"; cpprb_ray's own names pass through.

    Examples
    --------
    >>> mp_backend("sharedctypes"), mp_backend("SharedMemory"), mp_backend("mmap")
    ('auto', 'shm', 'mmap')
    """
    translated: Dict[str, str] = {"sharedctypes": "auto", "SharedMemory": "shm"}
    return translated.get(backend, backend) if isinstance(backend, str) else backend


def nstep_rows(transitions: Dict[str, np.ndarray], columns: Any, file: Any,
               full_discount: float) -> Dict[str, np.ndarray]:
    """N-step transitions read from a file, as the rows of `columns` (every column, discounts
    included, of its dtype and shape): what an N-step buffer commits without staging them
    again. ValueError when a column is missing. cpprb's N-step files have no "discounts" (each
    row's gamma**m cannot be recovered from them): their rows get `full_discount` (gamma**n,
    what cpprb's learners use for every row), with a RuntimeWarning saying so."""
    if "discounts" not in transitions and any(c.name == "discounts" for c in columns):
        warnings.warn(f"{file!r} holds N-step transitions without 'discounts' (cpprb's "
                      f"files have none): every row gets gamma**n = {full_discount:g}, exact "
                      f"but for windows an episode's truncated end shortened",
                      RuntimeWarning, stacklevel=3)
        count = len(next(iter(transitions.values()))) if transitions else 0
        transitions = dict(transitions,
                           discounts=np.full((count, 1), full_discount, dtype=np.float32))
    missing = [c.name for c in columns if c.name not in transitions]
    if missing:
        raise ValueError(f"{file!r} holds N-step transitions without the columns {missing}")
    count = len(transitions[columns[0].name])
    return {c.name: np.ascontiguousarray(
        np.asarray(transitions[c.name]).astype(c.dtype, copy=False).reshape((count,) + c.shape))
        for c in columns}
