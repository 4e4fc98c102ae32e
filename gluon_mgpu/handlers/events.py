"""The events ``train()`` calls, named as ``gluon.contrib.estimator`` names them, the run that
handlers see (``TrainingState``), and the handlers of the book's line, the loss check and the
learning-rate warmup (docs/events.md).
"""
import functools
import math

from ..runtime.checks import check_whole

from mxnet.gluon.contrib.estimator.event_handler import (BatchBegin, BatchEnd, EpochBegin,
                                                         EpochEnd, TrainBegin, TrainEnd)

__all__ = ['STEP', 'OLD_STEP', 'TrainBegin', 'TrainEnd', 'EpochBegin', 'EpochEnd', 'BatchBegin',
           'BatchEnd', 'TrainingState', 'Events', 'EpochLine', 'LossGuard', 'LossNotFiniteError',
           'LinearWarmup', 'format_epoch', 'PRIORITY']

# The update every epoch loop of the package makes, as the chapter's: the gradients' sum divided
# by the nominal batch size, also for an epoch's short last batch. Checkpoints and the book
# table's record name it; up to commit 03b47ec the loop divided by each batch's own size.
STEP = 'trainer.step(batch_size)'
OLD_STEP = 'trainer.step(X.shape[0])'

_KINDS = (('train_begin', TrainBegin), ('epoch_begin', EpochBegin),
          ('batch_begin', BatchBegin), ('batch_end', BatchEnd), ('epoch_end', EpochEnd),
          ('train_end', TrainEnd))


# When each handler runs, in ascending order (``Estimator``'s ``priority``; 0 for the others):
# the NaN stop first, then the checkpoint, so a later handler's crash cannot lose the epoch.
PRIORITY = {'LossGuard': -200, 'CheckpointHandler': -100, 'ReplicaCheck': 10,
            'PlacementCheck': 10, 'MetricsFile': 20, 'PlotHandler': 30,
            'DeferredInterrupt': float('inf')}


def format_epoch(record):
    """The book's per-epoch line: ``epoch 1, training time: 63.5 sec, test_acc 0.86``;
    ``ValueError`` for what is not an epoch record."""
    try:
        return 'epoch %d, training time: %.1f sec, test_acc %.2f' % (
            record['epoch'], record['seconds'], record['test_acc'])
    except (KeyError, TypeError, ValueError):
        raise ValueError("format_epoch takes an epoch record of train()'s history, with numbers "
                         'epoch, seconds and test_acc; got %s; pass one, such as history[-1]'
                         % repr(record)[:80]) from None


class TrainingState:
    """What handlers see of a run of ``train()`` (the ``estimator`` argument of every event).

    ``net``, ``trainer``, ``loss`` and ``context`` (also ``devices``) as ``Estimator`` names
    them; ``train_iter``, ``test_iter``, ``num_epochs``; ``epoch``, the one under way (from 1;
    0 before the first); ``history``, one record per finished epoch, the last is ``record``.
    """

    def __init__(self, net, trainer, loss, devices, train_iter, test_iter, num_epochs):
        self.net, self.trainer, self.loss = net, trainer, loss
        self.context = self.devices = devices
        self.train_iter, self.test_iter = train_iter, test_iter
        self.num_epochs, self.epoch, self.history, self.record = num_epochs, 0, [], None

    def end_epoch(self, stats, test_acc):
        """Record the epoch under way: ``train_epoch``'s ``stats`` and ``test_acc``."""
        self.record = {'epoch': self.epoch, 'seconds': stats['seconds'],
                       'train_loss': stats['train_loss'], 'train_acc': stats['train_acc'],
                       'test_acc': test_acc,
                       'images_per_sec': stats['examples'] / stats['seconds']}
        self.history.append(self.record)

    def resume(self, epochs_done, history):
        """Continue after ``epochs_done`` finished epochs whose records are ``history`` (from a
        ``train_begin`` handler); ``train_iter.set_epoch``, if any, restores the data order."""
        self.epoch = epochs_done
        self.history = list(history)
        self.record = self.history[-1] if self.history else None
        if hasattr(self.train_iter, 'set_epoch'):
            self.train_iter.set_epoch(epochs_done)


class Events:
    """Calls every handler that has a method for an event, in ascending ``priority``; the
    events that may stop training (``batch_end``, ``epoch_end``) return whether one asked to."""

    def __init__(self, handlers, state):
        handlers = sorted(handlers, key=lambda h: getattr(h, 'priority', 0))
        for h in handlers:
            if not any(isinstance(h, kind) for _, kind in _KINDS):
                raise ValueError('event handler %r subclasses none of TrainBegin, EpochBegin, '
                                 'BatchBegin, BatchEnd, EpochEnd, TrainEnd; subclass the ones '
                                 'whose methods it defines' % (h,))
        self.state = state
        self._handlers = {name: [h for h in handlers if isinstance(h, kind)]
                          for name, kind in _KINDS}

    def _call(self, name, **kwargs):
        # Every handler runs, even after one asked to stop (as in Estimator.fit).
        return any([getattr(h, name)(self.state, **kwargs) for h in self._handlers[name]])

    train_begin = functools.partialmethod(_call, 'train_begin')
    epoch_begin = functools.partialmethod(_call, 'epoch_begin')
    batch_begin = functools.partialmethod(_call, 'batch_begin')
    batch_end = functools.partialmethod(_call, 'batch_end')
    epoch_end = functools.partialmethod(_call, 'epoch_end')
    train_end = functools.partialmethod(_call, 'train_end')


class EpochLine(EpochEnd):
    """Print the book's line after every epoch (what ``train()`` does by default)."""

    def __init__(self, stream=None):
        self.stream = stream

    def epoch_end(self, estimator, *args, **kwargs):
        print(format_epoch(estimator.record), file=self.stream, flush=True)


class LossNotFiniteError(RuntimeError):
    """The training loss became NaN or infinite: training diverged.

    Attributes ``epoch`` (None when not known), ``step`` (both from 1), ``lr`` (the learning
    rate in use) and ``loss`` (the step's loss sum, ``nan`` or ``inf``).
    """

    def __init__(self, step, lr, loss, epoch=None):
        super().__init__(step, lr, loss, epoch)
        self.step, self.lr, self.loss, self.epoch = step, lr, loss, epoch

    def __str__(self):
        where = 'step %d' % self.step if self.epoch is None else 'epoch %d, step %d' % (
            self.epoch, self.step)
        return ('the training loss became %s at %s with learning rate %g: training diverged; '
                'use a smaller learning rate' % (self.loss, where, self.lr))


class LossGuard(EpochBegin, BatchEnd, EpochEnd):
    """Stop with ``LossNotFiniteError`` once a step's loss is NaN or infinite.

    Step ``s`` is checked once step ``s + 1`` is queued, so reading the loss costs no waiting;
    the epoch's last step is checked at its end.
    """

    priority = PRIORITY['LossGuard']
    step, pending = 0, None

    def epoch_begin(self, estimator, *args, **kwargs):
        self.step, self.pending = 0, None

    def _check(self, estimator, then):
        # Count a step, check the one before (its loss pending), and keep ``then`` pending.
        self.step += 1
        if self.pending is not None:
            loss = sum(float(l.sum().asscalar()) for l in self.pending)
            if not math.isfinite(loss):
                raise LossNotFiniteError(self.step - 1, estimator.trainer.learning_rate, loss,
                                         getattr(estimator, 'epoch', None) or None)
        self.pending = then

    def batch_end(self, estimator, *args, **kwargs):
        self._check(estimator, kwargs['loss'])

    def epoch_end(self, estimator, *args, **kwargs):
        self._check(estimator, None)


class LinearWarmup(TrainBegin, EpochBegin, BatchBegin):
    """Raise the learning rate linearly over the first ``steps`` steps, then keep it.

    Step ``s`` of the run (from 1) trains at ``lr * min(s, steps) / steps``: Goyal et al.'s
    gradual warmup (2017). ``lr`` defaults to the trainer's rate when training begins. A
    resumed run continues the ramp from ``(epoch - 1) * len(train_iter)``.
    """

    def __init__(self, steps, lr=None):
        check_whole('steps', steps, 'for example LinearWarmup(100)')
        self.steps, self.lr = steps, lr
        self.step = 0

    def train_begin(self, estimator, *args, **kwargs):
        if self.lr is None:
            self.lr = estimator.trainer.learning_rate

    def epoch_begin(self, estimator, *args, **kwargs):
        done = estimator.epoch - 1
        if done and self.step == 0:  # a resumed run: where the ramp stood
            try:
                self.step = done * len(estimator.train_iter)
            except TypeError:
                raise ValueError('a run resumed after epoch %d cannot continue its warmup: '
                                 'train_iter has no len(); pass an iterator with a length, '
                                 'such as load_data_fashion_mnist\'s' % done) from None

    def batch_begin(self, estimator, *args, **kwargs):
        self.step += 1
        if self.step <= self.steps + 1:
            estimator.trainer.set_learning_rate(self.lr * min(self.step, self.steps) / self.steps)
