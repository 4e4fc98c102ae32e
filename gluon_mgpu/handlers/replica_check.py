"""The event handlers of ``--check-replicas``: data parallelism's replicas compared while training
(``ReplicaCheck``, docs/replica-check.md), and where a split network's parameters live
(``PlacementCheck``, docs/three-ways.md).
"""
import numpy as np

from .events import PRIORITY, BatchEnd, EpochBegin, EpochEnd
from ..replicas import ReplicaMismatchError, assert_replicas_match, format_replica_summary
from ..replicas.placement import format_placement, inspect_placement
from ..runtime.checks import check_whole

__all__ = ['ReplicaCheck', 'ReplicaCheckFailed', 'PlacementCheck']


class ReplicaCheckFailed(RuntimeError):
    """``ReplicaCheck`` found trained parameters that differ; ``where`` says when, ``error``
    is the ``ReplicaMismatchError``."""

    def __init__(self, where, error):
        super().__init__('at %s, %s' % (where, error))
        self.where, self.error = where, error


class ReplicaCheck(EpochBegin, BatchEnd, EpochEnd):
    """Event handler: ``assert_replicas_match(net)`` after every ``every``-th step of an epoch
    and at its end (``ReplicaCheckFailed`` stops training). Each epoch's report is kept in
    ``reports`` and, with ``verbose``, its summary line printed. Works with ``Estimator.fit`` too.
    """

    priority = PRIORITY['ReplicaCheck']

    def __init__(self, every, verbose=True, stream=None):
        check_whole('every', every, 'for example every=10')
        self.every, self.verbose, self.stream = every, verbose, stream
        self.epoch = self.step = 0
        self.reports = []

    def _check(self, estimator, where):
        try:
            return assert_replicas_match(estimator.net)
        except ReplicaMismatchError as e:
            raise ReplicaCheckFailed(where, e) from None

    def epoch_begin(self, estimator, *args, **kwargs):
        self.epoch = getattr(estimator, 'epoch', self.epoch + 1)
        self.step = 0

    def batch_end(self, estimator, *args, **kwargs):
        self.step += 1
        if self.step % self.every == 0:
            self._check(estimator, 'epoch %d, step %d' % (self.epoch, self.step))

    def epoch_end(self, estimator, *args, **kwargs):
        report = self._check(estimator, 'the end of epoch %d' % self.epoch)
        self.reports.append(report)
        if self.verbose:
            print(format_replica_summary(report), file=self.stream, flush=True)


class PlacementCheck(EpochEnd):
    """Event handler for ``--check-replicas`` with ``--parallel``: after every epoch, one line.

    For the layer and channel splits, where the parameters live (``format_placement``'s device
    lines); for data parallelism from scratch, every device's copy compared with the first
    (``RuntimeError`` naming the first array that differs).
    """

    priority = PRIORITY['PlacementCheck']

    def __init__(self, verbose=True, stream=None):
        self.verbose, self.stream = verbose, stream
        self.lines = []

    def epoch_end(self, estimator, *args, **kwargs):
        split = estimator.net
        copies = getattr(split, 'device_params', None)
        if copies is not None:
            first = copies[0]
            for device, params in zip(split.devices[1:], copies[1:]):
                for i, (a, b) in enumerate(zip(first, params)):
                    if not np.array_equal(a.asnumpy(), b.asnumpy()):
                        raise RuntimeError('replicas differ after epoch %d: parameter %d on %s '
                                           'is not the one on %s' % (estimator.epoch, i, device,
                                                                     split.devices[0]))
            line = 'replicas: %d parameters identical on %d devices (data parallelism from ' \
                'scratch)' % (len(first), len(copies))
        else:
            text = format_placement(inspect_placement(split.net), per_parameter=False)
            line = 'placement: ' + '; '.join(text.splitlines())
        self.lines.append(line)
        if self.verbose:
            print(line, file=self.stream, flush=True)
