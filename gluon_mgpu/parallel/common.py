"""What the three ways of splitting training share: devices, copies between them (counted in
bytes), traces of where every block ran, and checks (docs/three-ways.md, "Copies and placement").
"""
import numpy as np
import mxnet as mx
from mxnet import init as mx_init, nd

from .placement import inspect_placement

__all__ = ['check_devices', 'init_one_device', 'nbytes', 'CopyCounter', 'layer_output_bytes',
           'trace_devices', 'check_trace', 'per_device',
           'parameter_bytes', 'count_pass', 'make_summary']


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
    """Initialize ``net`` on one device and pass one batch, so every parameter has its shape.

    This is the one-device network the splits start from (and compare against): the chapter's
    ``init.Normal(sigma=0.01)`` by default, on ``device`` (default ``mx.cpu()``). Returns ``net``.
    """
    device = mx.cpu() if device is None else device
    net.initialize(mx_init.Normal(sigma=0.01) if init is None else init, ctx=device)
    net(nd.zeros(input_shape, ctx=device))
    return net


def step_all(trainers, batch_size):
    """``trainer.step(batch_size)`` for the Trainer of every part of a split network."""
    for trainer in trainers:
        trainer.step(batch_size)


def nbytes(x):
    """Bytes of an NDArray's data."""
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


class CopyCounter:
    """Copies arrays between devices and counts the bytes sent from each device to each other.

    ``copy(x, device)`` is ``x.as_in_context(device)``: it returns ``x`` itself when it already
    lives there, and otherwise a copy that autograd differentiates (the gradient is copied
    back the same way in the backward pass, with the same number of bytes).
    """

    def __init__(self):
        self.sent = {}  # (from device, to device) -> bytes

    def copy(self, x, device):
        """Return ``x`` on ``device``, counting the bytes if that takes a copy."""
        if x.context == device:
            return x
        key = (x.context, device)
        self.sent[key] = self.sent.get(key, 0) + nbytes(x)
        return x.as_in_context(device)

    def reset(self):
        """Forget the bytes counted so far."""
        self.sent.clear()

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
    """Call ``run()``; return the bytes of every block output inside ``blocks``, per device.

    Each array counts once, on the device it lives on, however many blocks return it (a
    sequence returns its last layer's output). Operations written inside a block's own
    ``forward`` (the residual addition) are not blocks and are counted through the block's
    output only. A hybridized block hides its children, so measure before ``hybridize()``.

    Returns
    -------
    dict
        ``{context: bytes}``.
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
    """Call ``run()``; return where each block inside ``blocks`` took its inputs and left its output.

    Returns
    -------
    list of dict
        One per block call, in call order: ``name``, ``inputs`` and ``outputs`` (tuples of
        contexts) and ``parameters`` (the contexts of the block's own parameters, a tuple of
        tuples; empty for a block without parameters of its own).
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
    """Raise RuntimeError at the first block that mixed devices; return the number checked.

    A block must take all its inputs on one device, leave its output there, and hold its own
    parameters there. A block that copies on purpose (a split layer, which gathers its pieces'
    outputs on the input's device) holds no parameters of its own and keeps input and output
    on one device, so it passes; its pieces are checked one by one.
    """
    for r in records:
        devices = set(r['inputs']) | set(r['outputs'])
        for contexts in r['parameters']:
            devices |= set(contexts)
        if len(devices) > 1:
            raise RuntimeError(
                'block %s mixed devices: inputs on %s, output on %s, parameters on %s; a copy '
                '(as_in_context) is missing, and MXNet does not notice on CPU contexts'
                % (r['name'], list(r['inputs']), list(r['outputs']), list(r['parameters'])))
    return len(records)


def per_device(mapping, devices):
    """``{context: number}`` as a list in the order of ``devices`` (0 where missing)."""
    return [int(mapping.get(d, 0)) for d in devices]


def parameter_bytes(params, devices):
    """Bytes of parameters held on each of ``devices`` (a list in their order)."""
    placement = inspect_placement(params)
    return per_device(dict(zip(placement.devices, placement.bytes_per_device)), devices)


def count_pass(blocks, devices, run):
    """Run one forward pass as ``run(copy)``; return ``(activation bytes per device, bytes copied)``.

    ``run`` must send every copy between devices through ``copy(x, device)``. A device's
    activations are the outputs of the blocks inside ``blocks`` that it computed plus what it
    received from other devices (a list in the order of ``devices``); the second number is the
    bytes the pass copied between devices.
    """
    counter = CopyCounter()
    outputs = layer_output_bytes(blocks, lambda: run(counter.copy))
    return [outputs.get(d, 0) + counter.received(d) for d in devices], counter.total


def make_summary(method, devices, batch_size, parameter_bytes, activation_bytes,
                 copied_bytes_per_step, **extra):
    """The dict every method's ``summary(X)`` returns: bytes as lists in the order of ``devices``.

    Keys: ``method``, ``devices`` (strings), ``batch_size``, ``parameter_bytes``,
    ``activation_bytes``, ``copied_bytes_per_step``, then ``extra`` (``units`` and
    ``micro_batches`` for the layer split, ``layers`` for the channel split).
    """
    return dict({'method': method, 'devices': [str(d) for d in devices],
                 'batch_size': batch_size, 'parameter_bytes': list(parameter_bytes),
                 'activation_bytes': list(activation_bytes),
                 'copied_bytes_per_step': copied_bytes_per_step}, **extra)
