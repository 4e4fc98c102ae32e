"""What the three ways of splitting training share: devices, copies between them (counted in
bytes), traces of where every block ran, checks (docs/three-ways.md, "Copies and placement"), and
their epochs: ``training.train`` itself, whose step is the split network's own ``step``.
"""
from types import SimpleNamespace

import numpy as np
import mxnet as mx
from mxnet import init as mx_init, nd
from mxnet.gluon import loss as gloss, utils as gutils
from mxnet.gluon.parameter import DeferredInitializationError

from ..training import evaluate_accuracy, train
from ..replicas.placement import inspect_placement

__all__ = ['check_devices', 'init_one_device', 'nbytes', 'CopyCounter', 'layer_output_bytes',
           'trace_devices', 'check_trace', 'parameter_bytes', 'make_summary',
           'data_parallel_summary', 'SplitNet', 'train_split']


def check_devices(devices):
    """Return ``devices`` as a list, or raise ValueError if it is empty or repeats a device."""
    devices = list(devices)
    if not devices:
        raise ValueError('no devices given; pass at least one, e.g. [mx.cpu(0), mx.cpu(1)]')
    if len(set(devices)) != len(devices):
        raise ValueError('devices %s name a device twice; every device holds a different part, '
                         'so pass each device once' % devices)
    return devices


def init_one_device(net, device=None, init=None, input_shape=(1, 1, 28, 28)):
    """Initialize ``net`` on ``device`` (default ``mx.cpu()``) with ``init`` (default the
    chapter's ``Normal(sigma=0.01)``) and pass one batch, so every parameter has its shape.
    Returns ``net``: the one-device network the splits start from."""
    device = mx.cpu() if device is None else device
    net.initialize(mx_init.Normal(sigma=0.01) if init is None else init, ctx=device)
    net(nd.zeros(input_shape, ctx=device))
    return net


def _check_initialized(net):
    for p in net.collect_params().values():
        try:
            p.list_data()
        except (DeferredInitializationError, RuntimeError):
            raise RuntimeError('parameter %s is not initialized yet, so its shape and size are '
                               'unknown; call init_one_device(net) (initialize and pass one '
                               'batch) before splitting' % p.name) from None


def nbytes(x):
    """Bytes of an NDArray's data."""
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


class CopyCounter:
    """Copies arrays between devices (``x.as_in_context(device)``, which autograd
    differentiates) and counts the bytes sent from each device to each other."""

    def __init__(self):
        self.sent = {}  # (from device, to device) -> bytes

    def copy(self, x, device):
        """Return ``x`` on ``device``, counting the bytes if that takes a copy."""
        if x.context == device:
            return x
        key = (x.context, device)
        self.sent[key] = self.sent.get(key, 0) + nbytes(x)
        return x.as_in_context(device)

    @property
    def total(self):
        """Bytes copied between devices so far."""
        return sum(self.sent.values())

    def received(self, device):
        """Bytes copied onto ``device`` so far."""
        return sum(n for (_, dst), n in self.sent.items() if dst == device)


def _arrays(x):
    if isinstance(x, nd.NDArray):
        return [x]
    if isinstance(x, (list, tuple)):
        return [a for item in x for a in _arrays(item)]
    return []


def _run_hooked(blocks, hook, run):
    """Call ``run()`` with ``hook`` after the forward of every block inside ``blocks``."""
    handles = []
    for block in blocks:
        block.apply(lambda b: handles.append(b.register_forward_hook(hook)))
    try:
        run()
    finally:
        for h in handles:
            h.detach()


def layer_output_bytes(blocks, run):
    """Call ``run()``; return ``{context: bytes}`` of every block output inside ``blocks``.

    Each array counts once, however many blocks return it. A hybridized block hides its
    children, so measure before ``hybridize()``.
    """
    seen = {}

    def hook(block, inputs, output):
        for a in _arrays(output):
            seen[a.handle.value] = (a.context, nbytes(a), a)  # keep a alive: handles stay unique

    _run_hooked(blocks, hook, run)
    out = {}
    for context, size, _ in seen.values():
        out[context] = out.get(context, 0) + size
    return out


def trace_devices(blocks, run):
    """Call ``run()``; return where each block inside ``blocks`` took its inputs, left its output
    and holds its parameters: a dict per block call, in call order, with ``name``, ``inputs`` and
    ``outputs`` (tuples of contexts) and ``parameters`` (the contexts of each of its own).
    """
    records = []

    def hook(block, inputs, output):
        records.append({'name': block.name,
                        'inputs': tuple(a.context for a in _arrays(inputs)),
                        'outputs': tuple(a.context for a in _arrays(output)),
                        'parameters': tuple(tuple(p.list_ctx())
                                            for p in block.params.values())})

    _run_hooked(blocks, hook, run)
    return records


def check_trace(records):
    """Raise RuntimeError at the first block of ``trace_devices``' ``records`` that took its
    inputs, left its output or holds its own parameters on more than one device; return the
    number checked. (A ``ChannelSplit`` holds no parameters and gathers on its input's device.)
    """
    for r in records:
        devices = set(r['inputs']).union(r['outputs'], *r['parameters'])
        if len(devices) > 1:
            raise RuntimeError(
                'block %s mixed devices: inputs on %s, output on %s, parameters on %s; a copy '
                '(as_in_context) is missing, and MXNet does not notice on CPU contexts'
                % (r['name'], list(r['inputs']), list(r['outputs']), list(r['parameters'])))
    return len(records)


def parameter_bytes(params, devices):
    """Bytes of parameters held on each of ``devices`` (a list in their order)."""
    placement = inspect_placement(params)
    held = dict(zip(placement.devices, placement.bytes_per_device))
    return [int(held.get(d, 0)) for d in devices]


def make_summary(method, devices, batch_size, parameter_bytes, activation_bytes,
                 copied_bytes_per_step, **extra):
    """The dict every method's ``summary(X)`` returns, bytes as lists in the order of ``devices``;
    ``extra``: ``units`` and ``micro_batches`` (layers), ``layers`` (channels)."""
    return dict({'method': method, 'devices': [str(d) for d in devices],
                 'batch_size': batch_size, 'parameter_bytes': list(parameter_bytes),
                 'activation_bytes': list(activation_bytes),
                 'copied_bytes_per_step': copied_bytes_per_step}, **extra)


def data_parallel_summary(net, devices, X):
    """The splits' ``summary(X)`` for data parallelism: ``net`` holds one replica per device,
    every device runs its slice of ``X``, and the book's ``allreduce`` copies ``2 (N - 1)`` times
    the bytes of the trained parameters per step (the kvstore's own route may differ)."""
    devices = check_devices(devices)
    X_shards = gutils.split_and_load(X, devices, even_split=False)
    outputs = layer_output_bytes([net], lambda: [net(x) for x in X_shards])
    trained = sum(nbytes(p.data(p.list_ctx()[0]))
                  for p in net.collect_params().values() if p.grad_req != 'null')
    return make_summary('data', devices, X.shape[0], parameter_bytes(net, devices),
                        [outputs.get(d, 0) for d in devices], 2 * (len(devices) - 1) * trained)


class SplitNet:
    """What the split networks share; each sets ``devices``, the first computing the logits.

    The layer and channel splits also hold ``net`` (the one-device network they split),
    ``copies`` (a ``CopyCounter``) and ``loss``, all three set by ``__init__``, and ``trainers``
    (one per device), and name the attribute holding the blocks they hybridize, each on its
    device, in ``hybridizes`` (``'parts'``, ``'pieces'``); scratch hybridizes nothing.
    """

    hybridized = False

    def __init__(self, net, devices):
        self.net, self.devices = net, check_devices(devices)
        self.copies = CopyCounter()  # looked up at every copy: summary() swaps in its own
        self.loss = gloss.SoftmaxCrossEntropyLoss()

    def hybridize(self, **kwargs):
        """Hybridize each block of ``hybridizes`` (keyword arguments go to ``hybridize``)."""
        for block in getattr(self, self.hybridizes):
            block.hybridize(**kwargs)
        self.hybridized = True

    def step(self, net, X, y, loss, trainer, devices, split_f, batch_size):
        """``train()``'s step (``training.choose_step``), in ``train_batch``'s arguments, of
        which the split uses ``X``, ``y`` and ``batch_size``: ``([loss_sum], None, None)``."""
        return [self.train_batch(X, y, batch_size)], None, None

    def evaluate_accuracy(self, data_iter):
        """Fraction of ``data_iter`` classified correctly."""
        return evaluate_accuracy(data_iter, self, self.devices)

    def _summary(self, X, blocks, **extra):
        """``summary(X)`` from one forward pass ``self(X)`` with a new ``CopyCounter`` in
        ``copies``: a device's activations are the outputs it computed of the blocks inside
        ``blocks`` plus what it received; each copy counts twice (its gradient comes back)."""
        if self.hybridized:
            raise RuntimeError('the activations are counted layer by layer, and hybridized %s '
                               'hide their layers; call summary() before hybridize()'
                               % self.hybridizes)
        X = X.as_in_context(self.devices[0])
        counted, self.copies = self.copies, CopyCounter()
        try:
            outputs = layer_output_bytes(blocks, lambda: self(X))
        finally:
            counter, self.copies = self.copies, counted
        activations = [outputs.get(d, 0) + counter.received(d) for d in self.devices]
        return make_summary(self.method, self.devices, X.shape[0],
                            parameter_bytes(self.net, self.devices), activations,
                            2 * counter.total, **extra)


def train_split(split, train_iter, test_iter, lr, num_epochs=4, event_handlers=None,
                batch_size=None):
    """``train(split, ...)`` on ``split.devices``, so that the command line's handlers work for
    every way of splitting: print the book's line per epoch; return the history (``train_acc``
    None: a split network returns only its loss).

    ``event_handlers`` as in ``train()``; they see the split network as ``estimator.net`` and
    ``lr`` as ``estimator.trainer.learning_rate`` (a split has one Trainer per part, or none).
    """
    return train(split, train_iter, test_iter, split.devices, num_epochs,
                 SimpleNamespace(learning_rate=lr), event_handlers, batch_size=batch_size)
