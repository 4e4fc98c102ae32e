"""The epoch loop for a split network (``make_parallel``), with the events of ``train()``.

The same loop as ``gluon_mgpu.training.train``, around a split network's own
``train_batch(X, y)`` instead of the chapter's step, so that the command line's handlers (the
progress bar, the book's lines, the NaN stop, the metrics file, the plot, Ctrl-C) work for
every way of splitting. A split network returns only its loss, so ``train_acc`` is None.
"""
import time

from ..handlers.events import EpochLine, Events, LossGuard, TrainingState
from ..training import epoch_seconds

__all__ = ['train_split']


class _Rate:
    """What handlers read of a Trainer: the learning rate (a split has one Trainer per part)."""

    def __init__(self, lr):
        self.learning_rate = lr


def train_split(split, train_iter, test_iter, lr, num_epochs=4, event_handlers=None):
    """Train ``split`` for ``num_epochs`` epochs; print the book's line per epoch; return the
    history (as ``train()``'s, with ``train_acc`` None).

    ``event_handlers`` as in ``train()`` (default ``[EpochLine(), LossGuard()]``); they see the
    split network as ``estimator.net`` and ``lr`` as ``estimator.trainer.learning_rate``.
    """
    if hasattr(train_iter, 'set_min_batch'):
        train_iter.set_min_batch(len(split.devices))
    state = TrainingState(split, _Rate(lr), None, split.devices, train_iter, test_iter,
                          num_epochs)
    events = Events([EpochLine(), LossGuard()] if event_handlers is None else event_handlers,
                    state)
    events.train_begin()
    for epoch in range(state.epoch + 1, num_epochs + 1):
        state.epoch = epoch
        events.epoch_begin()
        losses, n, start = [], 0, time.time()
        for X, y in train_iter:
            events.batch_begin(batch=(X, y))
            loss = split.train_batch(X, y)  # the sum over the batch, on one device
            losses.append(loss)
            n += X.shape[0]
            if events.batch_end(batch=(X, y), loss=[loss]):
                break
        seconds = epoch_seconds(start, n)
        state.record = {'epoch': epoch, 'seconds': seconds,
                        'train_loss': sum(l.asscalar() for l in losses) / n, 'train_acc': None,
                        'test_acc': split.evaluate_accuracy(test_iter),
                        'images_per_sec': n / seconds}
        state.history.append(state.record)
        if events.epoch_end():
            break
    events.train_end()
    return state.history
