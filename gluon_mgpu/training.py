"""The chapter's training as the book writes it: its settings, the step on several devices, the
epoch loop and the test accuracy. The rest comes in as event handlers (docs/events.md); the
checks of arguments and batches live in ``train_checks``.
"""
import math
import time

import mxnet as mx
from mxnet import autograd, gluon, init, nd
from mxnet.gluon import loss as gloss, utils as gutils

from .devices import simulated, try_all_gpus
from .handlers.events import EpochLine, Events, LossGuard, TrainingState
from .model import lenet, resnet18, sync_batch_norm
from .runtime import dispatch, precision, startup
from .runtime.checks import check_whole
from .runtime.choices import JOB_KVSTORES, MODELS
from .train_checks import (check_batch, check_batch_size, check_init, check_network,
                           check_once, check_split, check_train)

__all__ = ['BATCH_SIZE_PER_DEVICE', 'LR_PER_DEVICE', 'INIT_SIGMA', 'book_setting',
           'new_network', 'init_training', 'split_batch', 'train_batch',
           'train_batch_per_device', 'choose_step', 'train_epoch', 'evaluate_accuracy', 'train']

# The book's setting, per device: train(num_gpus=1, batch_size=256, lr=0.1), then
# train(num_gpus=2, batch_size=512, lr=0.2); weights drawn from Normal(sigma=0.01).
BATCH_SIZE_PER_DEVICE = 256
LR_PER_DEVICE = 0.1
INIT_SIGMA = 0.01


def split_batch(X, y, devices):
    """Split a batch over devices; return ``(Xs, ys)``, one slice of each per device: the book's
    ``split_and_load`` with ``even_split=False`` (10 examples on 3 devices give 4, 3, 3).
    ``ValueError`` for a batch ``check_split`` refuses."""
    check_split(X, y, devices)
    return (gutils.split_and_load(X, devices, even_split=False),
            gutils.split_and_load(y, devices, even_split=False))


def train_batch(net, X, y, loss, trainer, devices, split_f=split_batch, batch_size=None):
    """The chapter's step on one batch; return the losses, outputs and labels per device.

    ``trainer.step(batch_size)`` sums the gradients of all devices, divides by ``batch_size``
    (default: this batch's size; see ``train``) and updates every replica the same way.
    """
    check_once(X, y, net, devices, 'the batch given to train_batch', one_thread=True)
    batch_size = X.shape[0] if batch_size is None else batch_size
    Xs, ys = split_f(X, y, devices)
    with autograd.record():
        outs = [net(X_d) for X_d in Xs]
        ls = [loss(out, y_d) for out, y_d in zip(outs, ys)]
    for l in ls:
        l.backward()
    trainer.step(batch_size)
    return ls, outs, ys


def train_batch_per_device(net, X, y, loss, trainer, devices, split_f=split_batch,
                           batch_size=None):
    """``train_batch``, the same calls in the same order (so the same numbers), each device's
    issued from a thread of its own (``dispatch.call``): simulated CPU devices then compute side
    by side, each with its own scratch buffers, as GPUs do (docs/devices.md)."""
    batch_size = X.shape[0] if batch_size is None else batch_size
    Xs, ys = split_f(X, y, devices)
    with autograd.record():
        outs = [dispatch.call(d, net, X_d) for d, X_d in zip(devices, Xs)]
        ls = [dispatch.call(d, loss, out, y_d) for d, out, y_d in zip(devices, outs, ys)]
    for d, l in zip(devices, ls):
        dispatch.call(d, l.backward)
    trainer.step(batch_size)
    return ls, outs, ys


def choose_step(devices, net=None):
    """The step ``train()`` runs: ``train_batch``, or on simulated devices the same step issued
    from one thread per device (``train_batch_per_device``, docs/devices.md). A split network
    (``gluon_mgpu.parallel``, not a Block) brings its own, ``net.step``."""
    if net is not None and not isinstance(net, gluon.Block):
        return net.step
    return train_batch_per_device if simulated(devices) else train_batch


def book_setting(num_devices):
    """The book's ``(batch_size, lr)`` for ``num_devices`` devices: (256, 0.1), (512, 0.2), ..."""
    check_whole('num_devices', num_devices, 'for example book_setting(2), the setting for 2')
    return BATCH_SIZE_PER_DEVICE * num_devices, LR_PER_DEVICE * num_devices


def new_network(model='resnet18', hybridize=True, sync_bn_devices=None, dtype='float32'):
    """A fresh, uninitialized ``model`` (``MODELS``) for Fashion-MNIST's 10 classes, compiled
    into one graph if ``hybridize`` (``static_alloc``; docs/speed.md says why not static_shape);
    ResNet-18 with ``SyncBatchNorm`` over ``sync_bn_devices`` devices when given. ``dtype``
    'bfloat16' turns on MXNet's AMP for the whole process (``precision.use_dtype``,
    docs/precision.md); pass the same dtype to ``init_training``."""
    check_network(model, MODELS, sync_bn_devices, dtype)
    precision.use_dtype(dtype)
    net = lenet(10) if model == 'lenet' else resnet18(
        10, norm_layer=sync_batch_norm(sync_bn_devices) if sync_bn_devices else None)
    if hybridize:
        net.hybridize(static_alloc=True)
    return net


def init_training(net, devices, lr, seed=None, kvstore='device', dtype='float32',
                  force_dtype=False):
    """The chapter's set-up: ``Normal(sigma=0.01)`` on every device (after
    ``mx.random.seed(seed)`` when given); return an SGD ``Trainer``.

    A kvstore of several processes gets ``rescale_grad = 1 / num_workers``
    (docs/distributed.md); ``dtype='bfloat16'`` as in ``precision.check_dtype``. ``ValueError``
    before anything is initialized for an ``lr`` that is not a finite number above 0 that
    float32 holds (``train_checks.check_init``).
    """
    check_init(lr, dtype, devices, force_dtype, kvstore)
    if isinstance(kvstore, str) and kvstore in JOB_KVSTORES:
        kvstore = startup.join_job(kvstore)  # waits for all its processes, Ctrl-C ends it
    params = {'learning_rate': lr}
    if isinstance(kvstore, mx.kv.KVStoreBase) and kvstore.num_workers > 1:
        params['rescale_grad'] = 1.0 / kvstore.num_workers  # dist_sync, Horovod
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(init.Normal(sigma=INIT_SIGMA), ctx=devices, force_reinit=True)
    # Updates in Python: its exceptions reach trainer.step (a kvstore drops them); dist: servers
    servers = isinstance(kvstore, mx.kv.KVStoreBase) and 'dist' in kvstore.type
    trainer = gluon.Trainer(net.collect_params(), 'sgd', params, kvstore=kvstore,
                            update_on_kvstore=None if servers else False)
    return precision.init_trainer(trainer, dtype)


def evaluate_accuracy(data_iter, net, devices=None):
    """Return the fraction of examples in ``data_iter`` that ``net`` classifies correctly.

    Every batch is split over ``devices`` (default ``try_all_gpus()``); the first is checked
    (``check_batch``). A split network (``gluon_mgpu.parallel``, not a Block) scores on its
    first device, where it computes the logits.
    """
    devices = try_all_gpus() if devices is None else list(devices)
    if not isinstance(net, gluon.Block):
        devices = devices[:1]
    call = dispatch.call if simulated(devices) else (lambda device, f, *args: f(*args))
    correct, n = [None] * len(devices), 0
    for X, y in data_iter:
        if n == 0:
            check_batch(X, y, net, 'the first batch of data_iter')
        Xs, ys = split_batch(X, y, devices[:X.shape[0]])
        for i, (d, X_d, y_d) in enumerate(zip(devices, Xs, ys)):
            hits = call(d, _hits, call(d, net, X_d), y_d)
            correct[i] = hits if correct[i] is None else correct[i] + hits
        n += X.shape[0]
    if n == 0:
        raise ValueError('the data iterator yielded no examples; pass one that yields (X, y) '
                         'batches')
    return sum(float(c.asscalar()) for c in correct if c is not None) / n


def _hits(out, y):
    return (out.argmax(axis=1) == y.as_in_context(out.context).astype('float32')).sum()


def _add(total, new):
    return new if total is None else [a + b for a, b in zip(total, new)]


def train_epoch(net, train_iter, loss, trainer, devices, split_f=split_batch, events=None,
                step=None, batch_size=None):
    """Run ``step`` (default ``choose_step(devices)``) over ``train_iter``; return ``seconds``,
    ``train_loss``, ``train_acc``, ``examples``. ``batch_size`` as in ``train``; ``batch_end``
    True ends the epoch. ``step`` as ``train_batch``, or returning ``([loss_sum], None, None)``
    (no ``train_acc``: a split network's ``step``)."""
    step = choose_step(devices, net) if step is None else step
    loss_sum = correct = None
    n = 0
    start = time.time()
    for X, y in train_iter:
        if n == 0:
            check_once(X, y, net, devices, 'the first batch of train_iter', again=True)
            batch_size = X.shape[0] if batch_size is None else batch_size
        if events:
            events.batch_begin(batch=(X, y))
        ls, outs, ys = step(net, X, y, loss, trainer, devices, split_f, batch_size)
        loss_sum = _add(loss_sum, [l.sum() for l in ls])
        ended = {'batch': (X, y), 'loss': ls}
        if outs is not None:
            correct = _add(correct, [_hits(out, y_d) for out, y_d in zip(outs, ys)])
            ended.update(pred=outs, label=ys)
        n += X.shape[0]
        if events and events.batch_end(**ended):
            break
    nd.waitall()  # MXNet runs asynchronously: the epoch ends when the devices are done
    if n == 0:
        raise ValueError('train_iter yielded no examples in this epoch; pass an iterable that '
                         'yields (X, y) batches on every pass, such as load_data_fashion_mnist')
    return {'seconds': time.time() - start,
            'train_loss': math.fsum(float(v.asscalar()) for v in loss_sum) / n,
            'train_acc': correct and sum(float(v.asscalar()) for v in correct) / n,
            'examples': n}


def train(net, train_iter, test_iter, devices=None, num_epochs=4, trainer=None,
          event_handlers=None, split_f=split_batch, batch_size=None):
    """Train ``net`` data-parallel on ``devices``; print the book's line per epoch; return
    the history.

    Parameters
    ----------
    net : mxnet.gluon.Block
        For example ``resnet18(10)``; or a split network (``gluon_mgpu.parallel``), which
        steps and scores itself (``choose_step``, ``evaluate_accuracy``).
    train_iter, test_iter : iterable of (X, y)
        For example from ``load_data_fashion_mnist``; each batch is split over the devices.
    devices : list of mxnet.Context, optional
        Default ``try_all_gpus()``.
    num_epochs : int, default 4
    trainer : mxnet.gluon.Trainer, optional
        Train with it and the parameters ``net`` already holds on ``devices``, for example
        ``init_training(net, devices, lr)``. Default: the book's set-up at lr 0.1.
    event_handlers : list, optional
        Default ``[EpochLine(), LossGuard()]``: the book's line after each epoch, and a stop
        when the loss is not finite (docs/events.md).
    split_f : function, default ``split_batch``
        ``split_f(X, y, devices) -> (Xs, ys)``, as d2l's ``train_ch13``; for example
        ``parallel.weighted.split_by_weights([3, 1])`` slices batches unevenly.
    batch_size : int, optional
        What ``trainer.step`` divides by, as the chapter's. Default: the size of each epoch's
        first batch, so a short last batch moves the weights by its share of a step
        (docs/python.md).

    Returns
    -------
    list of dict
        One per epoch: ``epoch``, ``seconds`` (training only), ``train_loss``, ``train_acc``,
        ``test_acc``, ``images_per_sec``.

    ``ValueError`` before any step for bad arguments or a first batch the network cannot take;
    ``LossNotFiniteError`` for a loss not finite (``LossGuard``); what the optimizer raises comes
    out of ``trainer.step`` as it is (``train_checks.check_trainer``).
    """
    devices = try_all_gpus() if devices is None else list(devices)
    check_train(devices, num_epochs, trainer, split_f, net)
    check_batch_size(batch_size)
    trainer = init_training(net, devices, LR_PER_DEVICE) if trainer is None else trainer
    if hasattr(train_iter, 'set_min_batch'):
        train_iter.set_min_batch(len(devices))  # no device may be left without data
    loss = gloss.SoftmaxCrossEntropyLoss()
    state = TrainingState(net, trainer, loss, devices, train_iter, test_iter, num_epochs)
    events = Events([EpochLine(), LossGuard()] if event_handlers is None else event_handlers,
                    state)
    events.train_begin()
    step = choose_step(devices, net)
    for epoch in range(state.epoch + 1, num_epochs + 1):
        state.epoch = epoch
        events.epoch_begin()
        stats = train_epoch(net, train_iter, loss, trainer, devices, split_f, events, step,
                            batch_size)
        state.end_epoch(stats, evaluate_accuracy(test_iter, net, devices))
        if events.epoch_end():
            break
    events.train_end()
    return state.history
