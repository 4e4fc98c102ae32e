"""Data-parallel training, as the chapter does it with Gluon.

``train_batch`` is the chapter's step and nothing else: ``split_and_load`` cuts the batch into
one slice per device; under ``autograd.record()`` every device runs the network on its slice;
``backward()`` on every device's loss; then ``trainer.step(batch_size)`` sums the gradients of
all devices (the kvstore), divides by the batch size and updates every replica the same way.
Each device's calls are issued from a thread of its own (``gluon_mgpu.runtime.dispatch``), so each has
its own scratch buffers.
``train_epoch`` runs it over the data and ``train`` over the epochs, printing the book's line.

Everything else (checkpoints, progress, metrics, checks) hangs around the loop as event
handlers (``gluon_mgpu.handlers.events``), and devices of different speed change only the split
(``balance.split_by_weights``).
"""
import time
import weakref

import numpy as np
from mxnet import autograd, nd
from mxnet.gluon import loss as gloss, nn, utils as gutils

from .parallel.weighted import check_device_weights, slice_sizes
from .book import LR_PER_DEVICE, init_training
from .devices import format_devices, try_all_gpus
from .runtime.dispatch import call
from .handlers.events import (EpochLine, Events, LossGuard, LossNotFiniteError, TrainingState,
                              format_epoch)
from .handlers.interrupts import UpdateError, guard_updates

__all__ = ['check_batch', 'split_batch', 'evaluate_accuracy', 'train_batch', 'train_epoch', 'train',
           'format_epoch', 'init_training', 'LossNotFiniteError', 'UpdateError']


def _layers(block, kind):
    """The layers of type ``kind`` in ``block``, in the order they were added."""
    for child in block._children.values():
        if isinstance(child, kind):
            yield child
        yield from _layers(child, kind)


def _expected_input(net):
    """``(dtype, channels, classes)`` that ``net`` takes, each None when ``net`` does not say:
    its parameters' type, its first convolution's input channels (once known) and its last
    ``Dense`` layer's units."""
    params = list(net.collect_params().values())
    dtype = np.dtype(params[0].dtype) if params else None
    convs = list(_layers(net, (nn.Conv1D, nn.Conv2D, nn.Conv3D)))
    channels = convs[0].weight.shape[1] if convs and convs[0].weight.shape else 0
    denses = list(_layers(net, nn.Dense))
    classes = denses[-1]._units if denses else None
    return dtype, channels or None, classes


def check_batch(X, y, net, where='the first batch'):
    """Raise ``ValueError`` if ``(X, y)`` is not a batch ``net`` can be trained or scored on.

    What the chapter's step needs, and what MXNet would not say (labels out of range or of
    shape (B, 1) train silently wrong) or would say in 46 lines (float64 images): ``X`` an
    NDArray of 4-D images (batch, channels, height, width) of the network's type (float32) with
    its channels, ``y`` one whole-number class index per image, within the network's classes
    (its last ``Dense`` layer's units). Reads the labels' values, so call it once, on the first
    batch, not in the step. ``where`` names the batch in the message.
    """
    for name, v in (('X', X), ('y', y)):
        if not isinstance(v, nd.NDArray):
            raise ValueError('%s: %s is a %s, not an mxnet NDArray; convert it, for example '
                             'nd.array(%s)' % (where, name, '%s.%s' % (
                                 type(v).__module__, type(v).__name__), name))
    dtype, channels, classes = _expected_input(net)
    if X.ndim != 4:
        raise ValueError('%s: X has shape %s, but the network takes 4-D images (batch, channels, '
                         'height, width); add the channel axis, for example '
                         'X.reshape((-1, 1) + X.shape[1:])' % (where, X.shape))
    if dtype is not None and np.dtype(X.dtype) != dtype:
        raise ValueError("%s: X has type %s, but the network computes in %s; convert the "
                         "images, for example X.astype('%s')"
                         % (where, np.dtype(X.dtype).name, dtype.name, dtype.name))
    if channels is not None and X.shape[1] != channels:
        raise ValueError('%s: X has %d channels (shape %s), but the network\'s first layer takes '
                         '%d; pass images with %d channels' % (where, X.shape[1], X.shape,
                                                               channels, channels))
    if y.ndim != 1:
        raise ValueError('%s: y has shape %s, but labels must be 1-D, one class index per image; '
                         'flatten them, for example y.reshape((-1,))' % (where, y.shape))
    if y.shape[0] != X.shape[0]:
        raise ValueError('%s: X holds %d images but y holds %d labels; pass one label per image'
                         % (where, X.shape[0], y.shape[0]))
    labels = y.asnumpy()
    if labels.size == 0:
        return
    top = '%d' % (classes - 1) if classes else 'the number of classes - 1'
    whole = np.issubdtype(labels.dtype, np.integer) or bool(
        np.all(np.isfinite(labels)) and np.all(np.floor(labels) == labels))
    if not whole:
        bad = labels[~(np.isfinite(labels) & (np.floor(labels) == labels))][0]
        raise ValueError('%s: y holds %r, which is not a class index; labels are whole numbers '
                         '0 to %s' % (where, float(bad), top))
    low, high = labels.min(), labels.max()
    if low < 0 or (classes and high >= classes):
        raise ValueError('%s: y holds labels from %d to %d, but the network has %s classes (0 to '
                         '%s); map the labels to 0..%s, or build the network with as many '
                         'outputs as classes' % (where, low, high, classes or 'its', top, top))


# The networks train_batch has checked a batch for; each is checked once.
_CHECKED = weakref.WeakSet()


def _check_once(X, y, net, where):
    if net not in _CHECKED:
        check_batch(X, y, net, where)
        _CHECKED.add(net)


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
    on the devices until the end, so MXNet can run ahead. The first batch is checked
    (``check_batch``): a ``ValueError`` names what is wrong with it.
    """
    devices = try_all_gpus() if devices is None else list(devices)
    correct = [nd.zeros((1,), ctx=d) for d in devices]
    n = 0
    for X, y in data_iter:
        if n == 0:
            check_batch(X, y, net, 'the first batch of data_iter')
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
    The first batch given for a network is checked (``check_batch``) before any step.
    """
    _check_once(X, y, net, 'the batch given to train_batch')
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

    ``events`` (``gluon_mgpu.handlers.events.Events``) gets ``batch_begin`` and ``batch_end`` around
    every step; a ``batch_end`` handler that returns True ends the epoch early. The sums stay
    on the devices; ``seconds`` is read after ``nd.waitall()``, as MXNet runs asynchronously.
    The first batch is checked (``check_batch``) before the first step.
    """
    loss_sum = [nd.zeros((1,), ctx=d) for d in devices]
    correct = [nd.zeros((1,), ctx=d) for d in devices]
    n = 0
    start = time.time()
    for X, y in train_iter:
        if n == 0:
            check_batch(X, y, net, 'the first batch of train_iter')
            _CHECKED.add(net)
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
        Handlers of the run's events (``gluon_mgpu.handlers.events``). Default ``[EpochLine(),
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
        ``trainer``, a ``train_iter`` that yields nothing, or a first batch the network cannot
        take (``check_batch``: the images' shape, type or channels, the labels' shape, values
        or count), before any step.
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
