"""A small Q-network, Adam and the double-DQN update, in numpy alone (vectorized over a batch).

The Ape-X example (``examples/apex.py``) runs its actors and its learner on this module, so that
the example needs nothing beyond numpy to learn. Everything here works on whole batches: one
matrix product per layer, no Python loop over rows.

Examples
--------
>>> import numpy as np
>>> net = MLP([4, 16, 2], seed=0)
>>> learner = DoubleDQN(net, learning_rate=1e-3, target_every=100)
>>> batch = {"obs": np.zeros((8, 4)), "act": np.zeros(8, dtype=np.int64), "rew": np.ones(8),
...          "next_obs": np.zeros((8, 4)), "done": np.ones(8), "weights": np.ones(8)}
>>> learner.train_step(batch, discount=0.99).shape   # one new priority per row
(8,)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["MLP", "Adam", "DoubleDQN", "clip_global_norm", "double_dqn_targets",
           "greedy_td_errors", "huber"]

Discounts = Union[float, np.ndarray]


class MLP:
    """A fully connected ReLU network with a linear output layer.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths, input first and output last, e.g. ``[4, 64, 64, 2]``.
    seed : int, optional
        Seed of the He-uniform initialisation (biases start at 0).
    dtype : numpy dtype
        float32 for speed, float64 for gradient checks.

    Examples
    --------
    >>> import numpy as np
    >>> net = MLP([4, 8, 2], seed=0)
    >>> net.forward(np.ones((3, 4))).shape
    (3, 2)
    >>> [p.shape for p in net.params]
    [(4, 8), (8,), (8, 2), (2,)]
    """

    def __init__(self, sizes: Sequence[int], seed: Optional[int] = None,
                 dtype: Any = np.float32) -> None:
        if len(sizes) < 2 or any(int(size) <= 0 for size in sizes):
            raise ValueError(f"sizes must be >= 2 positive layer widths; got {list(sizes)}")
        rng = np.random.default_rng(seed)
        self.sizes = [int(size) for size in sizes]
        self.dtype = np.dtype(dtype)
        self.params: List[np.ndarray] = []
        for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:]):
            bound = np.sqrt(6.0 / fan_in)  # He-uniform: keeps ReLU activations' scale per layer
            self.params.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(self.dtype))
            self.params.append(np.zeros(fan_out, dtype=self.dtype))

    def forward(self, inputs: np.ndarray) -> np.ndarray:
        """Q-values (or any outputs) for a batch: shape ``(batch, sizes[-1])``.

        Examples
        --------
        >>> import numpy as np
        >>> MLP([2, 3, 1], seed=1).forward(np.zeros((5, 2))).ravel()   # zero input, zero biases
        array([0., 0., 0., 0., 0.], dtype=float32)
        """
        return self.forward_with_cache(inputs)[0]

    def forward_with_cache(self, inputs: np.ndarray) -> Tuple[np.ndarray, List[np.ndarray]]:
        """Outputs and the layer inputs that :meth:`backward` needs.

        Examples
        --------
        >>> import numpy as np
        >>> outputs, cache = MLP([2, 3, 1], seed=1).forward_with_cache(np.ones((4, 2)))
        >>> outputs.shape, [layer_input.shape for layer_input in cache]
        ((4, 1), [(4, 2), (4, 3)])
        """
        activation = np.asarray(inputs, dtype=self.dtype).reshape(-1, self.sizes[0])
        cache = []
        last = len(self.params) // 2 - 1
        for layer in range(last + 1):
            cache.append(activation)
            activation = activation @ self.params[2 * layer] + self.params[2 * layer + 1]
            if layer < last:
                activation = np.maximum(activation, 0)
        return activation, cache

    def backward(self, cache: List[np.ndarray], grad_outputs: np.ndarray) -> List[np.ndarray]:
        """Gradients of ``sum(grad_outputs * outputs)`` with respect to every parameter.

        Examples
        --------
        >>> import numpy as np
        >>> net = MLP([2, 3, 1], seed=1)
        >>> outputs, cache = net.forward_with_cache(np.ones((4, 2)))
        >>> [g.shape for g in net.backward(cache, np.ones_like(outputs))]
        [(2, 3), (3,), (3, 1), (1,)]
        """
        grads: List[np.ndarray] = [np.empty(0)] * len(self.params)
        upstream = np.asarray(grad_outputs, dtype=self.dtype)
        for layer in range(len(self.params) // 2 - 1, -1, -1):
            layer_input = cache[layer]
            grads[2 * layer] = layer_input.T @ upstream
            grads[2 * layer + 1] = upstream.sum(axis=0)
            if layer > 0:
                # The cached input of this layer is the ReLU output of the one below: where it is
                # 0 the ReLU was off and passes no gradient.
                upstream = (upstream @ self.params[2 * layer].T) * (layer_input > 0)
        return grads

    def get_weights(self) -> List[np.ndarray]:
        """Copies of the parameters (what the learner publishes to the actors).

        Examples
        --------
        >>> net = MLP([2, 2], seed=0)
        >>> weights = net.get_weights()
        >>> weights[0] is net.params[0]
        False
        """
        return [param.copy() for param in self.params]

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Replace the parameters with copies of `weights` (same shapes).

        Examples
        --------
        >>> import numpy as np
        >>> net = MLP([2, 2], seed=0)
        >>> net.set_weights([np.ones((2, 2)), np.zeros(2)])
        >>> net.forward(np.ones((1, 2)))
        array([[2., 2.]], dtype=float32)
        """
        if len(weights) != len(self.params) or any(
                np.shape(new) != old.shape for new, old in zip(weights, self.params)):
            raise ValueError(f"weights must have shapes {[p.shape for p in self.params]}; got "
                             f"{[np.shape(w) for w in weights]}")
        self.params = [np.array(new, dtype=self.dtype) for new in weights]


class Adam:
    """Adam (Kingma and Ba), updating a list of arrays in place.

    Examples
    --------
    >>> import numpy as np
    >>> params = [np.array([1.0, -1.0])]
    >>> Adam(params, learning_rate=0.1).step([np.array([2.0, -3.0])])
    >>> params[0].round(6)   # the first step moves each entry by the learning rate
    array([ 0.9, -0.9])
    """

    def __init__(self, params: List[np.ndarray], learning_rate: float = 1e-3,
                 beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8) -> None:
        self.params = params
        self.learning_rate = learning_rate
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.first = [np.zeros_like(p) for p in params]
        self.second = [np.zeros_like(p) for p in params]
        self.steps = 0

    def step(self, grads: Sequence[np.ndarray]) -> None:
        """Apply one update from `grads` (one per parameter, same shapes).

        Examples
        --------
        >>> import numpy as np
        >>> optimizer = Adam([np.zeros(3)])
        >>> optimizer.step([np.ones(3)]); optimizer.steps
        1
        """
        self.steps += 1
        scale = self.learning_rate * np.sqrt(1 - self.beta2 ** self.steps) / (
            1 - self.beta1 ** self.steps)
        for param, grad, first, second in zip(self.params, grads, self.first, self.second):
            first *= self.beta1
            first += (1 - self.beta1) * grad
            second *= self.beta2
            second += (1 - self.beta2) * grad * grad
            param -= (scale * first / (np.sqrt(second) + self.epsilon)).astype(param.dtype)


def huber(errors: np.ndarray, delta: float = 1.0) -> Tuple[np.ndarray, np.ndarray]:
    """The Huber loss of each error and its derivative.

    Examples
    --------
    >>> import numpy as np
    >>> loss, slope = huber(np.array([-3.0, 0.5, 2.0]))
    >>> loss, slope
    (array([2.5  , 0.125, 1.5  ]), array([-1. ,  0.5,  1. ]))
    """
    absolute = np.abs(errors)
    quadratic = np.minimum(absolute, delta)
    loss = 0.5 * quadratic * quadratic + delta * (absolute - quadratic)
    return loss, np.clip(errors, -delta, delta)


def double_dqn_targets(rew: np.ndarray, discounts: Discounts, done: np.ndarray,
                       q_next_online: np.ndarray, q_next_target: np.ndarray) -> np.ndarray:
    """``rew + discounts * (1 - done) * Q_target(next_obs, argmax_a Q_online(next_obs, a))``.

    With N-step rows, `rew` is the discounted sum of the window's rewards and `discounts` is
    ``gamma ** m`` for the window of m steps actually used (shorter at an episode's end);
    `done` means the episode terminated inside the window (a truncated one bootstraps).

    Examples
    --------
    >>> import numpy as np
    >>> double_dqn_targets(np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([0.0, 1.0]),
    ...                    q_next_online=np.array([[1.0, 2.0], [3.0, 0.0]]),
    ...                    q_next_target=np.array([[10.0, 20.0], [30.0, 40.0]]))
    array([11.,  1.])
    """
    best = np.argmax(q_next_online, axis=1)
    bootstrap = q_next_target[np.arange(best.shape[0]), best]
    return rew + discounts * (1.0 - done) * bootstrap


class DoubleDQN:
    """The learner's update: double DQN with importance weights and a periodic target copy.

    Parameters
    ----------
    network : MLP
        The online network (trained in place).
    learning_rate : float
        Adam's step size.
    target_every : int
        Learner steps between copies of the online network into the target network.
    max_grad_norm : float
        Gradients are scaled down to this global norm (keeps early, large TD errors tame).

    Examples
    --------
    >>> import numpy as np
    >>> learner = DoubleDQN(MLP([4, 8, 2], seed=0), target_every=2)
    >>> batch = {"obs": np.ones((4, 4)), "act": np.array([0, 1, 0, 1]), "rew": np.ones(4),
    ...          "next_obs": np.ones((4, 4)), "done": np.zeros(4), "weights": np.ones(4)}
    >>> for _ in range(2):
    ...     _ = learner.train_step(batch, discount=0.9)
    >>> learner.steps, all(np.array_equal(a, b) for a, b in
    ...                    zip(learner.network.params, learner.target.params))
    (2, True)
    """

    def __init__(self, network: MLP, learning_rate: float = 1e-3, target_every: int = 500,
                 max_grad_norm: float = 10.0) -> None:
        self.network = network
        self.target = MLP(network.sizes, dtype=network.dtype)
        self.target.set_weights(network.params)
        self.optimizer = Adam(network.params, learning_rate)
        self.target_every = target_every
        self.max_grad_norm = max_grad_norm
        self.steps = 0

    def loss_and_grads(self, batch: Dict[str, np.ndarray], discount: Discounts
                       ) -> Tuple[float, np.ndarray, List[np.ndarray]]:
        """Importance-weighted mean Huber loss, TD errors and the loss's gradients.

        `discount` is the batch's "discounts" column (N-step) or one gamma for every row.

        Examples
        --------
        >>> import numpy as np
        >>> learner = DoubleDQN(MLP([2, 4, 2], seed=0))
        >>> batch = {"obs": np.zeros((2, 2)), "act": np.array([0, 1]), "rew": np.array([1.0, -1.0]),
        ...          "next_obs": np.zeros((2, 2)), "done": np.ones(2), "weights": np.ones(2)}
        >>> loss, td_errors, grads = learner.loss_and_grads(batch, 0.99)
        >>> loss, td_errors   # zero inputs and biases: Q = 0, so the errors are -rew
        (0.5, array([-1.,  1.]))
        """
        actions = np.asarray(batch["act"]).reshape(-1).astype(np.int64)
        rows = actions.shape[0]

        def column(name: str) -> np.ndarray:
            return np.asarray(batch[name], dtype=np.float64).reshape(rows)

        if np.ndim(discount) > 0:
            discount = np.asarray(discount, dtype=np.float64).reshape(rows)
        targets = double_dqn_targets(column("rew"), discount, column("done"),
                                     self.network.forward(batch["next_obs"]),
                                     self.target.forward(batch["next_obs"]))
        q_values, cache = self.network.forward_with_cache(batch["obs"])
        td_errors = q_values[np.arange(rows), actions] - targets
        losses, slopes = huber(td_errors)
        weights = column("weights")
        grad_q = np.zeros_like(q_values)
        grad_q[np.arange(rows), actions] = weights * slopes / rows
        grads = self.network.backward(cache, grad_q)
        return float(np.mean(weights * losses)), td_errors, grads

    def train_step(self, batch: Dict[str, np.ndarray], discount: Discounts) -> np.ndarray:
        """One Adam step on `batch`; returns ``|TD error|`` per row (the new priorities).

        Examples
        --------
        >>> import numpy as np
        >>> learner = DoubleDQN(MLP([2, 4, 2], seed=0))
        >>> batch = {"obs": np.ones((3, 2)), "act": np.zeros(3, dtype=np.int64),
        ...          "rew": np.ones(3), "next_obs": np.ones((3, 2)), "done": np.ones(3),
        ...          "weights": np.ones(3)}
        >>> bool((learner.train_step(batch, 0.99) >= 0).all()), learner.steps
        (True, 1)
        """
        _, td_errors, grads = self.loss_and_grads(batch, discount)
        self.optimizer.step(clip_global_norm(grads, self.max_grad_norm))
        self.steps += 1
        if self.steps % self.target_every == 0:
            self.target.set_weights(self.network.params)
        return np.abs(td_errors)


def clip_global_norm(grads: List[np.ndarray], max_norm: float) -> List[np.ndarray]:
    """`grads` scaled down together so that their global norm is at most `max_norm`.

    Examples
    --------
    >>> import numpy as np
    >>> [g.tolist() for g in clip_global_norm([np.array([6.0]), np.array([8.0])], 5.0)]
    [[3.0], [4.0]]
    """
    norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
    if norm > max_norm:
        return [g * (max_norm / norm) for g in grads]
    return grads


def greedy_td_errors(network: MLP, obs: np.ndarray, act: np.ndarray, rew: np.ndarray,
                     next_obs: np.ndarray, done: np.ndarray, discount: float) -> np.ndarray:
    """An actor's one-step TD errors ``|r + discount (1 - done) max Q(s') - Q(s, a)|``.

    Actors have one network (no target copy), so this is plain Q-learning's error; it only
    seeds a row's priority until the learner samples the row and replaces it.

    Examples
    --------
    >>> import numpy as np
    >>> net = MLP([2, 2], seed=0)
    >>> net.set_weights([np.zeros((2, 2)), np.array([1.0, 3.0])])   # Q = (1, 3) everywhere
    >>> greedy_td_errors(net, np.zeros((2, 2)), np.array([0, 1]), np.array([1.0, 0.0]),
    ...                  np.zeros((2, 2)), np.array([0.0, 1.0]), discount=0.5)
    array([1.5, 3. ])
    """
    rows = np.asarray(act).reshape(-1).astype(np.int64)
    q_now = network.forward(obs)[np.arange(rows.shape[0]), rows]
    q_next = network.forward(next_obs).max(axis=1)
    targets = np.asarray(rew, np.float64).reshape(-1) + discount * (
        1.0 - np.asarray(done, np.float64).reshape(-1)) * q_next
    return np.abs(targets - q_now)
