"""Method 2 of the chapter: split the work inside each layer, by channels. Every convolution,
BatchNorm and dense layer becomes one smaller piece per device (``split_channels``).
docs/three-ways.md ("How each split works") explains it.
"""
import itertools

import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn
from mxnet.symbol import Symbol

from .common import SplitNet, _check_initialized, check_devices

__all__ = ['SPLIT_LAYERS', 'channel_slices', 'ChannelSplit', 'split_channels', 'train_batch',
           'ChannelSplitNet']

SPLIT_LAYERS = (nn.Conv2D, nn.BatchNorm, nn.Dense)
_PARAMS = {nn.Conv2D: ('weight', 'bias'), nn.Dense: ('weight', 'bias'),
           nn.BatchNorm: ('gamma', 'beta', 'running_mean', 'running_var')}


def channel_slices(channels, num_devices):
    """Share ``channels`` out over ``num_devices``: ``[(begin, end), ...]``, sizes differing by 1
    (64 over 4 gives 16 each; 10 over 4 gives 3, 3, 2, 2)."""
    base, extra = divmod(channels, num_devices)
    edges = list(itertools.accumulate([0] + [base + (k < extra) for k in range(num_devices)]))
    return list(zip(edges, edges[1:]))


def _kind(layer):
    return next((kind for kind in SPLIT_LAYERS if isinstance(layer, kind)), None)


def _piece(layer, kind, channels, prefix):
    """A layer like ``layer`` with ``channels`` output channels (or units) instead of all."""
    weight = None if kind is nn.BatchNorm else layer.weight
    act = None if kind is nn.BatchNorm or layer.act is None else layer.act._act_type
    if kind is nn.Conv2D:
        kw = layer._kwargs
        if kw['num_group'] != 1 or kw['layout'] != 'NCHW':
            raise ValueError('layer %s: only ungrouped NCHW convolutions are split by channels '
                             '(groups=%d, layout=%s); use groups=1 and layout NCHW'
                             % (layer.name, kw['num_group'], kw['layout']))
        return nn.Conv2D(channels, kw['kernel'], strides=kw['stride'], padding=kw['pad'],
                         dilation=kw['dilate'], use_bias=not kw['no_bias'],
                         activation=act, in_channels=weight.shape[1], prefix=prefix)
    if kind is nn.Dense:
        if not layer._flatten:
            raise ValueError('layer %s: a Dense layer with flatten=False puts its units on the '
                             'last axis and is not split here; use flatten=True' % layer.name)
        return nn.Dense(channels, activation=act, use_bias=layer.bias is not None,
                        in_units=weight.shape[1], prefix=prefix)
    kw = layer._kwargs
    if kw['axis'] != 1:
        raise ValueError('layer %s: BatchNorm over axis %d; only the channel axis 1 (NCHW) is '
                         'split here' % (layer.name, kw['axis']))
    return nn.BatchNorm(momentum=kw['momentum'], epsilon=kw['eps'],
                        center=layer.beta.grad_req != 'null', scale=not kw['fix_gamma'],
                        use_global_stats=kw['use_global_stats'],
                        in_channels=channels, prefix=prefix)


class ChannelSplit(nn.HybridBlock):
    """One ``Conv2D``, ``BatchNorm`` or ``Dense`` layer with its output channels shared out.

    Piece ``k`` (``self[k]``) lives on ``devices[k]`` and computes channels ``slices[k]``; the
    layer sends its input (BatchNorm: each piece's channels of it) to every device and gathers
    the outputs on the input's device. It holds no parameters of its own, and is a
    ``HybridBlock`` only so that the chapter's network may hold it: hybridize its pieces.
    """

    def __init__(self, layer, devices, copy=nd.NDArray.as_in_context):
        super().__init__(prefix=layer.prefix)
        self.kind = _kind(layer)
        self.devices = list(devices)
        self._copy = copy
        self.param_names = [n for n in _PARAMS[self.kind] if getattr(layer, n) is not None]
        channels = getattr(layer, self.param_names[0]).shape[0]
        if channels < len(devices):
            raise ValueError('layer %s has %d output channels, fewer than the %d devices; split '
                             'over at most %d devices' % (layer.name, channels, len(devices),
                                                           channels))
        self.slices = channel_slices(channels, len(devices))
        self.pieces = []
        for k, (device, (a, b)) in enumerate(zip(self.devices, self.slices)):
            piece = _piece(layer, self.kind, b - a, '%spart%d_' % (layer.prefix, k))
            piece.initialize(ctx=device)
            piece.cast(getattr(layer, self.param_names[0]).dtype)  # float64 stays float64
            self.register_child(piece, str(k))
            self.pieces.append(piece)
        for name in self.param_names:
            whole = getattr(layer, name)
            self.set_whole(name, whole.data(whole.list_ctx()[0]))

    def __getitem__(self, k):
        return self.pieces[k]

    def forward(self, x):
        if isinstance(x, Symbol):
            raise RuntimeError('layer %s is split over %d devices and cannot be part of a '
                               'hybridized graph (a CachedOp runs on one device); hybridize its '
                               'pieces instead (ChannelSplitNet.hybridize)'
                               % (self.name, len(self.devices)))
        home = x.context
        if self.kind is nn.BatchNorm:
            inputs = [x.slice_axis(axis=1, begin=a, end=b) for a, b in self.slices]
        else:
            inputs = [x] * len(self.pieces)
        outputs = [piece(self._copy(x_k, device))
                   for piece, x_k, device in zip(self.pieces, inputs, self.devices)]
        return nd.concat(*[self._copy(y, home) for y in outputs], dim=1)

    def whole(self, name):
        """Parameter ``name`` (``'weight'``, ``'gamma'``, ...) of the whole layer, on the CPU."""
        return nd.concat(*[getattr(p, name).data(d).copyto(mx.cpu())
                           for p, d in zip(self.pieces, self.devices)], dim=0)

    def set_whole(self, name, value):
        """Share a whole-layer value of parameter ``name`` out to the pieces."""
        # slice_axis, not [a:b]: a view of an MKLDNN-laid-out array cannot be copied.
        for piece, (a, b) in zip(self.pieces, self.slices):
            getattr(piece, name).set_data(value.slice_axis(axis=0, begin=a, end=b))


def split_channels(net, devices, copy=nd.NDArray.as_in_context):
    """Replace every Conv2D, BatchNorm and Dense layer of ``net`` by a ``ChannelSplit``, in place.

    ``net`` is initialized on one device (``init_one_device``); the pieces start from its
    values. Returns ``[(path, ChannelSplit), ...]`` in the network's order, ``path`` being the
    layer's prefix in ``.params`` files (``'4.0.conv1.'``). ValueError for a layer with fewer
    output channels than devices, or with parameters but not a Conv2D, BatchNorm or Dense.
    """
    devices = check_devices(devices)
    _check_initialized(net)
    found = []

    def walk(block, path):
        # The children dict is how Gluon itself names parameters in .params files.
        for name, child in list(block._children.items()):
            if _kind(child) is not None:
                split = ChannelSplit(child, devices, copy)
                block.register_child(split, name)
                if block.__dict__.get(name) is child:
                    # Residual's self.conv1: Block.__setattr__ would refuse the new type.
                    object.__setattr__(block, name, split)
                found.append((path + name + '.', split))
            elif list(child.params.keys()):
                raise ValueError('layer %s (%s) has parameters but is not a Conv2D, BatchNorm '
                                 'or Dense layer, so it cannot be split by channels; use the '
                                 'layer split or data parallelism'
                                 % (child.name, type(child).__name__))
            else:
                walk(child, path + name + '.')

    walk(net, '')
    return found


def train_batch(X, y, net, trainers, devices, loss, batch_size=None):
    """One step: the one-device step, with one Trainer per device, divided by ``batch_size``
    (default ``X``'s size). Returns the losses."""
    X, y = X.as_in_context(devices[0]), y.as_in_context(devices[0])
    with autograd.record():
        l = loss(net(X), y)
    l.backward()
    for trainer in trainers:
        trainer.step(X.shape[0] if batch_size is None else batch_size)
    return l


class ChannelSplitNet(SplitNet):
    """A network split by channels over devices, ready to train: the API the command line uses.

    ``net``, initialized on one device (``init_one_device``), is split in place into ``layers``
    (``split_channels``), whose ``pieces`` ``trainers[k]``, SGD at ``lr``, updates on
    ``devices[k]``; ``copies`` counts the bytes every forward pass copied between devices.
    """

    method, hybridizes = 'channels', 'pieces'

    def __init__(self, net, devices, lr):
        super().__init__(net, devices)
        self.layers = split_channels(net, self.devices, lambda x, d: self.copies.copy(x, d))
        self.pieces = [piece for _, split in self.layers for piece in split.pieces]
        self.trainers = [
            gluon.Trainer([p for _, split in self.layers
                           for p in split[k].collect_params().values()],
                          'sgd', {'learning_rate': lr})
            for k in range(len(self.devices))]

    def describe(self):
        """``64 layers split by channels over cpu(0), cpu(1) (first layer: 32 | 32)``."""
        sizes = ' | '.join(str(b - a) for a, b in self.layers[0][1].slices)
        return '%d layers split by channels over %s (first layer: %s)' % (
            len(self.layers), ', '.join(str(d) for d in self.devices), sizes)

    def __call__(self, X):
        """Logits for ``X`` (moved to the first device, where they come out)."""
        return self.net(X.as_in_context(self.devices[0]))

    def train_batch(self, X, y, batch_size=None):
        """One training step on ``(X, y)``, divided by ``batch_size`` (default ``X``'s size);
        returns the sum of the losses (on the first device)."""
        return train_batch(X, y, self.net, self.trainers, self.devices, self.loss,
                           batch_size).sum()

    def whole_parameters(self):
        """``{name: NDArray on the CPU}`` with the names and shapes of the one-device network."""
        return {path + name: split.whole(name)
                for path, split in self.layers for name in split.param_names}

    def save_parameters(self, filename):
        """Write an ordinary ``.params`` file: ``resnet18(10).load_parameters`` reads it."""
        nd.save(filename, self.whole_parameters())

    def load_parameters(self, filename):
        """Read an ordinary ``.params`` file of the one-device network into the pieces; ValueError
        for a missing, unknown or differently shaped parameter (nothing is changed then)."""
        loaded = nd.load(filename)
        expected = {key: value.shape for key, value in self.whole_parameters().items()}
        if not isinstance(loaded, dict):
            raise ValueError('%s holds unnamed arrays, not the parameters of a network; pass a '
                             'file written by save_parameters' % filename)
        for key in expected:
            if key not in loaded:
                raise ValueError('%s has no parameter %r; pass a file saved from the same '
                                 'network' % (filename, key))
            if loaded[key].shape != expected[key]:
                raise ValueError('%s: parameter %r has shape %s, this network %s; pass a file '
                                 'saved from the same network'
                                 % (filename, key, loaded[key].shape, expected[key]))
        for key in loaded:
            if key not in expected:
                raise ValueError('%s has parameter %r, which this network does not have; pass '
                                 'a file saved from the same network' % (filename, key))
        for path, split in self.layers:
            for name in split.param_names:
                split.set_whole(name, loaded[path + name])

    def summary(self, X):
        """Bytes per device for a batch ``X``: parameters, activations (every layer's output
        and the inputs each device receives) and copies per step (every input forward and its
        gradient back). Call before ``hybridize()``.
        """
        return self._summary(X, [self.net], layers=len(self.layers))
