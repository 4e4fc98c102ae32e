"""Where each parameter lives, and how many bytes every device holds: ``inspect_placement``
returns it as data, ``format_placement`` as text (docs/three-ways.md, "Copies and placement").
"""
from dataclasses import dataclass

import numpy as np

__all__ = ['ParameterPlacement', 'Placement', 'inspect_placement', 'format_placement',
           'format_bytes']


@dataclass(frozen=True)
class ParameterPlacement:
    """One parameter and the devices holding a copy of it (``contexts``); ``kind`` is
    ``'auxiliary'`` for ``grad_req='null'`` (BatchNorm's running statistics), else ``'trained'``;
    ``nbytes`` the bytes of one copy, gradient not counted."""

    name: str
    shape: tuple
    dtype: str
    contexts: tuple
    kind: str
    nbytes: int


@dataclass(frozen=True)
class Placement:
    """Every parameter's devices (``parameters``, ``ParameterPlacement`` in the network's
    order), and per entry of ``devices`` (in order of first appearance) the bytes and the count
    of the parameters it holds (``bytes_per_device``, ``count_per_device``)."""

    parameters: tuple
    devices: tuple
    bytes_per_device: tuple
    count_per_device: tuple


def inspect_placement(source):
    """Return where every parameter of ``source`` lives, and the bytes per device.

    Parameters
    ----------
    source : Block or ParameterDict
        Initialized, shapes known (Gluon raises otherwise).

    Returns
    -------
    Placement
    """
    rows = []
    totals = {}
    params = source.collect_params() if hasattr(source, 'collect_params') else source
    for name, param in params.items():
        contexts = tuple(param.list_ctx())
        data = param.list_data()  # raises for parameters that are not initialized
        dtype = np.dtype(data[0].dtype)
        nbytes = int(np.prod(data[0].shape)) * dtype.itemsize
        rows.append(ParameterPlacement(name, tuple(data[0].shape), dtype.name, contexts,
                                       'auxiliary' if param.grad_req == 'null' else 'trained',
                                       nbytes))
        for c in contexts:
            count, size = totals.get(c, (0, 0))
            totals[c] = (count + 1, size + nbytes)
    return Placement(tuple(rows), tuple(totals), tuple(s for _, s in totals.values()),
                     tuple(n for n, _ in totals.values()))


def format_bytes(n):
    """``2.6 MiB``, ``64.0 KiB``, ``512 B``: binary units, one decimal."""
    for unit, size in (('GiB', 2 ** 30), ('MiB', 2 ** 20), ('KiB', 2 ** 10)):
        if n >= size:
            return '%.1f %s' % (n / size, unit)
    return '%d B' % n


def format_placement(placement, per_parameter=True):
    """Text for a ``Placement``: one line per parameter (optional), then one per device.

    A parameter line reads ``conv0_weight (64, 1, 3, 3) float32, 2.2 KiB: cpu(0)``; a device line
    ``cpu(1): 31 parameters, 40.1 MiB (94.0%)``.
    """
    lines = []
    if per_parameter:
        width = max((len(p.name) for p in placement.parameters), default=0)
        for p in placement.parameters:
            lines.append('%-*s %-18s %s, %s: %s' % (
                width, p.name, str(p.shape), p.dtype, format_bytes(p.nbytes),
                ', '.join(str(c) for c in p.contexts)))
    total = sum(placement.bytes_per_device)
    for d, count, size in zip(placement.devices, placement.count_per_device,
                              placement.bytes_per_device):
        lines.append('%s: %d parameter%s, %s (%.1f%%)' % (
            d, count, '' if count == 1 else 's', format_bytes(size),
            100.0 * size / total if total else 0.0))
    spread = [len(p.contexts) for p in placement.parameters]
    if spread and all(n == 1 for n in spread):
        lines.append('every parameter lives on exactly one device: there are no replicas '
                     'to compare')
    elif spread and all(n == len(placement.devices) for n in spread):
        lines.append('every device holds a full replica (data parallelism): '
                     'compare the replicas with inspect_replicas')
    else:
        lines.append('%d of %d parameters have copies on more than one device'
                     % (sum(n > 1 for n in spread), len(spread)))
    return '\n'.join(lines)
