"""The chapter's training as the book writes it: its settings, the step on several devices, the
epoch loop and the test accuracy. The rest comes in as event handlers (docs/events.md).
"""
import time
import weakref

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, init, nd
from mxnet.gluon import loss as gloss, nn, utils as gutils

from .devices import format_devices, try_all_gpus
from .handlers.events import (OLD_STEP, STEP, EpochLine, Events, LossGuard, LossNotFiniteError,
                              TrainingState, format_epoch)
from .model import lenet, resnet18, sync_batch_norm
from .runtime import dispatch, precision, startup
from .runtime.checks import check_whole
from .runtime.updates import UpdateError, guard_updates

__all__ = ['BATCH_SIZE_PER_DEVICE', 'LR_PER_DEVICE', 'INIT_SIGMA', 'MODELS', 'STEP', 'OLD_STEP',
           'book_setting', 'new_network', 'network_name', 'init_training', 'split_batch',
           'train_batch', 'train_batch_per_device', 'choose_step', 'check_batch', 'run_epoch',
           'train_epoch', 'evaluate_accuracy', 'run_epochs', 'train', 'check_batch_size',
           'format_epoch', 'LossNotFiniteError', 'UpdateError']

# The book's setting, per device: train(num_gpus=1, batch_size=256, lr=0.1), then
# train(num_gpus=2, batch_size=512, lr=0.2); weights drawn from Normal(sigma=0.01).
BATCH_SIZE_PER_DEVICE = 256
LR_PER_DEVICE = 0.1
INIT_SIGMA = 0.01
MODELS = ('resnet18', 'lenet')


def split_batch(X, y, devices):
    """Split a batch over devices; return ``(Xs, ys)``, one slice of each per device.

    The book's ``split_and_load`` with ``even_split=False``: 10 examples on 3 devices give 4, 3,
    3. ``ValueError`` for a batch ``check_split`` refuses.
    """
    check_split(X, y, devices)
    return (gutils.split_and_load(X, devices, even_split=False),
            gutils.split_and_load(y, devices, even_split=False))


def train_batch(net, X, y, loss, trainer, devices, split_f=split_batch, batch_size=None):
    """The chapter's step on one batch; return the losses, outputs and labels per device.

    ``trainer.step(batch_size)`` sums the gradients of all devices, divides by ``batch_size``
    (default: this batch's size; see ``train``) and updates every replica the same way.
    """
    _check_once(X, y, net, 'the batch given to train_batch', devices)
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
    call = dispatch.call
    batch_size = X.shape[0] if batch_size is None else batch_size
    Xs, ys = split_f(X, y, devices)
    with autograd.record():
        outs = [call(d, net, X_d) for d, X_d in zip(devices, Xs)]
        ls = [call(d, loss, out, y_d) for d, out, y_d in zip(devices, outs, ys)]
    for d, l in zip(devices, ls):
        call(d, l.backward)
    trainer.step(batch_size)
    return ls, outs, ys


def choose_step(devices):
    """The step ``train()`` runs: ``train_batch``, or on two or more CPU contexts the same step
    issued from one thread per device (``train_batch_per_device``, docs/devices.md)."""
    return train_batch_per_device if _simulated(devices) else train_batch


def _simulated(devices):
    return sum(d.device_type == 'cpu' for d in devices) > 1


def check_split(X, y, devices):
    """``ValueError`` unless ``X`` and ``y`` hold as many examples, and at least one per device."""
    n = X.shape[0]
    if y.shape[0] != n:
        raise ValueError('X holds %d examples but y holds %d labels; pass one label per '
                         'example' % (n, y.shape[0]))
    if n < len(devices):
        raise ValueError('a batch of %d examples cannot give each of %d devices one; use '
                         'batches of %d or more' % (n, len(devices), len(devices)))


def book_setting(num_devices):
    """The book's ``(batch_size, lr)`` for ``num_devices`` devices: (256, 0.1), (512, 0.2), ..."""
    return BATCH_SIZE_PER_DEVICE * num_devices, LR_PER_DEVICE * num_devices


def network_name(model='resnet18', sync_bn_devices=None):
    """How checkpoints name a network: ``resnet18(10)``, ``lenet(10)``, or with SyncBatchNorm."""
    if model == 'resnet18' and sync_bn_devices:
        return 'resnet18(10, norm_layer=sync_batch_norm(%d))' % sync_bn_devices
    return '%s(10)' % model


def new_network(model='resnet18', hybridize=True, sync_bn_devices=None, dtype='float32'):
    """A fresh, uninitialized network for Fashion-MNIST's 10 classes.

    Parameters
    ----------
    model : {'resnet18', 'lenet'}
    hybridize : bool, default True
        Compile it into one graph (``static_alloc``; docs/speed.md says why not static_shape).
    sync_bn_devices : int, optional
        ResNet-18 with ``SyncBatchNorm`` over this many devices instead of BatchNorm.
    dtype : {'float32', 'bfloat16'}, default 'float32'
        bfloat16 turns on MXNet's AMP for the whole process (``precision.use_dtype``,
        docs/precision.md); pass the same dtype to ``init_training``.
    """
    if model not in MODELS:
        raise ValueError('model must be one of %s, got %r' % ('/'.join(MODELS), model))
    if dtype == 'bfloat16' and sync_bn_devices:
        raise ValueError('dtype=\'bfloat16\' with SyncBatchNorm was never run; pass '
                         'sync_bn_devices=None or dtype=\'float32\'')
    precision.use_dtype(dtype)
    if model == 'lenet':
        net = lenet(10)
    else:
        net = resnet18(10, norm_layer=sync_batch_norm(sync_bn_devices)
                       if sync_bn_devices else None)
    if hybridize:
        net.hybridize(static_alloc=True)
    return net


def init_training(net, devices, lr, seed=None, kvstore='device', dtype='float32',
                  force_dtype=False):
    """The chapter's set-up: ``Normal(sigma=0.01)`` on every device (after
    ``mx.random.seed(seed)`` when given); return an SGD ``Trainer``.

    A kvstore of several processes gets ``rescale_grad = 1 / num_workers``
    (docs/distributed.md); ``dtype='bfloat16'`` as in ``precision.check_dtype``.
    """
    precision.check_dtype(dtype, devices, force_dtype)
    active = precision.active_dtype()
    if active != dtype and (active is not None or dtype == 'bfloat16'):
        raise RuntimeError('init_training(dtype=%r), but the networks of this process compute '
                           'in %s; build the network with new_network(..., dtype=%r)'
                           % (dtype, active or 'float32', dtype))
    if isinstance(kvstore, str) and kvstore.startswith('dist'):
        kvstore = startup.join_job(kvstore)  # waits for all its processes, Ctrl-C ends it
    params = {'learning_rate': lr}
    if isinstance(kvstore, mx.kv.KVStoreBase) and kvstore.num_workers > 1:
        params['rescale_grad'] = 1.0 / kvstore.num_workers  # dist_sync, Horovod
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(init.Normal(sigma=INIT_SIGMA), ctx=devices, force_reinit=True)
    # The optimizer runs in Python (Trainer._update), where its exceptions reach the caller: on
    # the kvstore MXNet calls it from C, which prints and drops them. Dist kvstores keep their
    # update on the servers (docs/distributed.md).
    kind = kvstore.type if isinstance(kvstore, mx.kv.KVStoreBase) else kvstore
    trainer = gluon.Trainer(net.collect_params(), 'sgd', params, kvstore=kvstore,
                            update_on_kvstore=None if 'dist' in str(kind) else False)
    return precision.init_trainer(trainer, dtype)


def _layers(block, kind):
    """The layers of type ``kind`` in ``block``, in order."""
    for child in block._children.values():
        if isinstance(child, kind):
            yield child
        yield from _layers(child, kind)


def _expected_input(net):
    """``(dtype, channels, classes)`` of ``net``'s input and output, each None when unknown."""
    if not isinstance(net, nn.Block):  # a split network (gluon_mgpu.parallel) says nothing
        return None, None, None
    params = list(net.collect_params().values())
    dtype = np.dtype(params[0].dtype) if params else None
    convs = list(_layers(net, (nn.Conv1D, nn.Conv2D, nn.Conv3D)))
    channels = convs[0].weight.shape[1] if convs and convs[0].weight.shape else 0
    denses = list(_layers(net, nn.Dense))
    classes = denses[-1]._units if denses else None
    return dtype, channels or None, classes


def check_batch(X, y, net, where='the first batch'):
    """Raise ``ValueError`` if ``(X, y)`` is not a batch ``net`` can be trained or scored on.

    ``X``: 4-D images of the network's type and channels; ``y``: one whole-number class index
    per image. It reads the labels: call it on the first batch only. ``where`` names the batch.
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
    pixels = X.asnumpy()
    if not np.isfinite(pixels).all():
        image = int(np.argwhere(~np.isfinite(pixels))[0][0])
        raise ValueError('%s: X holds NaN or infinite values (image %d of the batch); pass '
                         'images of finite values, such as ToTensor\'s 0 to 1' % (where, image))
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
    if not np.issubdtype(labels.dtype, np.integer):
        bad = labels[~(np.isfinite(labels) & (np.floor(labels) == labels))]
        if bad.size:
            raise ValueError('%s: y holds %r, which is not a class index; labels are whole '
                             'numbers 0 to %s' % (where, float(bad[0]), top))
    low, high = labels.min(), labels.max()
    if low < 0 or (classes and high >= classes):
        raise ValueError('%s: y holds labels from %d to %d, but the network has %s classes (0 to '
                         '%s); map the labels to 0..%s, or build the network with as many '
                         'outputs as classes' % (where, low, high, classes or 'its', top, top))


# The networks train_batch has checked a batch for; each is checked once.
_CHECKED = weakref.WeakSet()


def _check_once(X, y, net, where, devices):
    if net not in _CHECKED:
        check_batch(X, y, net, where)
        from mxnet.gluon.contrib.nn import SyncBatchNorm
        if _simulated(devices) and any(_layers(net, SyncBatchNorm)):
            raise ValueError('%s: the network has SyncBatchNorm layers, which wait for each other '
                             'and deadlock when one thread issues the calls of several CPU '
                             'devices; run the step choose_step(devices) returns '
                             '(train_batch_per_device), as train() does' % where)
        _CHECKED.add(net)


def evaluate_accuracy(data_iter, net, devices=None):
    """Return the fraction of examples in ``data_iter`` that ``net`` classifies correctly.

    Every batch is split over ``devices`` (default ``try_all_gpus()``); the first is checked
    (``check_batch``). A split network (``gluon_mgpu.parallel``) passes its first device.
    """
    devices = try_all_gpus() if devices is None else list(devices)
    call = dispatch.call if _simulated(devices) else _call_here
    correct = [None] * len(devices)
    n = 0
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
    return sum(c.asscalar() for c in correct if c is not None) / n


def _call_here(device, f, *args):
    return f(*args)


def _hits(out, y):
    return (out.argmax(axis=1) == y.as_in_context(out.context).astype('float32')).sum()


def _add(total, new):
    return new if total is None else [a + b for a, b in zip(total, new)]


def run_epoch(step, train_iter, events=None, check=None):
    """Run ``step(X, y)`` over ``train_iter``; return ``seconds``, ``train_loss``, ``train_acc``
    and ``examples``: the epoch loop of every way to split.

    ``step`` returns ``(losses, outputs, labels)`` as ``train_batch``, or ``([loss_sum], None,
    None)`` (no ``train_acc``). ``check(X, y)`` runs on the first batch; ``batch_end`` returning
    True ends the epoch.
    """
    loss_sum = correct = None
    n = 0
    start = time.time()
    for X, y in train_iter:
        if n == 0 and check is not None:
            check(X, y)
        if events:
            events.batch_begin(batch=(X, y))
        ls, outs, ys = step(X, y)
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
            'train_loss': sum(v.asscalar() for v in loss_sum) / n,
            'train_acc': None if correct is None else sum(v.asscalar() for v in correct) / n,
            'examples': n}


def train_epoch(net, train_iter, loss, trainer, devices, split_f=split_batch, events=None,
                step=None, batch_size=None):
    """Run ``step`` (default ``choose_step(devices)``) over ``train_iter`` with ``run_epoch``,
    checking the first batch; ``batch_size`` as in ``train``."""
    step = choose_step(devices) if step is None else step

    def check(X, y):
        check_batch(X, y, net, 'the first batch of train_iter')
        _CHECKED.add(net)

    def one_step(X, y):
        nonlocal batch_size
        if batch_size is None:
            batch_size = X.shape[0]
        return step(net, X, y, loss, trainer, devices, split_f, batch_size)

    return run_epoch(one_step, train_iter, events, check)


def run_epochs(state, events, train_one_epoch, evaluate):
    """The epoch loop of ``train()`` and ``train_split`` from ``state.epoch + 1``; return the
    history. ``train_one_epoch()`` gives ``run_epoch``'s numbers; ``epoch_end`` True stops."""
    events.train_begin()
    for epoch in range(state.epoch + 1, state.num_epochs + 1):
        state.epoch = epoch
        events.epoch_begin()
        stats = train_one_epoch()
        state.record = {'epoch': epoch, 'seconds': stats['seconds'],
                        'train_loss': stats['train_loss'], 'train_acc': stats['train_acc'],
                        'test_acc': evaluate(),
                        'images_per_sec': stats['examples'] / stats['seconds']}
        state.history.append(state.record)
        if events.epoch_end():
            break
    events.train_end()
    return state.history


def check_batch_size(batch_size, name='batch_size'):
    """``ValueError`` unless ``batch_size`` is None or a whole number >= 1."""
    if batch_size is not None:
        check_whole(name, batch_size, 'for example %s=256, the nominal batch size trainer.step '
                                      'divides by' % name)


def train(net, train_iter, test_iter, devices=None, lr=None, num_epochs=4, trainer=None,
          split_f=split_batch, event_handlers=None, batch_size=None):
    """Train ``net`` data-parallel on ``devices``; print the book's line per epoch; return
    the history.

    Parameters
    ----------
    net : mxnet.gluon.Block
        For example ``resnet18(10)``.
    train_iter, test_iter : iterable of (X, y)
        For example from ``load_data_fashion_mnist``; each batch is split over the devices.
    devices : list of mxnet.Context, optional
        Default ``try_all_gpus()``.
    lr : float, optional
        Without ``trainer``: the book's set-up at this rate (``init_training``; default 0.1).
    num_epochs : int, default 4
    trainer : mxnet.gluon.Trainer, optional
        Train with it and the parameters ``net`` already holds on ``devices``.
    split_f : callable, default ``split_batch``
        ``split_f(X, y, devices)`` gives the slices (``parallel.weighted.split_by_weights``).
    event_handlers : list, optional
        Default ``[EpochLine(), LossGuard()]``: the book's line after each epoch, and a stop
        when the loss is not finite (docs/events.md).
    batch_size : int, optional
        What ``trainer.step`` divides by, as the chapter's. Default: the size of each epoch's
        first batch, so a short last batch moves the weights by its share of a step (README).

    Returns
    -------
    list of dict
        One per epoch: ``epoch``, ``seconds`` (training only), ``train_loss``, ``train_acc``,
        ``test_acc``, ``images_per_sec``.

    Raises
    ------
    ValueError
        Before any step, for bad arguments or a first batch the network cannot take.
    LossNotFiniteError, UpdateError
        A loss not finite (``LossGuard``); the optimizer raised inside ``trainer.step``.
    """
    devices = try_all_gpus() if devices is None else list(devices)
    if not devices:
        raise ValueError('devices is empty; pass a list of contexts such as [mx.cpu(0), '
                         'mx.cpu(1)], or leave it out for try_all_gpus()')
    repeated = [d for i, d in enumerate(devices) if d in devices[:i]]
    if repeated:
        raise ValueError('devices %s lists %s twice; a device holds one replica, so list each '
                         'once' % (format_devices(devices), repeated[0]))
    check_whole('num_epochs', num_epochs, 'for example num_epochs=4')
    if lr is not None and trainer is not None:
        raise ValueError('lr=%g and a trainer were both given, but the trainer has its own '
                         'learning rate; pass one of them (trainer.set_learning_rate(%g) '
                         'changes it)' % (lr, lr))
    check_batch_size(batch_size)
    if trainer is None:
        trainer = init_training(net, devices, LR_PER_DEVICE if lr is None else lr)
    if hasattr(train_iter, 'set_min_batch'):
        train_iter.set_min_batch(len(devices))  # no device may be left without data
    loss = gloss.SoftmaxCrossEntropyLoss()
    state = TrainingState(net, trainer, loss, devices, train_iter, test_iter, num_epochs)
    events = Events([EpochLine(), LossGuard()] if event_handlers is None else event_handlers,
                    state)
    step = choose_step(devices)
    with guard_updates(trainer):  # raises what MXNet would drop inside trainer.step
        return run_epochs(
            state, events,
            lambda: train_epoch(net, train_iter, loss, trainer, devices, split_f, events, step,
                                batch_size),
            lambda: evaluate_accuracy(test_iter, net, devices))
