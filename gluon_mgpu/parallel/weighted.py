"""Devices of different speed: slices of a batch in proportion to per-device weights
(``split_by_weights``), and the weights measured (``measure_device_speeds``). docs/devices.md
explains it.
"""
import functools
import itertools
import math
import numbers
import time
from fractions import Fraction

from mxnet import autograd, nd
from mxnet.gluon import loss as gloss

from ..train_checks import check_split

__all__ = ['check_device_weights', 'slice_sizes', 'split_by_weights', 'split_by',
           'measure_device_speeds']


def check_device_weights(device_weights, num_devices=None):
    """Return ``device_weights`` (``num_devices`` of them, if given) as a list of floats, or raise
    ValueError naming what is wrong."""
    weights = list(device_weights)
    if num_devices is not None and len(weights) != num_devices:
        raise ValueError('%d device weights for %d devices; give one weight per device'
                         % (len(weights), num_devices))
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) \
                or w <= 0:
            raise ValueError('device weights must be finite numbers above 0, got %r'
                             % (device_weights,))
    return [float(w) for w in weights]


def slice_sizes(n, device_weights):
    """Split ``n`` examples in proportion to ``device_weights``; return one size per device.

    Largest-remainder rounding (docs/devices.md; the first device wins a tie), at least one
    example per device, taken from the largest slice: 16 with weights 3, 1 give 12, 4; 10 with
    1, 1, 1 give 4, 3, 3 (as ``split_and_load``); 5 with 100, 1 give 4, 1. ValueError if ``n``
    is smaller than the number of devices, or a weight is not above 0.
    """
    weights = check_device_weights(device_weights)
    k = len(weights)
    if n < k:
        raise ValueError('%d examples cannot give each of %d devices at least one; '
                         'use a batch of %d or more' % (n, k, k))
    # Exact fractions: the rounding must not depend on float error in n * w / sum(w).
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [n * w / total for w in exact]
    sizes = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(k), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_remainder[:n - sum(sizes)]:
        sizes[i] += 1
    for i in range(k):
        if sizes[i] == 0:
            largest = max(range(k), key=lambda j: (sizes[j], -j))
            sizes[largest] -= 1
            sizes[i] = 1
    return sizes


def split_by_weights(device_weights):
    """Return a ``split_f`` for ``train()`` that slices every batch in proportion to the weights:
    ``split_by_weights([3, 1])`` gives a 16-example batch to two devices as 12 and 4."""
    return functools.partial(split_by, device_weights=check_device_weights(device_weights))


def split_by(X, y, devices, device_weights):
    """Like ``training.split_batch``, with slices in proportion to ``device_weights``."""
    check_split(X, y, devices)
    sizes = slice_sizes(X.shape[0], check_device_weights(device_weights, len(devices)))
    edges = list(itertools.accumulate([0] + sizes))
    return ([X[a:b].as_in_context(d) for a, b, d in zip(edges, edges[1:], devices)],
            [y[a:b].as_in_context(d) for a, b, d in zip(edges, edges[1:], devices)])


def measure_device_speeds(net, X, y, devices, loss=None, repeats=3, min_seconds=0.2):
    """Time a training pass (forward and backward) of ``(X, y)`` on each device; return examples/s.

    After one untimed pass, at least ``repeats`` passes and ``min_seconds`` on each device.
    BatchNorm's running statistics are restored afterwards. ``net`` is initialized on every
    device. The result serves as ``device_weights``: slices then take about as long everywhere.
    """
    loss = gloss.SoftmaxCrossEntropyLoss() if loss is None else loss
    for d in devices:
        net(X.as_in_context(d))  # prediction mode: finishes deferred init, leaves statistics
    saved = [(p, [a.copy() for a in p.list_data()])
             for p in net.collect_params().values() if p.grad_req == 'null']
    speeds = []
    for d in devices:
        X_d, y_d = X.as_in_context(d), y.as_in_context(d)

        def one_pass():
            with autograd.record():
                l = loss(net(X_d), y_d)
            l.backward()
            nd.waitall()

        one_pass()
        passes, start = 0, time.time()
        while passes < repeats or time.time() - start < min_seconds:
            one_pass()
            passes += 1
        speeds.append(X.shape[0] * passes / (time.time() - start))
    for p, copies in saved:
        for a, copy in zip(p.list_data(), copies):
            copy.copyto(a)
    nd.waitall()
    return speeds
