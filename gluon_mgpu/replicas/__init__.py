"""The parameter-replica inspector: are the weights the same on every device? It compares the
copies of every parameter, trained and frozen alike, and reports BatchNorm's running statistics,
which are meant to differ, apart (docs/replicas.md). ``python -m gluon_mgpu.replicas`` is
``gluon_mgpu/commands/replicas.py``.
"""
import math
from dataclasses import dataclass

from ..devices import format_devices, plural

__all__ = ['ParameterReplicas', 'ReplicaReport', 'ReplicaMismatchError', 'inspect_replicas',
           'assert_replicas_match', 'get_replica', 'format_replica_report',
           'format_replica_summary', 'inspection_cells', 'AUXILIARY_WHY', 'FROZEN_WHY',
           'GRADIENT_WHY']

AUXILIARY_WHY = ('each device updates its own BatchNorm running statistics from its own slice '
                 'of the batch, and the Trainer never reduces them')
FROZEN_WHY = ("nothing updates a frozen parameter (grad_req='null'), so one replica was changed on "
              "its own (for example by writing to param.data(ctx) on one device)")
GRADIENT_WHY = ('before trainer.step each device holds the gradient of its own slice; step sums '
                'them, and writes the sum back into every device\'s gradient only when the '
                'Trainer reduces gradients itself (update_on_kvstore=False), not when the '
                'kvstore applies the update (the default)')


class ReplicaMismatchError(RuntimeError):
    """Replicas of a trained or frozen parameter differ between devices by more than allowed.

    Attributes: ``parameter`` (the one that differs most), ``contexts`` (its first device and
    the one that differs most), ``abs_diff``, ``rel_diff``, ``atol`` and ``report``.
    """

    def __init__(self, message, parameter, contexts, abs_diff, rel_diff, atol, report):
        super().__init__(message)
        self.parameter, self.contexts, self.report = parameter, contexts, report
        self.abs_diff, self.rel_diff, self.atol = abs_diff, rel_diff, atol


def _json_float(x):
    # json.dumps would write inf as `Infinity`, which is not JSON.
    return x if math.isfinite(x) else 'inf'


@dataclass(frozen=True)
class ParameterReplicas:
    """One parameter's replicas, each compared with the first.

    Attributes
    ----------
    name : str
    shape : tuple of int
    contexts : tuple of mxnet.Context
        The devices compared; the first is the reference.
    kind : {'trained', 'frozen', 'auxiliary'}
        ``'auxiliary'`` for a state no gradient can reach (``differentiable=False``: BatchNorm's
        running statistics), ``'frozen'`` for another parameter with ``grad_req == 'null'``
        (a frozen layer), else ``'trained'``.
    abs_diff, rel_diff : tuple of float
        Per context, ``max |replica - first|`` and that over the largest magnitude in the two;
        ``inf`` where only one replica holds a NaN or an infinity (docs/replicas.md).
    """

    name: str
    shape: tuple
    contexts: tuple
    kind: str
    abs_diff: tuple
    rel_diff: tuple

    @property
    def max_abs_diff(self):
        """Largest absolute difference of any replica from the first."""
        return max(self.abs_diff)

    @property
    def max_rel_diff(self):
        """Largest relative difference of any replica from the first."""
        return max(self.rel_diff)

    @property
    def identical(self):
        """True when every replica equals the first bit for bit (NaN equals NaN here)."""
        return self.max_abs_diff == 0.0

    @property
    def worst_context(self):
        """The context whose replica differs most from the first (the first if all agree)."""
        return self.contexts[self.abs_diff.index(self.max_abs_diff)]

    @property
    def is_batchnorm_statistic(self):
        """True for BatchNorm's ``running_mean`` / ``running_var``."""
        return self.kind == 'auxiliary' and self.name.endswith(('running_mean', 'running_var'))

    def to_dict(self):
        """A JSON-ready dict: contexts as strings, ``inf`` as the string ``'inf'``."""
        return {'name': self.name, 'shape': list(self.shape), 'kind': self.kind,
                'contexts': [str(c) for c in self.contexts],
                'abs_diff': [_json_float(x) for x in self.abs_diff],
                'rel_diff': [_json_float(x) for x in self.rel_diff],
                'max_abs_diff': _json_float(self.max_abs_diff),
                'max_rel_diff': _json_float(self.max_rel_diff),
                'identical': self.identical}


@dataclass(frozen=True)
class ReplicaReport:
    """The result of ``inspect_replicas``: ``what`` (``'data'`` or ``'grad'``), ``contexts``
    (every device seen, in order) and ``parameters`` (``ParameterReplicas`` in
    ``collect_params()`` order; only trained ones for ``'grad'``)."""

    what: str
    contexts: tuple
    parameters: tuple

    @property
    def trained(self):
        """The trained parameters (``grad_req != 'null'``)."""
        return [p for p in self.parameters if p.kind == 'trained']

    @property
    def frozen(self):
        """The frozen parameters (``grad_req == 'null'``, not auxiliary): nothing updates them,
        so they must stay identical too."""
        return [p for p in self.parameters if p.kind == 'frozen']

    @property
    def auxiliary(self):
        """The auxiliary states (BatchNorm's running statistics), allowed to differ."""
        return [p for p in self.parameters if p.kind == 'auxiliary']

    @property
    def checked(self):
        """The parameters that must be identical on every device: trained and frozen."""
        return [p for p in self.parameters if p.kind != 'auxiliary']

    @property
    def mismatched(self):
        """The trained and frozen parameters whose replicas are not identical."""
        return [p for p in self.checked if not p.identical]

    @property
    def ok(self):
        """True when every trained and frozen parameter is identical on every device."""
        return not self.mismatched

    @property
    def worst(self):
        """The trained or frozen parameter that differs most, or None when all are identical."""
        return max(self.mismatched, key=lambda p: p.max_abs_diff, default=None)

    @property
    def auxiliary_max_abs_diff(self):
        """Largest difference among the auxiliary states (0.0 when there are none)."""
        return max((p.max_abs_diff for p in self.auxiliary), default=0.0)

    def to_dict(self):
        """A JSON-ready dict of the whole report (``json.dumps`` accepts it as is)."""
        worst = self.worst
        return {'what': self.what, 'contexts': [str(c) for c in self.contexts], 'ok': self.ok,
                'worst': None if worst is None else worst.name,
                'num_trained': len(self.trained), 'num_frozen': len(self.frozen),
                'num_auxiliary': len(self.auxiliary),
                'auxiliary_max_abs_diff': _json_float(self.auxiliary_max_abs_diff),
                'parameters': [p.to_dict() for p in self.parameters]}


def _check_initialized(param):
    """Return ``param``'s contexts, or say in the error how to initialize it."""
    from mxnet.gluon.parameter import DeferredInitializationError
    try:
        param.list_data()
    except DeferredInitializationError:
        raise DeferredInitializationError(
            "parameter '%s' is not initialized yet: its initialization on %s is deferred until "
            "the first forward pass tells its input shape; pass one batch through the network "
            "first, e.g. net(X) with X on one of those devices (the chapter runs "
            "net(gpu_x[0]), net(gpu_x[1]))"
            % (param.name, format_devices(param.list_ctx()))) from None
    except RuntimeError:
        raise RuntimeError("parameter '%s' is not initialized; call "
                           "net.initialize(ctx=devices) and pass one batch through the network "
                           "first" % param.name) from None
    return param.list_ctx()


def get_replica(param, ctx, what='data'):
    """Return ``param``'s replica (``what='data'``) or gradient (``'grad'``) on ``ctx``, itself
    and not a copy: ``param.data(ctx)`` / ``param.grad(ctx)`` with errors that say what to do.

    Raises
    ------
    ValueError
        For an unknown ``what``, a ``ctx`` the parameter does not live on, or no gradient.
    RuntimeError
        Before initialization; ``DeferredInitializationError`` before the first batch.
    """
    if what not in ('data', 'grad'):
        raise ValueError("what must be 'data' (parameter values) or 'grad' (gradients), got %r"
                         % (what,))
    contexts = _check_initialized(param)
    if ctx not in contexts:
        raise ValueError("parameter '%s' is not initialized on %s; it lives on %s: ask for one "
                         "of those" % (param.name, ctx, format_devices(contexts)))
    if what == 'grad':
        if param.grad_req == 'null':
            raise ValueError("parameter '%s' has no gradient (grad_req='null'); inspect its "
                             "data instead" % param.name)
        return param.grad(ctx)
    return param.data(ctx)


def _difference(replica, first):
    """``(max |replica - first|, that / max(|replica|, |first|))``; ``first`` is a numpy array.
    Identical replicas cost one copy to the host and one pass in place."""
    import numpy as np  # here: python -m gluon_mgpu.replicas says why MXNet cannot be imported
    d = replica.asnumpy()
    with np.errstate(invalid='ignore', over='ignore'):
        np.subtract(d, first, out=d)
        np.abs(d, out=d)
    m = float(d.max()) if d.size else 0.0
    if m == 0.0:
        return 0.0, 0.0
    a, b = replica.asnumpy(), first
    if not math.isfinite(m):
        # NaN or infinity: replicas agree where both hold NaN or the same infinity.
        agree = (a == b) | (np.isnan(a) & np.isnan(b))
        if agree.all():
            return 0.0, 0.0
        m = float(np.where(agree, 0.0, np.nan_to_num(d, nan=np.inf)).max())
        if not math.isfinite(m):
            return math.inf, math.inf
    scale = max(float(np.abs(a[np.isfinite(a)]).max(initial=0.0)),
                float(np.abs(b[np.isfinite(b)]).max(initial=0.0)))
    return m, m / scale


def inspect_replicas(net, what='data', devices=None):
    """Compare every parameter's replicas across devices; return a ``ReplicaReport``.

    Waits for pending computation, then compares each replica with the parameter's first on
    the host (docs/replicas.md). Call it outside ``record()``.

    Parameters
    ----------
    net : mxnet.gluon.Block or ParameterDict
        Initialized, and it has seen one batch.
    what : {'data', 'grad'}, default 'data'
        The parameter values, or the gradients of the trained parameters (``GRADIENT_WHY``).
    devices : list of mxnet.Context, optional
        Compare only these replicas, the first as reference. Default: all of each parameter's.

    Raises
    ------
    ValueError, RuntimeError
        As ``get_replica``.
    """
    devices = None if devices is None else list(devices)
    if devices is not None and not devices:
        raise ValueError('devices is empty; pass at least one context, or None for all')
    from mxnet import nd
    from mxnet.gluon.parameter import ParameterDict
    if isinstance(net, ParameterDict):
        params = list(net.values())
    elif hasattr(net, 'collect_params'):
        params = list(net.collect_params().values())
    else:
        raise ValueError('expected a gluon Block (e.g. resnet18(10)) or a ParameterDict, got %r; '
                         'pass the network itself' % (type(net).__name__,))
    nd.waitall()
    rows, seen = [], []
    for param in params:
        if what == 'grad' and param.grad_req == 'null':
            continue
        contexts = _check_initialized(param) if devices is None else devices
        arrays = [get_replica(param, c, what) for c in contexts]
        first = arrays[0].asnumpy()
        diffs = [(0.0, 0.0)] + [_difference(a, first) for a in arrays[1:]]
        # MXNet 1.9 keeps whether a gradient can reach a parameter only in ``_differentiable``.
        kind = 'trained' if param.grad_req != 'null' else (
            'frozen' if getattr(param, '_differentiable', True) else 'auxiliary')
        rows.append(ParameterReplicas(
            name=param.name, shape=tuple(first.shape), contexts=tuple(contexts), kind=kind,
            abs_diff=tuple(d[0] for d in diffs), rel_diff=tuple(d[1] for d in diffs)))
        seen.extend(c for c in contexts if c not in seen)
    return ReplicaReport(what=what, contexts=tuple(seen), parameters=tuple(rows))


def _checked_phrase(report):
    """``76 trained parameters``, or ``74 trained and 2 frozen parameters``."""
    if not report.frozen:
        return plural(len(report.trained), 'trained parameter')
    return '%d trained and %s' % (len(report.trained), plural(len(report.frozen),
                                                              'frozen parameter'))


def _number(x):
    return '0' if x == 0 else ('inf' if math.isinf(x) else '%.1e' % x)


def assert_replicas_match(net, atol=0.0, what='data', devices=None):
    """Check that every trained and frozen parameter is the same on every device; return the
    report.

    Auxiliary states are reported, never checked (``AUXILIARY_WHY``). ``atol`` is the largest
    absolute difference allowed; ``what`` and ``devices`` as in ``inspect_replicas``.

    Raises
    ------
    ReplicaMismatchError
        Naming the parameter that differs most, the two contexts and the difference.
    ValueError
        For a negative or non-numeric ``atol`` (and as ``inspect_replicas``).
    """
    try:
        atol = float(atol)
        if not atol >= 0:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError('atol must be a number >= 0, got %r; for example atol=0.0'
                         % (atol,)) from None
    report = inspect_replicas(net, what=what, devices=devices)
    over = [p for p in report.checked if p.max_abs_diff > atol]
    if not over:
        return report
    worst = max(over, key=lambda p: p.max_abs_diff)
    pair = (worst.contexts[0], worst.worst_context)
    if what == 'data' and worst.kind == 'frozen':
        subject, why = "frozen parameter '%s'" % worst.name, FROZEN_WHY
    elif what == 'data':
        subject = "parameter '%s'" % worst.name
        why = ('trainer.step applies the same summed gradient to every replica, so one replica '
               'was changed on its own (for example by writing to param.data(ctx) on one device '
               'or by updating it outside the Trainer)')
    else:
        subject, why = "the gradient of parameter '%s'" % worst.name, GRADIENT_WHY
    message = ('%s %s differs between %s and %s by %s (relative %s, atol %s); %d of %s differ; %s'
               % (subject, worst.shape, pair[0], pair[1], _number(worst.max_abs_diff),
                  _number(worst.max_rel_diff), _number(atol), len(over),
                  _checked_phrase(report), why))
    raise ReplicaMismatchError(message, worst.name, pair, worst.max_abs_diff,
                               worst.max_rel_diff, atol, report)


def format_replica_summary(report):
    """One line about a report, ``replicas: 76 trained parameters identical on 2 devices; 34
    BatchNorm statistics differ by at most 3.1e-02 (expected: ...)`` (docs/replicas.md)."""
    label = 'replicas' if report.what == 'data' else 'gradients'
    trained = _checked_phrase(report)
    devices = plural(len(report.contexts), 'device')
    if len(report.contexts) < 2:
        return '%s: %s on %s only, nothing to compare' % (label, trained, devices)
    if report.ok:
        head = '%s: %s identical on %s' % (label, trained, devices)
    else:
        worst = report.worst
        head = '%s: %d of %s differ on %s, worst %s%s by %s (%s vs %s)' % (
            label, len(report.mismatched), trained, devices, worst.name,
            ' (frozen)' if worst.kind == 'frozen' else '', _number(worst.max_abs_diff),
            worst.contexts[0], worst.worst_context)
        if report.what == 'grad':
            head += ' (%s)' % GRADIENT_WHY
    aux = report.auxiliary
    differ = sum(not p.identical for p in aux)
    count = plural(len(aux), 'BatchNorm statistic' if all(
        p.is_batchnorm_statistic for p in aux) else 'auxiliary state')
    if differ:
        return '%s; %s differ by at most %s (expected: %s)' % (
            head, count if differ == len(aux) else '%d of %s' % (differ, count),
            _number(report.auxiliary_max_abs_diff), AUXILIARY_WHY)
    return head + ('; %s identical' % count if aux else '')


def format_replica_report(report):
    """A table of the report, one row per parameter (name, shape, kind, largest absolute and
    relative difference from the first replica), then the summary line."""
    header = ('parameter', 'shape', 'kind', 'max abs diff', 'max rel diff')
    rows = [(p.name, str(p.shape), p.kind, _number(p.max_abs_diff), _number(p.max_rel_diff))
            for p in report.parameters]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    title = '%s of %s on %s, each compared with the first device' % (
        'values' if report.what == 'data' else 'gradients',
        plural(len(report.parameters), 'parameter'), format_devices(report.contexts))
    lines = [title] + ['  '.join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
                       for r in [header] + rows]
    return '\n'.join(lines + [format_replica_summary(report)])


def inspection_cells(devices, sigma, before_forward=None):
    """Run the chapter's inspection cells (its In [2] to In [5]) on ``devices``, as
    ``python -m gluon_mgpu.replicas`` and ``python -m gluon_mgpu.compare`` do.

    ResNet-18 initialized with ``Normal(sigma)`` on every device, ``before_forward(net)``, a
    random batch of 4 images (at least one per device) split with ``split_and_load``, one
    forward pass per device. Returns a dict of ``net``, ``x``, ``parts``, ``outputs`` (one per
    device) and ``weight`` (the first convolution's).
    """
    from mxnet import init, nd
    from mxnet.gluon import utils as gutils

    from ..model import resnet18
    net = resnet18(10)
    net.initialize(init=init.Normal(sigma=sigma), ctx=devices)
    if before_forward is not None:
        before_forward(net)
    x = nd.random.uniform(shape=(max(4, len(devices)), 1, 28, 28))
    parts = gutils.split_and_load(x, devices, even_split=False)
    outputs = [net(part) for part in parts]
    return {'net': net, 'x': x, 'parts': parts, 'outputs': outputs,
            'weight': net[0].params.get('weight')}
