"""The checks of training's arguments and batches, kept out of the chapter's loop: ``train()``
calls ``check_train`` once, the step calls ``check_once`` (its first batch per network), every
split calls ``check_split``. Each ``ValueError`` names the value and the fix.
"""
import numbers
import os
import weakref

import numpy as np
from mxnet import gluon, kv, nd
from mxnet.gluon import nn

from .devices import simulated
from .runtime import precision
from .runtime.checks import LR_RANGE, check_whole
from .runtime.choices import KVSTORES

__all__ = ['check_network', 'check_init', 'check_train', 'check_trainer',
           'check_batch_size', 'check_split', 'check_batch', 'check_once']

_CHECKED = weakref.WeakSet()  # the networks a step has checked a batch for, each once


def check_network(model, models, sync_bn_devices, dtype):
    """``ValueError`` for a network ``new_network`` cannot build: a ``model`` not in ``models``,
    or bfloat16 with SyncBatchNorm."""
    if model not in models:
        raise ValueError('model must be one of %s, got %r' % ('/'.join(models), model))
    if dtype == 'bfloat16' and sync_bn_devices:
        raise ValueError('dtype=\'bfloat16\' with SyncBatchNorm was never run; pass '
                         'sync_bn_devices=None or dtype=\'float32\'')


def check_init(lr, dtype, devices, force_dtype, kvstore='device'):
    """The arguments of ``init_training``: ``ValueError`` for a learning rate outside
    ``LR_RANGE`` (negative, NaN: SGD would take it and train backwards, or to NaN),
    ``check_devices``, ``precision.check_dtype``, a kvstore name not in ``KVSTORES`` (nor
    'nccl'), and ``RuntimeError`` unless the networks of this process compute in ``dtype``
    (``new_network(..., dtype)``)."""
    low, high = LR_RANGE
    if not (isinstance(lr, numbers.Real) and not isinstance(lr, bool) and low <= lr <= high):
        raise ValueError("lr must be a finite number from %.8g to %.8g (what MXNet's float32 "
                         "optimizer can use), got %r; for example lr=0.1, the book's per device"
                         % (low, high, lr))
    check_devices(devices)
    names = KVSTORES + ('nccl',)  # MXNet makes a local kvstore of any other name
    if not (kvstore is None or isinstance(kvstore, kv.KVStoreBase)
            or isinstance(kvstore, str) and kvstore in names):
        raise ValueError('kvstore=%s names no kvstore this package trains with; pass one of %s, '
                         "'nccl' (GPUs), or a KVStore such as mx.kv.create('local')"
                         % (repr(kvstore)[:40], ', '.join(map(repr, KVSTORES))))
    precision.check_dtype(dtype, devices, force_dtype)
    active = precision.active_dtype()
    if active != dtype and (active is not None or dtype == 'bfloat16'):
        raise RuntimeError('init_training(dtype=%r), but the networks of this process compute '
                           'in %s; build the network with new_network(..., dtype=%r)'
                           % (dtype, active or 'float32', dtype))


def check_batch_size(batch_size, name='batch_size'):
    """``ValueError`` unless ``batch_size`` is None or a whole number >= 1."""
    if batch_size is not None:
        check_whole(name, batch_size, 'for example %s=256, the nominal batch size trainer.step '
                                      'divides by' % name)


def check_devices(devices):
    """``ValueError`` for devices ``train()`` and ``init_training`` cannot use: none, or one
    listed twice."""
    devices = list(devices)
    if not devices:
        raise ValueError('devices is empty; pass a list of contexts such as [mx.cpu(0), '
                         'mx.cpu(1)], or leave it out for try_all_gpus()')
    repeated = [d for i, d in enumerate(devices) if d in devices[:i]]
    if repeated:
        raise ValueError('devices [%s] lists %s twice; a device holds one replica, so list each '
                         'once' % (', '.join(map(str, devices)), repeated[0]))


def check_train(devices, num_epochs, trainer, split_f, net=None):
    """``ValueError`` for arguments ``train()`` cannot run with: ``check_devices``,
    ``num_epochs`` not a whole number >= 1, a ``trainer`` as ``check_trainer`` refuses, a
    ``split_f`` that is not a function."""
    check_devices(devices)
    check_whole('num_epochs', num_epochs, 'for example num_epochs=4')
    if not callable(split_f):
        raise ValueError('split_f must be a function split_f(X, y, devices) -> (Xs, ys), got '
                         '%r; pass one such as split_by_weights([3, 1])' % (split_f,))
    if trainer is not None:
        check_trainer(trainer, devices, net)


def check_trainer(trainer, devices, net=None):
    """``ValueError`` for a ``gluon.Trainer`` that cannot train ``net`` on ``devices`` as the
    chapter does: one that leaves trained parameters of ``net`` out (one built for another
    network), ``update_on_kvstore=True`` without a kvstore (MXNet makes none for one device,
    then fails with an ``AttributeError``), no kvstore on two or more devices (each replica
    would be updated with its own device's gradient), or one that would run its optimizer as
    the kvstore's updater.

    MXNet calls that updater from C, where an exception (or Ctrl-C) of the optimizer is printed
    and dropped, and the run goes on with parameters that were not updated. It does so for a
    Trainer over two or more devices with a kvstore of this process ('device', 'local') unless
    it was made with ``update_on_kvstore=False`` (or ``MXNET_UPDATE_ON_KVSTORE=0``); a dist
    kvstore updates on its servers, Horovod in Python. MXNet 1.9 has no public accessor for
    these settings: they are read from what the Trainer keeps (``_params``,
    ``_kvstore_params``).
    """
    if not isinstance(trainer, gluon.Trainer):
        return
    if isinstance(net, nn.Block):
        updated = {id(p) for p in trainer._params}
        trained = [p for p in net.collect_params().values() if p.grad_req != 'null']
        left = [p for p in trained if id(p) not in updated]
        if left:
            raise ValueError("the trainer does not update %s trained parameters of this network "
                             "(the first is '%s'); create it for this network: "
                             "gluon.Trainer(net.collect_params(), ...), or init_training(net, "
                             "devices, lr)" % ('the %d' % len(trained) if len(left) == len(trained)
                                               else '%d of the %d' % (len(left), len(trained)),
                                               left[0].name))
    given = getattr(trainer, '_kvstore_params', {})
    store, on_kvstore = given.get('kvstore'), given.get('update_on_kvstore')
    # As mxnet.model._create_kvstore: a kvstore named by a string is made for 2+ devices only.
    none = store is None or (isinstance(store, str) and 'dist' not in store and len(devices) < 2)
    if none and on_kvstore:
        raise ValueError('update_on_kvstore=True, but the trainer has no kvstore to update on '
                         '(kvstore=%r on %d device%s: MXNet makes none); create it without '
                         'update_on_kvstore, or with update_on_kvstore=False'
                         % (store, len(devices), '' if len(devices) == 1 else 's'))
    if store is None and len(devices) > 1:
        raise ValueError("the trainer has no kvstore (kvstore=None), so each of the %d devices "
                         "would update its replica with its own gradient and the replicas would "
                         "drift apart; create it with kvstore='device' and "
                         "update_on_kvstore=False, as init_training does" % len(devices))
    if on_kvstore is False or none or len(devices) < 2:
        return
    if isinstance(store, kv.KVStoreBase):
        if 'dist' in store.type or not store.is_capable(kv.KVStoreBase.OPTIMIZER):
            return
    elif not isinstance(store, str) or 'dist' in store or store == 'horovod':
        return
    if on_kvstore is None and os.environ.get('MXNET_UPDATE_ON_KVSTORE', '1') == '0':
        return
    raise ValueError("the trainer would run its optimizer on the kvstore, where MXNet drops an "
                     "optimizer's exception; create it with gluon.Trainer(..., "
                     "update_on_kvstore=False), as init_training does")


def _check_arrays(X, y, where):
    """``ValueError`` unless ``X`` and ``y`` are NDArrays; ``where`` names the batch."""
    for name, v in (('X', X), ('y', y)):
        if not isinstance(v, nd.NDArray):
            raise ValueError('%s: %s is a %s, not an mxnet NDArray; convert it, for example '
                             'nd.array(%s)' % (where, name, '%s.%s' % (
                                 type(v).__module__, type(v).__name__), name))


def check_split(X, y, devices):
    """``ValueError`` unless ``devices`` pass ``check_devices`` and ``X`` and ``y`` are NDArrays
    holding as many examples, at least one per device."""
    check_devices(devices)
    _check_arrays(X, y, 'the batch to split')
    n = X.shape[0]
    if y.shape[0] != n:
        raise ValueError('X holds %d examples but y holds %d labels; pass one label per '
                         'example' % (n, y.shape[0]))
    if n < len(devices):
        raise ValueError('a batch of %d examples cannot give each of %d devices one; use '
                         'batches of %d or more' % (n, len(devices), len(devices)))


def layers(block, kind):
    """The layers of type ``kind`` inside ``block``, in order (``Block.apply`` visits a block's
    children before the block, so the leaves, such as convolutions, come in order)."""
    found = []
    block.apply(lambda b: found.append(b) if isinstance(b, kind) and b is not block else None)
    return found


def _expected_input(net):
    """``(dtype, channels, classes)`` of ``net``'s input and output, each None when unknown."""
    if not isinstance(net, nn.Block):  # a split network (gluon_mgpu.parallel) says nothing
        return None, None, None
    params = list(net.collect_params().values())
    dtype = np.dtype(params[0].dtype) if params else None
    convs = layers(net, (nn.Conv1D, nn.Conv2D, nn.Conv3D))
    channels = convs[0].weight.shape[1] if convs and convs[0].weight.shape else 0
    denses = layers(net, nn.Dense)
    classes = denses[-1]._units if denses else None
    return dtype, channels or None, classes


def check_batch(X, y, net, where='the first batch'):
    """Raise ``ValueError`` if ``(X, y)`` is not a batch ``net`` can be trained or scored on.

    ``X``: 4-D images of the network's type and channels; ``y``: one whole-number class index
    per image. It reads the labels: call it on the first batch only. ``where`` names the batch.
    """
    _check_arrays(X, y, where)
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


def check_once(X, y, net, devices, where, one_thread=False, again=False):
    """``check_batch`` on the first batch a step gets for ``net`` (later ones: nothing, unless
    ``again``: an epoch checks its first batch). A split network (not a Block) is not checked.

    ``one_thread``: the step issues every device's calls from this thread, so SyncBatchNorm on
    simulated devices, whose layers wait for each other, is refused rather than deadlocking.
    """
    if (net in _CHECKED and not again) or not isinstance(net, nn.Block):
        return
    check_batch(X, y, net, where)
    if one_thread and simulated(devices):
        from mxnet.gluon.contrib.nn import SyncBatchNorm
        if any(layers(net, SyncBatchNorm)):
            raise ValueError('%s: the network has SyncBatchNorm layers, which wait for each other '
                             'and deadlock when one thread issues the calls of several CPU '
                             'devices; run the step choose_step(devices) returns '
                             '(train_batch_per_device), as train() does' % where)
    _CHECKED.add(net)
