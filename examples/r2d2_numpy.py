"""A GRU Q-network, its backpropagation through time and the R2D2 update, in numpy alone.

The R2D2 example (``examples/r2d2.py``) runs its actors and its learner on this module. The GRU
steps through time in a Python loop (one matrix product per step for the whole batch); the
layers around it (the Q head, Adam) are ``dqn_numpy``'s.

Examples
--------
>>> import numpy as np
>>> net = RecurrentQ(obs_size=2, hidden=8, head=16, actions=2, seed=0)
>>> learner = R2D2(net, burn_in=2, nstep=2, gamma=0.9, learning_rate=1e-3, target_every=10)
>>> batch = {"obs": np.zeros((4, 6, 2)), "act": np.zeros((4, 6), dtype=np.int64),
...          "rew": np.ones((4, 6)), "done": np.zeros((4, 6)), "mask": np.ones((4, 6), bool),
...          "core": np.zeros((4, 8)), "weights": np.ones(4)}
>>> abs_td, trained = learner.train_step(batch)   # |TD| of each step, and where it is trained
>>> abs_td.shape, trained.shape
((4, 6), (4, 6))
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dqn_numpy import MLP, Adam, clip_global_norm, huber  # noqa: E402

__all__ = ["GRU", "RecurrentQ", "R2D2", "nstep_targets"]


def sigmoid(values: np.ndarray) -> np.ndarray:
    """The logistic function, written so that large negative inputs do not overflow ``exp``.

    Examples
    --------
    >>> import numpy as np
    >>> sigmoid(np.array([-1000.0, 0.0, 1000.0]))
    array([0. , 0.5, 1. ])
    """
    return 0.5 * (1.0 + np.tanh(0.5 * values))


class GRU:
    """A gated recurrent unit layer (Cho et al., 2014), PyTorch's variant of the candidate:

    ``r, z = sigmoid(x Wx[:, :2H] + h Wh[:, :2H] + b[:2H])``,
    ``n = tanh(x Wx[:, 2H:] + b[2H:] + r * (h Wh[:, 2H:]))``, ``h' = (1 - z) n + z h``.

    Parameters
    ----------
    inputs, hidden : int
        Input width and state width H.
    seed : int, optional
        Seed of the uniform initialisation in ``+-1/sqrt(H)`` (as PyTorch's).
    dtype : numpy dtype
        float32 for speed, float64 for gradient checks.

    Examples
    --------
    >>> import numpy as np
    >>> gru = GRU(3, 4, seed=0)
    >>> states, cache = gru.forward(np.ones((5, 2, 3)), np.zeros((2, 4)))   # (time, batch, in)
    >>> states.shape, [p.shape for p in gru.params]
    ((5, 2, 4), [(3, 12), (4, 12), (12,)])
    """

    def __init__(self, inputs: int, hidden: int, seed: Optional[int] = None,
                 dtype: Any = np.float32) -> None:
        rng = np.random.default_rng(seed)
        self.inputs, self.hidden = int(inputs), int(hidden)
        self.dtype = np.dtype(dtype)
        bound = 1.0 / np.sqrt(hidden)
        self.params: List[np.ndarray] = [
            rng.uniform(-bound, bound, (inputs, 3 * hidden)).astype(self.dtype),
            rng.uniform(-bound, bound, (hidden, 3 * hidden)).astype(self.dtype),
            np.zeros(3 * hidden, dtype=self.dtype)]

    def step(self, inputs: np.ndarray, state: np.ndarray) -> np.ndarray:
        """One step for a batch: the next state, shape ``(batch, H)`` (what an actor runs).

        Examples
        --------
        >>> import numpy as np
        >>> GRU(2, 3, seed=0).step(np.zeros((1, 2)), np.zeros((1, 3)))   # zero in, zero out
        array([[0., 0., 0.]], dtype=float32)
        """
        states, _ = self.forward(np.asarray(inputs)[None], state, keep=False)
        return states[0]

    def forward(self, inputs: np.ndarray, state: np.ndarray, keep: bool = True
                ) -> Tuple[np.ndarray, List[Tuple[np.ndarray, ...]]]:
        """States after each step of ``inputs`` (time, batch, in) from ``state`` (batch, H).

        With `keep`, the cache holds what :meth:`backward` needs (one tuple per step, then
        the inputs).

        Examples
        --------
        >>> import numpy as np
        >>> states, cache = GRU(2, 3, seed=0).forward(np.ones((4, 1, 2)), np.zeros((1, 3)))
        >>> states.shape, len(cache)
        ((4, 1, 3), 5)
        """
        w_x, w_h, bias = self.params
        size = self.hidden
        inputs = np.asarray(inputs, dtype=self.dtype)
        steps, batch = inputs.shape[:2]
        # The input's share of every gate for all steps at once: one matrix product.
        projected = (inputs.reshape(steps * batch, self.inputs) @ w_x + bias).reshape(
            steps, batch, 3 * size)
        state = np.asarray(state, dtype=self.dtype)
        states = np.empty((steps, batch, size), dtype=self.dtype)
        cache: List[Tuple[np.ndarray, ...]] = []
        for t in range(steps):
            recurrent = state @ w_h
            gates = sigmoid(projected[t, :, :2 * size] + recurrent[:, :2 * size])
            reset, update = gates[:, :size], gates[:, size:]
            candidate_h = recurrent[:, 2 * size:]
            candidate = np.tanh(projected[t, :, 2 * size:] + reset * candidate_h)
            new_state = candidate + update * (state - candidate)
            if keep:
                cache.append((state, reset, update, candidate, candidate_h))
            states[t] = new_state
            state = new_state
        if keep:
            cache.append((inputs,))
        return states, cache

    def backward(self, cache: List[Tuple[np.ndarray, ...]], grad_states: np.ndarray
                 ) -> Tuple[List[np.ndarray], np.ndarray]:
        """Backpropagation through time: the gradients of ``sum(grad_states * states)`` with
        respect to the parameters, and with respect to the initial state.

        Examples
        --------
        >>> import numpy as np
        >>> gru = GRU(2, 3, seed=0)
        >>> states, cache = gru.forward(np.ones((4, 5, 2)), np.zeros((5, 3)))
        >>> grads, grad_start = gru.backward(cache, np.ones_like(states))
        >>> [g.shape for g in grads], grad_start.shape
        ([(2, 9), (3, 9), (9,)], (5, 3))
        """
        w_x, w_h, _ = self.params
        (inputs,) = cache[-1]
        steps, batch = inputs.shape[:2]
        grad_w_h = np.zeros_like(w_h)
        grad_projected = np.empty((steps, batch, 3 * self.hidden), dtype=self.dtype)
        grad_state = np.zeros((batch, self.hidden), dtype=self.dtype)
        for t in range(steps - 1, -1, -1):
            state, reset, update, candidate, candidate_h = cache[t]
            grad_state = grad_state + grad_states[t]
            # h' = n + z (h - n)
            grad_update = grad_state * (state - candidate) * update * (1.0 - update)
            grad_candidate = grad_state * (1.0 - update) * (1.0 - candidate * candidate)
            grad_reset = grad_candidate * candidate_h * reset * (1.0 - reset)
            grad_projected[t] = np.concatenate([grad_reset, grad_update, grad_candidate], axis=1)
            # The recurrent product feeds the gates as is, and the candidate through r.
            grad_recurrent = np.concatenate([grad_reset, grad_update, grad_candidate * reset],
                                            axis=1)
            grad_w_h += state.T @ grad_recurrent
            grad_state = grad_state * update + grad_recurrent @ w_h.T
        flat = grad_projected.reshape(steps * batch, -1)
        grads = [inputs.reshape(steps * batch, self.inputs).T @ flat, grad_w_h,
                 flat.sum(axis=0)]
        return grads, grad_state


class RecurrentQ:
    """Q-values from a GRU's state: observation -> GRU(H) -> ReLU layer -> one Q per action.

    Parameters
    ----------
    obs_size, hidden, head, actions : int
        Observation width, GRU state width H, width of the ReLU layer, number of actions.
    seed : int, optional
    dtype : numpy dtype

    Examples
    --------
    >>> import numpy as np
    >>> net = RecurrentQ(2, 8, 16, 2, seed=0)
    >>> q, state = net.act(np.zeros((3, 2)), net.initial_state(3))
    >>> q.shape, state.shape
    ((3, 2), (3, 8))
    """

    def __init__(self, obs_size: int, hidden: int, head: int, actions: int,
                 seed: Optional[int] = None, dtype: Any = np.float32) -> None:
        self.sizes = (int(obs_size), int(hidden), int(head), int(actions))
        self.dtype = np.dtype(dtype)
        rng = np.random.default_rng(seed)
        self.gru = GRU(obs_size, hidden, seed=int(rng.integers(2**31)), dtype=dtype)
        self.head = MLP([hidden, head, actions], seed=int(rng.integers(2**31)), dtype=dtype)

    @property
    def params(self) -> List[np.ndarray]:
        """The GRU's parameters, then the head's (the arrays themselves: Adam updates them)."""
        return self.gru.params + self.head.params

    def initial_state(self, batch: int) -> np.ndarray:
        """The state at an episode's start: zeros, shape ``(batch, H)``."""
        return np.zeros((batch, self.sizes[1]), dtype=self.dtype)

    def act(self, obs: np.ndarray, state: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """One step: Q-values ``(batch, actions)`` and the next state."""
        state = self.gru.step(obs, state)
        return self.head.forward(state), state

    def unroll(self, obs: np.ndarray, state: np.ndarray, keep: bool = True
               ) -> Tuple[np.ndarray, np.ndarray, Any]:
        """Q-values ``(time, batch, actions)`` along ``obs`` (time, batch, in) from ``state``,
        the last state, and (with `keep`) the cache for :meth:`backward`.

        Examples
        --------
        >>> import numpy as np
        >>> net = RecurrentQ(2, 4, 8, 3, seed=0)
        >>> q, last, _ = net.unroll(np.ones((5, 2, 2)), net.initial_state(2), keep=False)
        >>> q.shape, last.shape
        ((5, 2, 3), (2, 4))
        """
        states, gru_cache = self.gru.forward(obs, state, keep=keep)
        steps, batch, size = states.shape
        if keep:
            q, head_cache = self.head.forward_with_cache(states.reshape(steps * batch, size))
        else:
            q, head_cache = self.head.forward(states.reshape(steps * batch, size)), None
        last = states[-1] if steps else np.asarray(state, dtype=self.dtype)
        return q.reshape(steps, batch, self.sizes[3]), last, (gru_cache, head_cache,
                                                              states.shape)

    def backward(self, cache: Any, grad_q: np.ndarray) -> List[np.ndarray]:
        """Gradients of ``sum(grad_q * q)`` for the q of :meth:`unroll`, through time."""
        gru_cache, head_cache, shape = cache
        steps, batch, size = shape
        head_grads = self.head.backward(head_cache, grad_q.reshape(steps * batch, -1))
        # The head's gradient with respect to its input (the GRU states): its first layer
        # back from the gradient of its hidden ReLU layer.
        w1, _, w2, _ = self.head.params
        hidden = head_cache[1]
        grad_hidden = (grad_q.reshape(steps * batch, -1) @ w2.T) * (hidden > 0)
        grad_states = (grad_hidden @ w1.T).reshape(steps, batch, size)
        gru_grads, _ = self.gru.backward(gru_cache, grad_states)
        return gru_grads + head_grads

    def get_weights(self) -> List[np.ndarray]:
        """Copies of every parameter (what the learner publishes)."""
        return [param.copy() for param in self.params]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Replace every parameter with a copy of `weights` (same shapes).

        Examples
        --------
        >>> a, b = RecurrentQ(2, 4, 8, 2, seed=0), RecurrentQ(2, 4, 8, 2, seed=1)
        >>> b.set_weights(a.get_weights())
        >>> all((x == y).all() for x, y in zip(a.params, b.params))
        True
        """
        params = self.params
        if len(weights) != len(params) or any(
                np.shape(new) != old.shape for new, old in zip(weights, params)):
            raise ValueError(f"weights must have shapes {[p.shape for p in params]}; got "
                             f"{[np.shape(w) for w in weights]}")
        # In place: Adam holds these very arrays.
        for old, new in zip(params, weights):
            old[...] = new


def nstep_targets(rew: np.ndarray, done: np.ndarray, mask: np.ndarray, q_online: np.ndarray,
                  q_target: np.ndarray, nstep: int, gamma: float
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """Double-DQN n-step targets inside sequences, and where there is one.

    All arrays are time-major, ``(time, batch[, actions])``; `done` is 1 where the episode
    terminated after that step (a truncated episode just ends: its mask goes False). A step
    has a target when it is real (`mask`) and either terminates or has a real next step to
    bootstrap from. Its window is up to `nstep` steps, cut short at a termination (no
    bootstrap) or before a step without a successor (bootstrap from the last real step):

    ``target_t = sum_k<m gamma^k rew_{t+k} + gamma^m Q_target(t+m, argmax_a Q_online(t+m, a))``

    Examples
    --------
    >>> import numpy as np
    >>> rew = np.ones((4, 1)); done = np.array([[0.0], [0.0], [0.0], [1.0]])
    >>> mask = np.ones((4, 1), bool); q = np.full((4, 1, 2), 10.0)
    >>> targets, has = nstep_targets(rew, done, mask, q, q, nstep=2, gamma=0.5)
    >>> targets.ravel(), has.ravel()     # 1 + 0.5 + 0.25 * 10, ..., then the terminal steps
    (array([4. , 4. , 1.5, 1. ]), array([ True,  True,  True,  True]))
    >>> mask[3] = False; done[3] = 0.0   # now it ends (truncated) after step 2
    >>> targets, has = nstep_targets(rew, done, mask, q, q, nstep=2, gamma=0.5)
    >>> targets.ravel(), has.ravel()
    (array([4., 6., 0., 0.]), array([ True,  True, False, False]))
    """
    steps, batch = rew.shape
    done = np.asarray(done, dtype=bool)
    mask = np.asarray(mask, dtype=bool)
    following = np.zeros_like(mask)
    following[:-1] = mask[1:]
    usable = mask & (done | following)
    # Padded by nstep at the end so that t + k needs no bounds check.
    pad = np.zeros((nstep, batch), dtype=bool)
    usable_pad = np.concatenate([usable, pad])
    done_pad = np.concatenate([done, pad])
    rew_pad = np.concatenate([np.asarray(rew, np.float64), np.zeros((nstep, batch))])
    times = np.arange(steps)[:, None]
    returns = np.zeros((steps, batch))
    discount = np.ones((steps, batch))
    length = np.zeros((steps, batch), dtype=np.int64)
    terminal = np.zeros((steps, batch), dtype=bool)
    running = usable.copy()
    for k in range(nstep):
        returns += np.where(running, discount * rew_pad[times + k, np.arange(batch)], 0.0)
        discount = np.where(running, discount * gamma, discount)
        length += running
        ends = running & done_pad[times + k, np.arange(batch)]
        terminal |= ends
        running = running & ~ends & usable_pad[times + k + 1, np.arange(batch)]
    at = np.minimum(times + length, steps - 1)
    columns = np.broadcast_to(np.arange(batch), (steps, batch))
    best = np.argmax(q_online[at, columns], axis=-1)
    bootstrap = q_target[at, columns, best]
    targets = returns + np.where(terminal, 0.0, discount * bootstrap)
    return np.where(usable, targets, 0.0), usable


class R2D2:
    """The learner's update: stored state + burn-in, n-step double DQN along each sequence,
    importance weights per sequence; it returns each step's |TD error| (the caller mixes them
    into one priority per sequence: ``cpprb_ray.sequence_priority``).

    Parameters
    ----------
    network : RecurrentQ
        The online network (trained in place).
    burn_in : int
        Leading steps of each sequence that only warm up the state (no loss, no gradient).
    nstep, gamma : int, float
        The n-step targets inside the sequence.
    learning_rate, target_every, max_grad_norm :
        Adam's step size, learner steps between target copies, global gradient-norm clip.

    Examples
    --------
    >>> import numpy as np
    >>> learner = R2D2(RecurrentQ(2, 4, 8, 2, seed=0), burn_in=1, nstep=1, gamma=0.9)
    >>> batch = {"obs": np.zeros((2, 3, 2)), "act": np.zeros((2, 3), dtype=np.int64),
    ...          "rew": np.ones((2, 3)), "done": np.array([[0, 0, 1], [0, 0, 0]]),
    ...          "mask": np.ones((2, 3), bool), "core": np.zeros((2, 4)),
    ...          "weights": np.ones(2)}
    >>> loss, abs_td, has = learner.loss_and_grads(batch)[:3]
    >>> has.T.astype(int)     # burn-in step 0: no loss; row 1's last step: no successor
    array([[0, 1, 1],
           [0, 1, 0]])
    """

    def __init__(self, network: RecurrentQ, burn_in: int, nstep: int, gamma: float,
                 learning_rate: float = 1e-3, target_every: int = 500,
                 max_grad_norm: float = 10.0) -> None:
        self.network = network
        self.target = RecurrentQ(*network.sizes, dtype=network.dtype)
        self.target.set_weights(network.params)
        self.optimizer = Adam(network.params, learning_rate)
        self.burn_in, self.nstep, self.gamma = int(burn_in), int(nstep), float(gamma)
        self.target_every = int(target_every)
        self.max_grad_norm = float(max_grad_norm)
        self.steps = 0

    def loss_and_grads(self, batch: Dict[str, np.ndarray]
                       ) -> Tuple[float, np.ndarray, np.ndarray, List[np.ndarray]]:
        """Loss, ``|TD|`` and where a step has a loss (both ``(time, batch)``), gradients.

        `batch` columns are batch-major: obs ``(B, L, in)``, act/rew/done/mask ``(B, L)``,
        core ``(B, H)`` (the actor's state before the sequence's first step), weights ``(B,)``.
        """
        obs = np.swapaxes(np.asarray(batch["obs"], dtype=self.network.dtype), 0, 1)
        act = np.asarray(batch["act"]).astype(np.int64).T
        rew, done = np.asarray(batch["rew"]).T, np.asarray(batch["done"]).T
        mask = np.asarray(batch["mask"], dtype=bool).T
        core = np.asarray(batch["core"], dtype=self.network.dtype)
        burn = self.burn_in
        # Burn-in: both networks warm up their state on the first steps, without gradients.
        _, online_state, _ = self.network.unroll(obs[:burn], core, keep=False)
        _, target_state, _ = self.target.unroll(obs[:burn], core, keep=False)
        q, _, cache = self.network.unroll(obs[burn:], online_state)
        q_target, _, _ = self.target.unroll(obs[burn:], target_state, keep=False)
        targets, has = nstep_targets(rew[burn:], done[burn:], mask[burn:], q, q_target,
                                     self.nstep, self.gamma)
        steps, rows = act[burn:].shape
        times, columns = np.meshgrid(np.arange(steps), np.arange(rows), indexing="ij")
        chosen = q[times, columns, act[burn:]]
        td = np.where(has, chosen - targets, 0.0)
        losses, slopes = huber(td)
        weights = np.asarray(batch["weights"], dtype=np.float64).reshape(1, rows)
        # The mean over every step that has a loss, each weighted by its sequence's weight.
        count = max(int(has.sum()), 1)
        grad_q = np.zeros_like(q)
        grad_q[times, columns, act[burn:]] = np.where(has, weights * slopes, 0.0) / count
        grads = self.network.backward(cache, grad_q)
        loss = float(np.sum(np.where(has, weights * losses, 0.0)) / count)
        abs_td = np.zeros((act.shape[0], rows))
        abs_td[burn:] = np.abs(td)
        has_all = np.zeros_like(mask)
        has_all[burn:] = has
        return loss, abs_td, has_all, grads

    def train_step(self, batch: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        """One Adam step on a batch of sequences; returns ``|TD error|`` of every step and
        where a step was trained (not burn-in or padding, and it has a target), both
        ``(B, L)``."""
        _, abs_td, has, grads = self.loss_and_grads(batch)
        self.optimizer.step(clip_global_norm(grads, self.max_grad_norm))
        self.steps += 1
        if self.steps % self.target_every == 0:
            self.target.set_weights(self.network.params)
        return abs_td.T, has.T
