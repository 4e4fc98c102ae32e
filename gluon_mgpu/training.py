"""Data-parallel training, as the chapter does it with Gluon.

One step: ``split_and_load`` cuts the batch into one slice per device; under
``autograd.record()`` every device runs the network on its slice; ``backward()`` on every
device's loss; then ``trainer.step(batch_size)`` sums the gradients of all devices (the
kvstore), divides by the batch size and updates every replica the same way.

Two extensions of the chapter: slices in proportion to per-device weights, for devices of
different speed (``split_batch(..., device_weights)``, ``measure_device_speeds``), and a
distributed kvstore (``dist_sync``), where the kvstore also sums over worker processes.
"""
import functools
import math
import numbers
import time
from fractions import Fraction

import mxnet as mx
from mxnet import autograd, gluon, init, nd
from mxnet.gluon import loss as gloss, utils as gutils

from .devices import try_all_gpus

__all__ = ['split_batch', 'slice_sizes', 'check_device_weights', 'measure_device_speeds',
           'evaluate_accuracy', 'train_epoch', 'train', 'format_epoch', 'init_training',
           'LossNotFiniteError']


class LossNotFiniteError(RuntimeError):
    """The training loss became NaN or infinite: training diverged.

    Attributes ``epoch`` (None when raised by ``train_epoch`` alone), ``step`` (both from 1),
    ``lr`` (the learning rate in use) and ``loss`` (the running loss sum, ``nan`` or ``inf``).
    """

    def __init__(self, step, lr, loss, epoch=None):
        super().__init__(step, lr, loss, epoch)
        self.step, self.lr, self.loss, self.epoch = step, lr, loss, epoch

    def __str__(self):
        where = 'step %d' % self.step if self.epoch is None else 'epoch %d, step %d' % (
            self.epoch, self.step)
        return ('the training loss became %s at %s with learning rate %g: training diverged; '
                'use a smaller learning rate' % (self.loss, where, self.lr))


def _check_finite(loss_sums, step, trainer):
    loss = sum(v.asscalar() for v in loss_sums)
    if not math.isfinite(loss):
        raise LossNotFiniteError(step, trainer.learning_rate, loss)


def check_device_weights(device_weights, num_devices):
    """Return ``device_weights`` as a list of floats, or raise ValueError naming what is wrong."""
    weights = list(device_weights)
    if len(weights) != num_devices:
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

    Largest-remainder rounding: each device gets the whole part of its exact share
    ``n * w_i / sum(w)``, and the examples left over go to the largest fractional parts
    (the first device on a tie). A device whose share rounds to 0 still gets one example,
    taken from the largest slice. The sizes always add up to ``n``.

    Examples: 16 examples with weights 3, 1 give 12, 4; 10 with 1, 1, 1 give 4, 3, 3 (what
    ``split_and_load`` gives); 5 with 100, 1 give 4, 1.

    Raises
    ------
    ValueError
        If ``n`` is smaller than the number of devices, or a weight is not above 0.
    """
    weights = check_device_weights(device_weights, len(device_weights))
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


def split_batch(X, y, devices, device_weights=None):
    """Split a batch over devices; return ``(Xs, ys, weights)``, one entry per device.

    Like ``gluon.utils.split_and_load(..., even_split=False)``: slices differ in size by at
    most one example (10 examples on 3 devices: 4, 3, 3). The book needs the batch size to
    be a multiple of the device count; this does not, so the last batch of an epoch works.

    With ``device_weights`` (one positive number per device, for example its measured speed)
    the slices follow the weights instead (``slice_sizes``): 3, 1 gives a 16-example batch as
    12 and 4. Either way the slices cover the batch exactly, in order.

    A batch with fewer examples than devices leaves some devices without data, but the
    Trainer needs a fresh gradient from every device. Those devices get the first example
    with weight 0: their gradient is exactly zero, so the sum over devices is the gradient
    of the real examples. ``weights`` is ``None`` for a device with a real slice.
    """
    n = X.shape[0]
    if n >= len(devices) and device_weights is not None:
        Xs, ys, start = [], [], 0
        for size, d in zip(slice_sizes(n, check_device_weights(device_weights, len(devices))),
                           devices):
            Xs.append(X[start:start + size].as_in_context(d))
            ys.append(y[start:start + size].as_in_context(d))
            start += size
        return Xs, ys, [None] * len(devices)
    if n >= len(devices):
        return (gutils.split_and_load(X, devices, even_split=False),
                gutils.split_and_load(y, devices, even_split=False),
                [None] * len(devices))
    Xs = [X[i:i + 1].as_in_context(d) if i < n else X[0:1].as_in_context(d)
          for i, d in enumerate(devices)]
    ys = [y[i:i + 1].as_in_context(d) if i < n else y[0:1].as_in_context(d)
          for i, d in enumerate(devices)]
    weights = [None if i < n else nd.zeros((1, 1), ctx=d) for i, d in enumerate(devices)]
    return Xs, ys, weights


def evaluate_accuracy(data_iter, net, devices=None):
    """Return the fraction of examples in ``data_iter`` that ``net`` classifies correctly.

    Every batch is split over all ``devices`` (default: ``try_all_gpus()``), so evaluation
    uses them all. Counts stay on the devices until the end, so MXNet can run ahead.
    """
    devices = try_all_gpus() if devices is None else list(devices)
    correct = [nd.zeros((1,), ctx=d) for d in devices]
    n = 0
    for X, y in data_iter:
        Xs, ys, weights = split_batch(X, y, devices)
        for i, (X_d, y_d, w) in enumerate(zip(Xs, ys, weights)):
            if w is None:
                correct[i] += (net(X_d).argmax(axis=1) == y_d.astype('float32')).sum()
        n += X.shape[0]
    if n == 0:
        raise ValueError('the data iterator yielded no examples')
    return sum(c.asscalar() for c in correct) / n


def measure_device_speeds(net, X, y, devices, loss=None, repeats=3, min_seconds=0.2):
    """Time a training pass (forward and backward) of ``(X, y)`` on each device; return examples/s.

    Each device first runs the batch once untimed (graph building, memory allocation), then
    at least ``repeats`` times and at least ``min_seconds`` timed, each pass ended by
    ``nd.waitall()`` (a very short measurement is mostly noise). BatchNorm running statistics are
    restored afterwards, so the measurement leaves ``net`` as it was (gradients aside, which
    the next ``backward`` overwrites). ``net`` must be initialized on every device.
    Use the result as ``device_weights``: slices then take about equally long everywhere.
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


def train_epoch(net, train_iter, loss, trainer, devices, on_step=None, on_batch=None,
                device_weights=None, num_workers=1):
    """Run one pass over ``train_iter``; return ``{'seconds', 'train_loss', 'train_acc', 'examples'}``.

    ``seconds`` is measured after ``nd.waitall()``, since MXNet computes asynchronously.
    ``on_step(step)``, if given, is called after every ``trainer.step`` (``step`` counts from 1).

    Raises ``LossNotFiniteError`` when the loss becomes NaN or infinite, naming the step. The
    check reads the running loss sum one step late: while Python waits for the sum of step
    ``s - 1``, step ``s`` is already queued, so MXNet never runs out of work because of it.

    ``on_batch(step, examples, running_loss)``, if given, is called there too, with the batch's
    size and a function returning the mean training loss of the epoch so far; that function
    waits for the devices, so call it only when the value will be shown.

    ``device_weights`` is passed to ``split_batch``. With a dist kvstore, ``num_workers``
    processes each hold an equal share of every global batch (``ArrayBatches.set_part``),
    so the step divides by ``num_workers`` times the local batch size. The returned
    numbers are this process's own (its share of the epoch).
    """
    loss_sum = [nd.zeros((1,), ctx=d) for d in devices]
    correct = [nd.zeros((1,), ctx=d) for d in devices]
    n = 0
    previous = None
    start = time.time()
    for step, (X, y) in enumerate(train_iter, 1):
        Xs, ys, weights = split_batch(X, y, devices, device_weights)
        with autograd.record():
            outs = [net(X_d) for X_d in Xs]
            ls = [loss(o, y_d) if w is None else loss(o, y_d, w)
                  for o, y_d, w in zip(outs, ys, weights)]
        for l in ls:
            l.backward()
        # Gradients were summed over the batch (and, by a dist kvstore, over the workers):
        # step divides by the real number of examples.
        trainer.step(X.shape[0] * num_workers)
        for i, (o, y_d, l, w) in enumerate(zip(outs, ys, ls, weights)):
            if w is None:
                # A new array, not +=: `previous` keeps the sums up to the last step.
                loss_sum[i] = loss_sum[i] + l.sum()
                correct[i] += (o.argmax(axis=1) == y_d.astype('float32')).sum()
        n += X.shape[0]
        if previous is not None:
            _check_finite(previous, step - 1, trainer)
        previous = list(loss_sum)
        if on_step is not None:
            on_step(step)
        if on_batch is not None:
            on_batch(step, X.shape[0], lambda: sum(v.asscalar() for v in loss_sum) / n)
    nd.waitall()
    seconds = time.time() - start
    if previous is not None:
        _check_finite(previous, step, trainer)
    return {'seconds': seconds,
            'train_loss': sum(v.asscalar() for v in loss_sum) / n,
            'train_acc': sum(v.asscalar() for v in correct) / n,
            'examples': n}


def format_epoch(record):
    """The book's per-epoch line: ``epoch 1, training time: 63.5 sec, test_acc 0.86``."""
    return 'epoch %d, training time: %.1f sec, test_acc %.2f' % (
        record['epoch'], record['seconds'], record['test_acc'])


def init_training(net, devices, lr, seed=None, kvstore='device'):
    """The chapter's set-up: initialize ``net`` on every device, return an SGD ``Trainer``.

    ``Normal(sigma=0.01)`` on every device (``force_reinit``), after seeding MXNet's random
    generators with ``seed`` when given; then ``gluon.Trainer(..., 'sgd', {'learning_rate': lr},
    kvstore=kvstore)``.
    """
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(init.Normal(sigma=0.01), ctx=devices, force_reinit=True)
    return gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': lr},
                         kvstore=kvstore)


def train(net, train_iter, test_iter, devices=None, lr=0.1, num_epochs=4, seed=None,
          verbose=True, on_step=None, on_epoch=None, on_batch=None, trainer=None,
          start_epoch=0, history=None, kvstore='device', device_weights=None):
    """Train ``net`` data-parallel on ``devices`` and return the per-epoch history.

    The chapter's loop: ``init_training`` (``Normal(sigma=0.01)`` on every device, an SGD
    ``Trainer``), then per batch ``split_and_load``, losses recorded per device, ``backward`` on
    each, ``trainer.step`` with the batch's real size.

    Parameters
    ----------
    net : mxnet.gluon.Block
        For example ``resnet18(10)``; (re)initialized here on ``devices`` unless ``trainer`` is
        given.
    train_iter, test_iter : iterable of (X, y)
        For example from ``load_data_fashion_mnist``; the global batch is split over devices.
    devices : list of mxnet.Context, optional
        Default ``try_all_gpus()``. With the book's settings use a global batch of 256 and
        ``lr=0.1`` per device.
    lr : float, default 0.1
    num_epochs : int, default 4
    seed : int, optional
        Seed MXNet's random generators before initializing, for a reproducible run.
    verbose : bool, default True
        Print the book's line after each epoch (``format_epoch``); in a dist job, rank 0 only.
    on_step : callable, optional
        ``on_step(epoch, step)`` after every ``trainer.step`` (both count from 1), for checks
        that watch training as it goes; an exception it raises stops training.
    on_epoch : callable, optional
        ``on_epoch(record)`` after each epoch's record is complete (and printed).
    on_batch : callable, optional
        ``on_batch(epoch, step, examples, running_loss)`` after every ``trainer.step``, for a
        progress display: ``examples`` is the batch's size, ``running_loss()`` the epoch's mean
        training loss so far (it waits for the devices; call it only to show it).
    trainer : mxnet.gluon.Trainer, optional
        Continue with this Trainer and the parameters ``net`` holds on ``devices`` (for example
        restored from a checkpoint) instead of ``init_training``; ``lr`` and ``seed`` are then
        not used.
    start_epoch : int, default 0
        The number of epochs already done: training runs epochs ``start_epoch + 1`` to
        ``num_epochs``. ``train_iter.set_epoch(start_epoch)`` is called when it has that method
        (``ArrayBatches``), so the data come in the order the uninterrupted run would use.
    history : list of dict, optional
        The records of the epochs already done; the returned history starts with them.
    kvstore : str or mxnet.kvstore.KVStore, default 'device'
        Passed to ``gluon.Trainer``: ``'device'`` (the book's default: gradients summed on the
        devices), ``'local'`` (summed on the CPU), or a dist kvstore such as ``'dist_sync'``
        (summed over the worker processes of a job by its servers; start them with
        ``python -m gluon_mgpu.launch``). For a dist kvstore every worker must pass the same
        ``seed`` and its own shard, ``train_iter.set_part(kv.num_workers, kv.rank)``; only
        rank 0 prints. Parameters are then updated on the servers (MXNet's default), which
        fix the gradient scale at the first step: every step must see the same global batch,
        which ``set_part`` ensures. A given ``trainer`` must have been made with the same
        kvstore.
    device_weights : list of float, optional
        One positive weight per device: each batch is split in proportion (``split_batch``),
        for devices of different speed. Default: even slices, as the book.

    Returns
    -------
    list of dict
        One per epoch: ``epoch``, ``seconds`` (training only), ``train_loss``, ``train_acc``,
        ``test_acc``, ``images_per_sec`` (training images per second). In a dist job the
        training numbers are this worker's (its shard); ``test_acc`` is on the whole test set.

    Raises
    ------
    LossNotFiniteError
        When the training loss becomes NaN or infinite (its ``epoch`` and ``step`` say where).
    """
    devices = try_all_gpus() if devices is None else list(devices)
    if device_weights is not None:
        device_weights = check_device_weights(device_weights, len(devices))
    if isinstance(kvstore, str) and 'dist' in kvstore:
        kvstore = mx.kv.create(kvstore)
    distributed = isinstance(kvstore, mx.kv.KVStore) and 'dist' in kvstore.type
    rank, num_workers = (kvstore.rank, kvstore.num_workers) if distributed else (0, 1)
    if trainer is None:
        trainer = init_training(net, devices, lr, seed, kvstore)
    if start_epoch and hasattr(train_iter, 'set_epoch'):
        train_iter.set_epoch(start_epoch)
    loss = gloss.SoftmaxCrossEntropyLoss()
    history = list(history or [])
    for epoch in range(start_epoch, num_epochs):
        step_hook = None if on_step is None else functools.partial(on_step, epoch + 1)
        batch_hook = None if on_batch is None else functools.partial(on_batch, epoch + 1)
        try:
            stats = train_epoch(net, train_iter, loss, trainer, devices, on_step=step_hook,
                                on_batch=batch_hook, device_weights=device_weights,
                                num_workers=num_workers)
        except LossNotFiniteError as e:
            e.epoch = epoch + 1
            raise
        record = {'epoch': epoch + 1,
                  'seconds': stats['seconds'],
                  'train_loss': stats['train_loss'],
                  'train_acc': stats['train_acc'],
                  'test_acc': evaluate_accuracy(test_iter, net, devices),
                  'images_per_sec': stats['examples'] / stats['seconds']}
        history.append(record)
        if verbose and rank == 0:
            print(format_epoch(record), flush=True)
        if on_epoch is not None:
            on_epoch(record)
    return history
