"""Method 3 from scratch: data parallelism written by hand on the book's LeNet, as the book's
preceding section does it (``get_params``, ``split_batch``, ``allreduce``, ``train_batch``).
docs/three-ways.md ("How each split works") explains it and its one change from the book.
"""
import mxnet as mx
from mxnet import autograd, nd
from mxnet.gluon import loss as gloss, nn, utils as gutils

from .common import SplitNet, check_devices, data_parallel_summary

__all__ = ['init_params', 'lenet', 'loss', 'get_params', 'allreduce', 'split_batch', 'sgd',
           'train_batch', 'gluon_lenet', 'PARAM_NAMES', 'save_params', 'load_params',
           'ScratchDataParallel']

# Names of the parameters in gluon_lenet()'s .params files, in the order of init_params().
PARAM_NAMES = ('0.weight', '0.bias', '2.weight', '2.bias', '4.weight', '4.bias', '5.weight',
               '5.bias')
SHAPES = ((20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (128, 800), (128,), (10, 128), (10,))


def init_params(scale=0.01):
    """The book's LeNet parameters: weights ~ N(0, scale^2), biases 0, on the CPU."""
    return [nd.random.normal(scale=scale, shape=s) if len(s) > 1 else nd.zeros(s)
            for s in SHAPES]


def lenet(X, params):
    """The book's LeNet: two convolutions with ReLU and average pooling, two dense layers."""
    h1_conv = nd.Convolution(data=X, weight=params[0], bias=params[1], kernel=(3, 3),
                             num_filter=20)
    h1 = nd.Pooling(data=nd.relu(h1_conv), pool_type='avg', kernel=(2, 2), stride=(2, 2))
    h2_conv = nd.Convolution(data=h1, weight=params[2], bias=params[3], kernel=(5, 5),
                             num_filter=50)
    h2 = nd.Pooling(data=nd.relu(h2_conv), pool_type='avg', kernel=(2, 2), stride=(2, 2))
    # (batch, 50, 4, 4) is flattened to (batch, 800) by FullyConnected itself.
    h3 = nd.relu(nd.FullyConnected(h2, params[4], params[5], num_hidden=128))
    return nd.FullyConnected(h3, params[6], params[7], num_hidden=10)


loss = gloss.SoftmaxCrossEntropyLoss()


def get_params(params, device):
    """Copy ``params`` to ``device`` and allocate their gradients there."""
    device_params = [p.copyto(device) for p in params]
    for p in device_params:
        p.attach_grad()
    return device_params


def allreduce(data):
    """Add arrays living on different devices into ``data[0]``, then copy the sum to the others."""
    for i in range(1, len(data)):
        data[0][:] += data[i].copyto(data[0].context)
    for i in range(1, len(data)):
        data[0].copyto(data[i])


def split_batch(X, y, devices):
    """Cut ``X`` and ``y`` into ``len(devices)`` equal slices, slice ``k`` on ``devices[k]``;
    ValueError when the batch does not divide evenly (the book assumes it does)."""
    if X.shape[0] != y.shape[0]:
        raise ValueError('X has %d examples but y has %d labels; pass one label per example'
                         % (X.shape[0], y.shape[0]))
    if X.shape[0] % len(devices):
        raise ValueError('a batch of %d examples cannot be split evenly over %d devices; use a '
                         'batch size that is a multiple of %d'
                         % (X.shape[0], len(devices), len(devices)))
    return gutils.split_and_load(X, devices), gutils.split_and_load(y, devices)


def sgd(params, lr, batch_size):
    """Minibatch SGD on the gradients of a whole batch of ``batch_size`` examples."""
    for param in params:
        param[:] = param - lr * param.grad / batch_size


def train_batch(X, y, device_params, devices, lr, batch_size=None):
    """One step of data parallelism from scratch, divided by ``batch_size`` (default ``X``'s
    size, the book's ``sgd(params, lr, X.shape[0])``); returns each device's losses."""
    X_shards, y_shards = split_batch(X, y, devices)
    with autograd.record():  # each device computes the loss of its own slice
        ls = [loss(lenet(X_shard, params), y_shard)
              for X_shard, y_shard, params in zip(X_shards, y_shards, device_params)]
    for l in ls:  # and its gradient
        l.backward()
    # Sum the gradients of all devices and give every device the sum.
    for i in range(len(device_params[0])):
        allreduce([params[i].grad for params in device_params])
    for params in device_params:  # every device takes the same step
        sgd(params, lr, X.shape[0] if batch_size is None else batch_size)
    return ls


def gluon_lenet():
    """The same LeNet as Gluon layers: ``init_params()`` values load into it one to one."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(20, kernel_size=3, activation='relu'),
            nn.AvgPool2D(pool_size=2, strides=2),
            nn.Conv2D(50, kernel_size=5, activation='relu'),
            nn.AvgPool2D(pool_size=2, strides=2),
            nn.Dense(128, activation='relu'),
            nn.Dense(10))
    return net


def save_params(params, filename):
    """Write ``params`` as an ordinary ``.params`` file that ``gluon_lenet()`` loads."""
    nd.save(filename, {name: p.copyto(mx.cpu()) for name, p in zip(PARAM_NAMES, params)})


def load_params(filename):
    """Read a ``.params`` file of ``gluon_lenet()``; return the parameter list, on the CPU.
    ValueError when a name is missing or unknown, or a shape differs from the book's LeNet."""
    loaded = nd.load(filename)
    if not isinstance(loaded, dict) or set(loaded) != set(PARAM_NAMES):
        found = sorted(loaded) if isinstance(loaded, dict) else 'unnamed arrays'
        raise ValueError('%s holds %s, not the parameters %s of the book\'s LeNet; pass a '
                         'file saved by save_params or gluon_lenet().save_parameters'
                         % (filename, found, ', '.join(PARAM_NAMES)))
    for name, shape in zip(PARAM_NAMES, SHAPES):
        if loaded[name].shape != shape:
            raise ValueError('%s: %s has shape %s, the book\'s LeNet %s; pass a file saved from '
                             'the book\'s LeNet' % (filename, name, loaded[name].shape, shape))
    return [loaded[name] for name in PARAM_NAMES]


class ScratchDataParallel(SplitNet):
    """The book's LeNet trained by data parallelism from scratch: the API the command line uses.

    ``params`` (default ``init_params()``) are copied to every device: ``device_params[k]`` is
    the full parameter list on ``devices[k]``, trained by SGD at ``lr``.
    """

    method = 'scratch'

    def __init__(self, devices, lr, params=None):
        self.devices = check_devices(devices)
        self.lr = lr
        params = init_params() if params is None else params
        self.device_params = [get_params(params, d) for d in self.devices]

    def __call__(self, X):
        """Logits for ``X``, computed on the first device."""
        return lenet(X.as_in_context(self.devices[0]), self.device_params[0])

    def train_batch(self, X, y, batch_size=None):
        """One training step on ``(X, y)``, divided by ``batch_size`` (default ``X``'s size);
        returns the sum of the losses (on the first device)."""
        ls = train_batch(X, y, self.device_params, self.devices, self.lr, batch_size)
        return nd.add_n(*[l.sum().as_in_context(self.devices[0]) for l in ls])

    def save_parameters(self, filename):
        """Write the first device's copy as an ordinary ``.params`` file (see ``save_params``)."""
        save_params(self.device_params[0], filename)

    def load_parameters(self, filename):
        """Read a ``.params`` file of the book's LeNet into every device's copy."""
        values = load_params(filename)
        for params in self.device_params:
            for p, value in zip(params, values):
                p[:] = value.as_in_context(p.context)

    def summary(self, X):
        """Bytes per device for a batch ``X``, measured on the same LeNet in Gluon: every device
        holds all parameters and its slice's activations; ``allreduce`` copies ``2 (N - 1)``
        times the parameters' bytes per step."""
        net = gluon_lenet()
        net.initialize(ctx=self.devices)
        return dict(data_parallel_summary(net, self.devices, X), method=self.method)
