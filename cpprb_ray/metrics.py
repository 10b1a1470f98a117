"""A buffer's ``stats()`` as Ray metrics: ``cpprb_ray.metrics.export(rb, interval=5.0)``.

A daemon thread reads ``rb.stats()`` every `interval` seconds (one snapshot each: the lock held
for one copy of the counters) and publishes it through :mod:`ray.util.metrics`, tagged with
the buffer's name (tag ``buffer``), so it reaches Prometheus and the Ray dashboard as every
other Ray metric does (Ray exports them from each node's metrics agent, which needs
``ray[default]``; with the minimal ``ray`` they are recorded and go nowhere).

Gauges (the value now): ``cpprb_ray_stored``, ``cpprb_ray_capacity``, ``cpprb_ray_fill``,
``cpprb_ray_max_priority`` (prioritized buffers), and with a rate limiter
``cpprb_ray_limiter_diff``, ``cpprb_ray_limiter_can_insert``, ``cpprb_ray_limiter_can_sample``
(1 or 0). Counters (what happened since the last reading, so Prometheus' ``rate()`` gives per
second figures): ``cpprb_ray_inserts``, ``cpprb_ray_samples``, ``cpprb_ray_updates``,
``cpprb_ray_lock_waits``, ``cpprb_ray_repairs``, and with a limiter
``cpprb_ray_limiter_insert_blocks``, ``cpprb_ray_limiter_sample_blocks``,
``cpprb_ray_limiter_insert_timeouts``, ``cpprb_ray_limiter_sample_timeouts``,
``cpprb_ray_limiter_insert_wait_seconds``, ``cpprb_ray_limiter_sample_wait_seconds``. On Ray's
Prometheus endpoint each name has Ray's prefix ``ray_`` before it, and each counter ``_total``
after it: ``ray_cpprb_ray_samples_total{buffer="..."}``.

Examples
--------
>>> from cpprb_ray import metrics
>>> sorted(metrics.GAUGES)[:3], sorted(metrics.COUNTERS)[:3]
(['capacity', 'fill', 'max_priority'], ['inserts', 'lock_waits', 'repairs'])
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Dict, Optional, Tuple

from cpprb_ray import _rules

__all__ = ["Exporter", "export"]

PREFIX = "cpprb_ray_"
GAUGES = {"stored": "Rows the buffer holds", "capacity": "The buffer's size in rows",
          "fill": "stored / capacity",
          "max_priority": "The largest priority seen (prioritized buffers)"}
COUNTERS = {"inserts": "Rows added", "samples": "Rows sampled",
            "updates": "Priorities applied by update_priorities",
            "lock_waits": "Lock acquisitions that found the lock held",
            "repairs": "Repairs after a process died holding the lock"}
LIMITER_GAUGES = {"diff": "inserts * samples_per_insert - samples",
                  "can_insert": "1 when a one-row add would go now",
                  "can_sample": "1 when a one-row sample would go now"}
LIMITER_COUNTERS = {"insert_blocks": "Adds the rate limiter held back",
                    "sample_blocks": "Samples the rate limiter held back",
                    "insert_timeouts": "Adds that gave up (TimeoutError)",
                    "sample_timeouts": "Samples that gave up (TimeoutError)",
                    "insert_wait_s": "Seconds adds were held back",
                    "sample_wait_s": "Seconds samples were held back"}
TAG_KEYS = ("buffer",)


def _metric_name(key: str, limiter: bool) -> str:
    key = key.replace("_wait_s", "_wait_seconds")
    return PREFIX + ("limiter_" if limiter else "") + key


class Exporter:
    """The thread that publishes one buffer's stats; made by :func:`export`.

    Attributes
    ----------
    readings : int
        Readings of ``stats()`` published so far.

    Examples
    --------
    See :func:`export`.
    """

    def __init__(self, rb: Any, interval: float, tags: Optional[Dict[str, str]]) -> None:
        from ray.util import metrics as ray_metrics
        extra = dict(tags or {})
        for key, value in extra.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"tags must map str to str; got {key!r}: {value!r}")
        if "buffer" in extra:
            raise ValueError("tags must not hold 'buffer': it is the buffer's name")
        self._tags = {"buffer": rb.name, **extra}
        keys = TAG_KEYS + tuple(sorted(extra))
        self._gauges = {key: ray_metrics.Gauge(_metric_name(key, False), text, tag_keys=keys)
                        for key, text in GAUGES.items()}
        self._counters = {key: ray_metrics.Counter(_metric_name(key, False), text,
                                                   tag_keys=keys)
                          for key, text in COUNTERS.items()}
        self._limited = rb.rate_limiter is not None
        if self._limited:
            self._gauges.update({
                "limiter." + key: ray_metrics.Gauge(_metric_name(key, True), text, tag_keys=keys)
                for key, text in LIMITER_GAUGES.items()})
            self._counters.update({
                "limiter." + key: ray_metrics.Counter(_metric_name(key, True), text,
                                                      tag_keys=keys)
                for key, text in LIMITER_COUNTERS.items()})
        self._last: Dict[str, float] = {}
        self.readings = 0
        self._stop = threading.Event()
        self._rb = weakref.ref(rb)
        self.publish()   # the first reading now: a bad buffer fails here, not in the thread
        self._thread = threading.Thread(target=_loop, args=(weakref.ref(self), self._stop,
                                                            interval),
                                        name=f"cpprb_ray metrics {rb.name}", daemon=True)
        self._thread.start()

    def _values(self) -> Optional[Tuple[Dict[str, Any], Dict[str, Any]]]:
        rb = self._rb()
        if rb is None or rb.closed:
            return None
        try:
            stats = rb.stats()
        except ValueError:   # closed meanwhile
            return None
        gauges = {key: stats[key] for key in GAUGES}
        counters = {key: stats[key] for key in COUNTERS}
        limiter = stats.get("rate_limiter")
        if self._limited and limiter is not None:
            gauges.update({"limiter." + key: float(limiter[key]) for key in LIMITER_GAUGES})
            counters.update({"limiter." + key: limiter[key] for key in LIMITER_COUNTERS})
        return gauges, counters

    def publish(self) -> bool:
        """Read ``stats()`` once and publish it; False once the buffer is closed (the thread
        then ends).

        Examples
        --------
        See :func:`export`.
        """
        values = self._values()
        if values is None:
            return False
        gauges, counters = values
        for key, value in gauges.items():
            if value is not None:
                self._gauges[key].set(float(value), tags=self._tags)
        for key, value in counters.items():
            # Ray's counters only go up: publish what happened since the last reading (a
            # clear or a restore that took a count back starts it again from there).
            delta = float(value) - self._last.get(key, 0.0)
            if delta > 0:
                self._counters[key].inc(delta, tags=self._tags)
            self._last[key] = float(value)
        self.readings += 1
        return True

    @property
    def running(self) -> bool:
        """Whether the thread still publishes."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop publishing (the values published stay in Ray's metrics until they age out).
        Idempotent."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def _loop(exporter_ref: weakref.ref[Exporter], stop: threading.Event,
          interval: float) -> None:
    while not stop.wait(interval):
        exporter = exporter_ref()
        if exporter is None or not exporter.publish():
            return
        del exporter


def export(rb: Any, interval: float = 5.0, *,
           tags: Optional[Dict[str, str]] = None) -> Exporter:
    """Publish ``rb.stats()`` through :mod:`ray.util.metrics` every `interval` seconds, from a
    daemon thread, until :meth:`Exporter.stop`, the buffer's close, or the exporter is
    collected (keep it). Needs a Ray runtime in this process (``ray.init()`` first, or a task
    or actor). `tags`: more tags (str to str) beside ``buffer`` (the buffer's name).

    Examples
    --------
    >>> import ray
    >>> from cpprb_ray import ReplayBuffer, metrics
    >>> ray.is_initialized()     # doctest: +SKIP
    True
    >>> with ReplayBuffer(16, {"obs": {}}) as rb:     # doctest: +SKIP
    ...     exporter = metrics.export(rb, interval=1.0, tags={"job": "apex"})
    ...     _ = rb.add(obs=[1.0, 2.0])
    ...     exporter.publish()          # publish now, besides every second
    True

    Its arguments are checked first:

    >>> with ReplayBuffer(16, {"obs": {}}) as rb:
    ...     metrics.export(rb, interval=0)
    Traceback (most recent call last):
    ...
    ValueError: interval must be > 0 seconds; got 0.0
    """
    interval = _rules.as_real(interval, "interval")
    if not interval > 0:
        raise ValueError(f"interval must be > 0 seconds; got {interval}")
    if rb.closed:
        raise ValueError("operation on a closed buffer")
    try:
        import ray
    except ImportError:
        raise ImportError("cpprb_ray.metrics.export needs ray (pip install 'ray[default]' to "
                          "reach Prometheus)") from None
    if not ray.is_initialized():
        raise RuntimeError("cpprb_ray.metrics.export needs a Ray runtime in this process: "
                           "call ray.init() first")
    return Exporter(rb, interval, tags)
