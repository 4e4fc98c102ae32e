"""The chapter's setting, decided once: per-device batch and learning rate, a fresh network and
its Trainer.

The book trains with a batch of 256 and a learning rate of 0.1 *per device* (``train(num_gpus=1,
batch_size=256, lr=0.1)``, then ``train(num_gpus=2, batch_size=512, lr=0.2)``), initializes with
``init.Normal(sigma=0.01)`` on every device and hands all parameters to one SGD
``gluon.Trainer``. The command line, the sweep, ``compare``, the notebooks and the benchmarks take
these from here.
"""
import mxnet as mx
from mxnet import gluon, init

from .runtime import precision
from .model import lenet, resnet18, sync_batch_norm

__all__ = ['BATCH_SIZE_PER_DEVICE', 'LR_PER_DEVICE', 'INIT_SIGMA', 'MODELS', 'book_setting',
           'new_network', 'network_name', 'init_training']

BATCH_SIZE_PER_DEVICE = 256
LR_PER_DEVICE = 0.1
INIT_SIGMA = 0.01
MODELS = ('resnet18', 'lenet')


def book_setting(num_devices):
    """Return the book's ``(batch_size, lr)`` for ``num_devices`` devices: (256, 0.1), (512, 0.2), ..."""
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
        The chapter's ResNet-18, or the book's LeNet (no BatchNorm).
    hybridize : bool, default True
        Compile it into one graph (``static_alloc``): same results, faster.
    sync_bn_devices : int, optional
        ResNet-18 with ``SyncBatchNorm`` over this many devices instead of BatchNorm.
    dtype : {'float32', 'bfloat16'}, default 'float32'
        What it computes in: bfloat16 turns on MXNet's AMP for the whole process, before the
        network is built (``precision.use_dtype``; a process cannot switch back). Check the
        devices first with ``precision.check_dtype``, and pass the same dtype to
        ``init_training``.
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
        # Not static_shape=True: on several devices MXNet 1.9.1 then loses one BatchNorm
        # running-statistics update per device (measured; the trained weights still match).
        net.hybridize(static_alloc=True)
    return net


def init_training(net, devices, lr, seed=None, kvstore='device', dtype='float32',
                  force_dtype=False):
    """The chapter's set-up: initialize ``net`` on every device, return an SGD ``Trainer``.

    ``Normal(sigma=0.01)`` on every device (``force_reinit``), after seeding MXNet's random
    generators with ``seed`` when given; then ``gluon.Trainer(..., 'sgd', {'learning_rate': lr},
    kvstore=kvstore)``.

    With a dist kvstore (``'dist_sync'``, or one made by ``mx.kv.create``) every worker steps
    with its own batch, but the servers sum the gradients of all workers: the Trainer is made
    with ``rescale_grad = 1 / num_workers``, so ``trainer.step(local_batch_size)`` divides the
    sum by the global batch, and the loop stays the book's.

    With ``dtype='bfloat16'`` (``net`` from ``new_network(..., dtype='bfloat16')``) the
    devices are checked first (``precision.check_dtype``: a CPU without bfloat16
    instructions is refused unless ``force_dtype``) and the Trainer is handed to MXNet's AMP
    (``amp.init_trainer``); the parameters stay float32.
    """
    precision.check_dtype(dtype, devices, force_dtype)
    active = precision.active_dtype()
    if active != dtype and (active is not None or dtype == 'bfloat16'):
        raise RuntimeError('init_training(dtype=%r), but the networks of this process compute '
                           'in %s; build the network with new_network(..., dtype=%r)'
                           % (dtype, active or 'float32', dtype))
    if isinstance(kvstore, str) and kvstore.startswith('dist'):
        kvstore = mx.kv.create(kvstore)  # joins the job: waits for all its processes
    params = {'learning_rate': lr}
    if isinstance(kvstore, mx.kv.KVStore) and 'dist' in kvstore.type:
        params['rescale_grad'] = 1.0 / kvstore.num_workers
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(init.Normal(sigma=INIT_SIGMA), ctx=devices, force_reinit=True)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', params, kvstore=kvstore)
    return precision.init_trainer(trainer, dtype)
