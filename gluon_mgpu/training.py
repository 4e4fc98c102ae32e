"""Data-parallel training, as the chapter does it with Gluon.

``train_batch`` is the chapter's step and nothing else: ``split_and_load`` cuts the batch into
one slice per device; under ``autograd.record()`` every device runs the network on its slice;
``backward()`` on every device's loss; then ``trainer.step(batch_size)`` sums the gradients of
all devices (the kvstore), divides by the batch size and updates every replica the same way.
Each device's calls are issued from a thread of its own (``gluon_mgpu.dispatch``), so each has
its own scratch buffers.
``train_epoch`` runs it over the data and ``train`` over the epochs, printing the book's line.

Everything else (checkpoints, progress, metrics, checks) hangs around the loop as event
handlers (``gluon_mgpu.events``), and devices of different speed change only the split
(``balance.split_by_weights``).
"""
import time

from mxnet import autograd, nd
from mxnet.gluon import loss as gloss, utils as gutils

from .balance import check_device_weights, slice_sizes
from .book import LR_PER_DEVICE, init_training
from .devices import format_devices, try_all_gpus
from .dispatch import call
from .events import (EpochLine, Events, LossGuard, LossNotFiniteError, TrainingState,
                     format_epoch)
from .interrupts import UpdateError, guard_updates

__all__ = ['split_batch', 'evaluate_accuracy', 'train_batch', 'train_epoch', 'train',
           'format_epoch', 'init_training', 'LossNotFiniteError', 'UpdateError']


def split_batch(X, y, devices, device_weights=None):
    """Split a batch over devices; return ``(Xs, ys)``, one slice of each per device.

    ``gluon.utils.split_and_load(..., even_split=False)``, as the book (which needs the batch
    size to be a multiple of the device count; this does not: 10 examples on 3 devices give
    4, 3, 3). With ``device_weights`` (one positive number per device) the slices follow the
    weights instead (``balance.slice_sizes``): 3, 1 gives a 16-example batch as 12 and 4.

    Raises
    ------
    ValueError
        If ``X`` and ``y`` hold different numbers of examples, or fewer examples than devices.
    """
    n = X.shape[0]
    if y.shape[0] != n:
        raise ValueError('X holds %d examples but y holds %d labels; pass one label per '
                         'example' % (n, y.shape[0]))
    if n < len(devices):
        raise ValueError('a batch of %d examples cannot give each of %d devices one; use '
                         'batches of %d or more' % (n, len(devices), len(devices)))
    if device_weights is None:
        return (gutils.split_and_load(X, devices, even_split=False),
                gutils.split_and_load(y, devices, even_split=False))
    Xs, ys, start = [], [], 0
    for size, d in zip(slice_sizes(n, check_device_weights(device_weights, len(devices))),
                       devices):
        Xs.append(X[start:start + size].as_in_context(d))
        ys.append(y[start:start + size].as_in_context(d))
        start += size
    return Xs, ys


def evaluate_accuracy(data_iter, net, devices=None):
    """Return the fraction of examples in ``data_iter`` that ``net`` classifies correctly.

    Every batch is split over all ``devices`` (default: ``try_all_gpus()``), so evaluation
    uses them all; a batch with fewer examples than devices uses the first ones. Counts stay
    on the devices until the end, so MXNet can run ahead.
    """
    devices = try_all_gpus() if devices is None else list(devices)
    correct = [nd.zeros((1,), ctx=d) for d in devices]
    n = 0
    for X, y in data_iter:
        Xs, ys = split_batch(X, y, devices[:X.shape[0]])
        for d, X_d, y_d, correct_d in zip(devices, Xs, ys, correct):
            _count_correct(d, net, X_d, y_d, correct_d)
        n += X.shape[0]
    if n == 0:
        raise ValueError('the data iterator yielded no examples; pass one that yields (X, y) '
                         'batches')
    return sum(c.asscalar() for c in correct) / n


def _add_correct(out, y, correct):
    correct += (out.argmax(axis=1) == y.astype('float32')).sum()


def _count_correct(device, net, X, y, correct):
    """Add to ``correct`` (on ``device``) how many of ``net``'s predictions for ``X`` are ``y``."""
    call(device, _add_correct, call(device, net, X), y, correct)


def train_batch(net, X, y, loss, trainer, devices, split_f=split_batch):
    """The chapter's step on one batch; return the losses, outputs and labels per device.

    The book's calls in the book's order, each device's issued from that device's own thread
    (``dispatch.call``), so that every device draws its scratch buffers from its own pool, as
    every GPU does: simulated CPU devices then compute side by side (docs/devices.md).
    """
    Xs, ys = split_f(X, y, devices)
    with autograd.record():
        outs = [call(d, net, X_d) for d, X_d in zip(devices, Xs)]
        ls = [call(d, loss, out, y_d) for d, out, y_d in zip(devices, outs, ys)]
    for d, l in zip(devices, ls):
        call(d, l.backward)
    # The gradients were summed over the batch: divide by its real size.
    trainer.step(X.shape[0])
    return ls, outs, ys


def epoch_seconds(start, examples):
    """Seconds since ``start`` once the devices are done (``nd.waitall()``); ValueError for an
    epoch without examples."""
    nd.waitall()
    if examples == 0:
        raise ValueError('train_iter yielded no examples in this epoch; pass an iterable that '
                         'yields (X, y) batches on every pass, such as load_data_fashion_mnist')
    return time.time() - start


def train_epoch(net, train_iter, loss, trainer, devices, split_f=split_batch, events=None):
    """Run ``train_batch`` over ``train_iter``; return ``seconds``, ``train_loss``,
    ``train_acc`` and ``examples``.

    ``events`` (``gluon_mgpu.events.Events``) gets ``batch_begin`` and ``batch_end`` around
    every step; a ``batch_end`` handler that returns True ends the epoch early. The sums stay
    on the devices; ``seconds`` is read after ``nd.waitall()``, as MXNet runs asynchronously.
    """
    loss_sum = [nd.zeros((1,), ctx=d) for d in devices]
    correct = [nd.zeros((1,), ctx=d) for d in devices]
    n = 0
    start = time.time()
    for X, y in train_iter:
        if events:
            events.batch_begin(batch=(X, y))
        ls, outs, ys = train_batch(net, X, y, loss, trainer, devices, split_f)
        for i, (l, out, y_d) in enumerate(zip(ls, outs, ys)):
            loss_sum[i] += l.sum()
            correct[i] += (out.argmax(axis=1) == y_d.astype('float32')).sum()
        n += X.shape[0]
        if events and events.batch_end(batch=(X, y), pred=outs, label=ys, loss=ls):
            break
    seconds = epoch_seconds(start, n)
    return {'seconds': seconds,
            'train_loss': sum(v.asscalar() for v in loss_sum) / n,
            'train_acc': sum(v.asscalar() for v in correct) / n,
            'examples': n}


def _checked_devices(devices, num_epochs, lr, trainer):
    """``train()``'s arguments checked; return the devices as a list."""
    devices = try_all_gpus() if devices is None else list(devices)
    if not devices:
        raise ValueError('devices is empty; pass a list of contexts such as [mx.cpu(0), '
                         'mx.cpu(1)], or leave it out for try_all_gpus()')
    repeated = [d for i, d in enumerate(devices) if d in devices[:i]]
    if repeated:
        raise ValueError('devices %s lists %s twice; a device holds one replica, so list each '
                         'once' % (format_devices(devices), repeated[0]))
    if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
        raise ValueError('num_epochs must be a whole number >= 1, got %r; for example '
                         'num_epochs=4' % (num_epochs,))
    if lr is not None and trainer is not None:
        raise ValueError('lr=%g and a trainer were both given, but the trainer has its own '
                         'learning rate; pass one of them (trainer.set_learning_rate(%g) '
                         'changes it)' % (lr, lr))
    return devices


def train(net, train_iter, test_iter, devices=None, lr=None, num_epochs=4, trainer=None,
          split_f=split_batch, event_handlers=None):
    """Train ``net`` data-parallel on ``devices``; print the book's line per epoch; return
    the history.

    Parameters
    ----------
    net : mxnet.gluon.Block
        For example ``resnet18(10)``.
    train_iter, test_iter : iterable of (X, y)
        For example from ``load_data_fashion_mnist``; each global batch is split over devices.
    devices : list of mxnet.Context, optional
        Default ``try_all_gpus()``.
    lr : float, optional
        With no ``trainer``: initialize ``net`` on ``devices`` and train with SGD at this rate,
        the book's set-up (``book.init_training``; default 0.1). Give ``lr`` or ``trainer``.
    num_epochs : int, default 4
    trainer : mxnet.gluon.Trainer, optional
        Train with this Trainer and the parameters ``net`` already holds on ``devices``
        (``book.init_training(net, devices, lr, seed=0)`` gives the book's, seeded).
    split_f : callable, default ``split_batch``
        ``split_f(X, y, devices)`` gives the slices; ``balance.split_by_weights(w)`` splits in
        proportion to per-device weights.
    event_handlers : list, optional
        Handlers of the run's events (``gluon_mgpu.events``). Default ``[EpochLine(),
        LossGuard()]``: print ``epoch 1, training time: 63.5 sec, test_acc 0.86`` after each
        epoch, and stop with ``LossNotFiniteError`` if the loss becomes NaN or infinite.

    Returns
    -------
    list of dict
        One per epoch: ``epoch``, ``seconds`` (training only), ``train_loss``, ``train_acc``,
        ``test_acc``, ``images_per_sec``.

    Raises
    ------
    ValueError
        For no devices, a device listed twice, ``num_epochs`` below 1, both ``lr`` and
        ``trainer``, or a ``train_iter`` that yields nothing.
    LossNotFiniteError
        From ``LossGuard``, naming the epoch and step where the loss stopped being finite.
    UpdateError
        When the optimizer raised inside ``trainer.step`` (MXNet alone would print and drop
        it, and train on with parameters that no longer change).
    """
    devices = _checked_devices(devices, num_epochs, lr, trainer)
    if trainer is None:
        trainer = init_training(net, devices, LR_PER_DEVICE if lr is None else lr)
    if hasattr(train_iter, 'set_min_batch'):
        train_iter.set_min_batch(len(devices))  # no device may be left without data
    loss = gloss.SoftmaxCrossEntropyLoss()
    state = TrainingState(net, trainer, loss, devices, train_iter, test_iter, num_epochs)
    events = Events([EpochLine(), LossGuard()] if event_handlers is None else event_handlers,
                    state)
    events.train_begin()
    # MXNet calls the optimizer from C, where an exception would be printed and dropped: the
    # guard raises it right after trainer.step.
    with guard_updates(trainer):
        for epoch in range(state.epoch + 1, num_epochs + 1):
            state.epoch = epoch
            events.epoch_begin()
            stats = train_epoch(net, train_iter, loss, trainer, devices, split_f, events)
            state.record = {'epoch': epoch,
                            'seconds': stats['seconds'],
                            'train_loss': stats['train_loss'],
                            'train_acc': stats['train_acc'],
                            'test_acc': evaluate_accuracy(test_iter, net, devices),
                            'images_per_sec': stats['examples'] / stats['seconds']}
            state.history.append(state.record)
            if events.epoch_end():
                break
    events.train_end()
    return state.history
