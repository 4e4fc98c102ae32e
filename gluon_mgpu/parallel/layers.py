"""Method 1 of the chapter: split the network by layers, consecutive parts on consecutive devices,
optionally pipelined with micro-batches. docs/three-ways.md ("How each split works") explains the
parts, the cuts and the pipeline.
"""
import itertools
import statistics
import time

from mxnet import autograd, gluon, nd
from mxnet.gluon import nn, utils as gutils

from ..runtime.checks import check_whole
from .common import SplitNet, _check_initialized, check_devices, nbytes

__all__ = ['RESNET18_UNITS', 'CUT_RULES', 'stage_units', 'unit_bytes', 'unit_times',
           'choose_cut', 'resolve_cut', 'split_layers', 'forward', 'train_batch', 'LayerSplit']

RESNET18_UNITS = ('stem', 'stage1', 'stage2', 'stage3', 'stage4', 'head')
CUT_RULES = ('params', 'time')
_RESNET18_KINDS = (nn.Conv2D, nn.BatchNorm, nn.Activation) + (nn.HybridSequential,) * 4 + (
    nn.GlobalAvgPool2D, nn.Dense)


def stage_units(net):
    """Return ``[(name, [blocks]), ...]``: the pieces a layer split may put on different devices.

    For the chapter's ResNet-18, ``RESNET18_UNITS`` (a cut inside a residual block would have to
    send both of its branches); for any other ``HybridSequential`` every child, named by its
    index (``'0'``, ``'1'``, ...).
    """
    if not isinstance(net, nn.HybridSequential):
        raise ValueError('a layer split needs an nn.HybridSequential, got %s; build the '
                         'network as a sequence of layers' % type(net).__name__)
    children = [net[i] for i in range(len(net))]
    if len(children) == len(_RESNET18_KINDS) and all(
            isinstance(c, k) for c, k in zip(children, _RESNET18_KINDS)):
        groups = [children[0:3], children[3:4], children[4:5], children[5:6], children[6:7],
                  children[7:9]]
        return list(zip(RESNET18_UNITS, groups))
    return [(str(i), [c]) for i, c in enumerate(children)]


def unit_bytes(units):
    """Bytes of the parameters (BatchNorm statistics included) of each unit."""
    return [sum(nbytes(p.data(p.list_ctx()[0]))
                for block in blocks for p in block.collect_params().values())
            for _, blocks in units]


def unit_times(units, X, repeats=3):
    """Median seconds of a forward and backward pass of each unit on ``X``'s device, each fed
    the previous unit's output, after one untimed pass. Recorded in prediction mode, so
    BatchNorm's running statistics stay as they were."""
    times = [[] for _ in units]
    for r in range(repeats + 1):
        x = X
        for i, (_, blocks) in enumerate(units):
            x = x.detach()
            nd.waitall()
            start = time.perf_counter()
            with autograd.record(train_mode=False):
                y = x
                for block in blocks:
                    y = block(y)
            y.backward()
            nd.waitall()
            if r:
                times[i].append(time.perf_counter() - start)
            x = y
    return [statistics.median(t) for t in times]


def choose_cut(costs, num_devices):
    """Cut a list of unit costs into ``num_devices`` non-empty runs with the smallest largest run
    (then the smallest second largest, and so on; then the earliest). Returns the number of
    units before each cut: ``choose_cut([1, 2, 3, 4], 2) == (3,)`` (6 | 4)."""
    def runs(bounds):
        edges = (0,) + bounds + (len(costs),)
        return sorted((sum(costs[a:b]) for a, b in zip(edges, edges[1:])), reverse=True)

    # min keeps the first of equals, and combinations come earliest first.
    return min(itertools.combinations(range(1, len(costs)), num_devices - 1), key=runs)


def resolve_cut(units, cut, num_devices, sample=None):
    """Turn ``cut`` into boundaries (number of units before each cut) for ``num_devices``.

    ``cut``: ``'params'`` evens the bytes of parameters per device, ``'time'`` the time
    ``unit_times`` measures on ``sample`` (a batch on the units' device), and unit names
    (``('stage2',)``, one fewer than devices, in order) cut after those units of ``units``
    (``stage_units``). ValueError names what does not fit.
    """
    names = [name for name, _ in units]
    if num_devices > len(units):
        raise ValueError('a layer split over %d devices needs %d units, but the network has %d '
                         '(%s); use at most %d devices'
                         % (num_devices, num_devices, len(units), ', '.join(names), len(units)))
    if cut == 'params':
        return choose_cut(unit_bytes(units), num_devices)
    if cut == 'time':
        if sample is None:
            raise ValueError("cut='time' times every unit on a sample batch; pass sample=X "
                             "(a batch on the network's device)")
        return choose_cut(unit_times(units, sample), num_devices)
    if isinstance(cut, str) or not all(isinstance(c, str) for c in cut):
        raise ValueError("cut must be 'params', 'time' or the names of the units after which to "
                         "cut, got %r; the units are %s" % (cut, ', '.join(names)))
    cut = tuple(cut)
    if len(cut) != num_devices - 1:
        raise ValueError('%d devices need %d cut%s, got %d (%s); name %d of the units %s'
                         % (num_devices, num_devices - 1, '' if num_devices == 2 else 's',
                            len(cut), ', '.join(cut), num_devices - 1, ', '.join(names[:-1])))
    bounds = []
    for c in cut:
        if c not in names[:-1]:
            raise ValueError('cannot cut after %r: cut after one of %s (the last unit, %s, '
                             'ends the network)' % (c, ', '.join(names[:-1]), names[-1]))
        bounds.append(names.index(c) + 1)
    if bounds != sorted(set(bounds)):
        raise ValueError('cuts %s are not in the order of the network; list them in order, '
                         'each once: %s' % (', '.join(cut), ', '.join(names[:-1])))
    return tuple(bounds)


def split_layers(net, devices, cut='params', sample=None):
    """Put runs of consecutive units of ``net`` (initialized: ``init_one_device``) on
    consecutive devices; ``net`` keeps its parameters, so it still saves ordinary ``.params``.
    Returns ``(parts, names)``: one ``nn.HybridSequential`` per device, ``parts[k]``'s parameters
    on ``devices[k]``, and the names of each part's units.
    """
    devices = check_devices(devices)
    _check_initialized(net)
    units = stage_units(net)
    bounds = resolve_cut(units, cut, len(devices), sample)
    edges = (0,) + bounds + (len(units),)
    parts, names = [], []
    for k, device in enumerate(devices):
        part = nn.HybridSequential(prefix='part%d_' % k)
        for _, blocks in units[edges[k]:edges[k + 1]]:
            part.add(*blocks)
        part.collect_params().reset_ctx(device)
        parts.append(part)
        names.append([name for name, _ in units[edges[k]:edges[k + 1]]])
    return parts, names


def forward(parts, X, devices, copy=nd.NDArray.as_in_context):
    """Run ``X`` through the parts, moving the activation to each part's device."""
    for part, device in zip(parts, devices):
        X = part(copy(X, device))
    return X


def train_batch(X, y, parts, trainers, devices, loss, micro_batches=1,
                copy=nd.NDArray.as_in_context, batch_size=None):
    """One step of the layer split: forward every micro-batch (at most one per example), one
    backward over all their losses, one update. Returns the micro-batches' losses (on the last
    device).

    (A backward per micro-batch fails with BatchNorm: the first frees the graph of the running
    statistics that all micro-batches share.) The update divides by ``batch_size`` (default
    ``X``'s size), as ``training.train_batch``.
    """
    m = min(micro_batches, X.shape[0])
    X_micros = gutils.split_data(X.as_in_context(devices[0]), m, even_split=False)
    y_micros = gutils.split_data(y.as_in_context(devices[-1]), m, even_split=False)
    with autograd.record():
        ls = [loss(forward(parts, X_m, devices, copy), y_m)
              for X_m, y_m in zip(X_micros, y_micros)]
    autograd.backward(ls)
    for trainer in trainers:
        trainer.step(X.shape[0] if batch_size is None else batch_size)
    return ls


class LayerSplit(SplitNet):
    """A network split by layers over devices, ready to train: the API the command line uses.

    ``net``, an ``nn.HybridSequential`` initialized on one device (``init_one_device``), is split
    in place into ``parts`` where ``cut`` says (``resolve_cut``), each with its SGD Trainer at
    ``lr``; ``copies`` counts the bytes every forward pass copied between devices.
    """

    method, hybridizes = 'layers', 'parts'

    def __init__(self, net, devices, lr, cut='params', micro_batches=1, sample=None):
        check_whole('micro_batches', micro_batches, 'pass 1 for no pipeline')
        super().__init__(net, devices)
        self.parts, self.names = split_layers(net, self.devices, cut, sample)
        self.micro_batches = micro_batches
        self.trainers = [gluon.Trainer(part.collect_params(), 'sgd', {'learning_rate': lr})
                         for part in self.parts]

    def describe(self):
        """``cpu(0): stem, stage1, stage2, stage3 | cpu(1): stage4, head``."""
        return ' | '.join('%s: %s' % (d, ', '.join(n)) for d, n in zip(self.devices, self.names))

    def __call__(self, X):
        """Logits for ``X`` (moved to the first device); they come out on the last device."""
        return forward(self.parts, X.as_in_context(self.devices[0]), self.devices,
                       self.copies.copy)

    def train_batch(self, X, y, batch_size=None):
        """One training step on ``(X, y)``, divided by ``batch_size`` (default ``X``'s size);
        returns the sum of the losses (on the last device)."""
        ls = train_batch(X, y, self.parts, self.trainers, self.devices, self.loss,
                         self.micro_batches, self.copies.copy, batch_size)
        return nd.add_n(*[l.sum() for l in ls])

    def save_parameters(self, filename):
        """Write an ordinary ``.params`` file: ``resnet18(10).load_parameters`` reads it."""
        self.net.save_parameters(filename)

    def load_parameters(self, filename):
        """Read an ordinary ``.params`` file into the parts (Gluon checks names and shapes)."""
        self.net.load_parameters(filename)

    def summary(self, X):
        """Bytes per device for a batch ``X``: parameters, activations (every layer's output
        and what the previous device sent; the same for any ``micro_batches``, all kept until
        the backward pass) and copies per step (each boundary activation forward and its
        gradient back). Call before ``hybridize()``, which hides the layers.
        """
        return self._summary(X, self.parts, units=self.names, micro_batches=self.micro_batches)
