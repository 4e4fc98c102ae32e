"""Data-parallel training, as the chapter does it with Gluon.

One step: ``split_and_load`` cuts the batch into one slice per device; under
``autograd.record()`` every device runs the network on its slice; ``backward()`` on every
device's loss; then ``trainer.step(batch_size)`` sums the gradients of all devices (the
kvstore), divides by the batch size and updates every replica the same way.
"""
import functools
import math
import time

import mxnet as mx
from mxnet import autograd, gluon, init, nd
from mxnet.gluon import loss as gloss, utils as gutils

from .devices import try_all_gpus

__all__ = ['split_batch', 'evaluate_accuracy', 'train_epoch', 'train', 'format_epoch',
           'init_training', 'LossNotFiniteError']


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


def split_batch(X, y, devices):
    """Split a batch over devices; return ``(Xs, ys, weights)``, one entry per device.

    Like ``gluon.utils.split_and_load(..., even_split=False)``: slices differ in size by at
    most one example (10 examples on 3 devices: 4, 3, 3). The book needs the batch size to
    be a multiple of the device count; this does not, so the last batch of an epoch works.

    A batch with fewer examples than devices leaves some devices without data, but the
    Trainer needs a fresh gradient from every device. Those devices get the first example
    with weight 0: their gradient is exactly zero, so the sum over devices is the gradient
    of the real examples. ``weights`` is ``None`` for a device with a real slice.
    """
    n = X.shape[0]
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


def train_epoch(net, train_iter, loss, trainer, devices, on_step=None, on_batch=None):
    """Run one pass over ``train_iter``; return ``{'seconds', 'train_loss', 'train_acc', 'examples'}``.

    ``seconds`` is measured after ``nd.waitall()``, since MXNet computes asynchronously.
    ``on_step(step)``, if given, is called after every ``trainer.step`` (``step`` counts from 1).

    Raises ``LossNotFiniteError`` when the loss becomes NaN or infinite, naming the step. The
    check reads the running loss sum one step late: while Python waits for the sum of step
    ``s - 1``, step ``s`` is already queued, so MXNet never runs out of work because of it.

    ``on_batch(step, examples, running_loss)``, if given, is called there too, with the batch's
    size and a function returning the mean training loss of the epoch so far; that function
    waits for the devices, so call it only when the value will be shown.
    """
    loss_sum = [nd.zeros((1,), ctx=d) for d in devices]
    correct = [nd.zeros((1,), ctx=d) for d in devices]
    n = 0
    previous = None
    start = time.time()
    for step, (X, y) in enumerate(train_iter, 1):
        Xs, ys, weights = split_batch(X, y, devices)
        with autograd.record():
            outs = [net(X_d) for X_d in Xs]
            ls = [loss(o, y_d) if w is None else loss(o, y_d, w)
                  for o, y_d, w in zip(outs, ys, weights)]
        for l in ls:
            l.backward()
        # Gradients were summed over the batch: step divides by the real number of examples.
        trainer.step(X.shape[0])
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


def init_training(net, devices, lr, seed=None):
    """The chapter's set-up: initialize ``net`` on every device, return an SGD ``Trainer``.

    ``Normal(sigma=0.01)`` on every device (``force_reinit``), after seeding MXNet's random
    generators with ``seed`` when given; then ``gluon.Trainer(..., 'sgd', {'learning_rate': lr})``.
    """
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(init.Normal(sigma=0.01), ctx=devices, force_reinit=True)
    return gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': lr})


def train(net, train_iter, test_iter, devices=None, lr=0.1, num_epochs=4, seed=None,
          verbose=True, on_step=None, on_epoch=None, on_batch=None, trainer=None,
          start_epoch=0, history=None):
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
        Print the book's line after each epoch (``format_epoch``).
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

    Returns
    -------
    list of dict
        One per epoch: ``epoch``, ``seconds`` (training only), ``train_loss``, ``train_acc``,
        ``test_acc``, ``images_per_sec`` (training images per second).

    Raises
    ------
    LossNotFiniteError
        When the training loss becomes NaN or infinite (its ``epoch`` and ``step`` say where).
    """
    devices = try_all_gpus() if devices is None else list(devices)
    if trainer is None:
        trainer = init_training(net, devices, lr, seed)
    if start_epoch and hasattr(train_iter, 'set_epoch'):
        train_iter.set_epoch(start_epoch)
    loss = gloss.SoftmaxCrossEntropyLoss()
    history = list(history or [])
    for epoch in range(start_epoch, num_epochs):
        step_hook = None if on_step is None else functools.partial(on_step, epoch + 1)
        batch_hook = None if on_batch is None else functools.partial(on_batch, epoch + 1)
        try:
            stats = train_epoch(net, train_iter, loss, trainer, devices, on_step=step_hook,
                                on_batch=batch_hook)
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
        if verbose:
            print(format_epoch(record), flush=True)
        if on_epoch is not None:
            on_epoch(record)
    return history
