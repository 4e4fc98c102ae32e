"""The epochs of a split network (``make_parallel``): ``train()``'s epoch body
(``training.train_epoch``) around the split network's own ``train_batch(X, y, batch_size)``, so
that the command line's handlers work for every way of splitting (docs/three-ways.md).
"""
from types import SimpleNamespace

from ..handlers.events import EpochLine, Events, LossGuard, TrainingState
from ..training import check_batch_size, train_epoch

__all__ = ['train_split', 'split_step']


def split_step(split, X, y, loss, trainer, devices, split_f, batch_size):
    """The step of a split network, in ``train_batch``'s arguments: ``([loss_sum], None, None)``,
    the sum over the batch on one device (``loss``, ``trainer``, ``split_f`` are the split's)."""
    return [split.train_batch(X, y, batch_size)], None, None


def train_split(split, train_iter, test_iter, lr, num_epochs=4, event_handlers=None,
                batch_size=None):
    """Train ``split`` for ``num_epochs`` epochs; print the book's line per epoch; return the
    history (as ``train()``'s, with ``train_acc`` None: a split network returns only its loss).

    ``event_handlers`` as in ``train()`` (default ``[EpochLine(), LossGuard()]``); they see the
    split network as ``estimator.net`` and ``lr`` as ``estimator.trainer.learning_rate``.
    Every step divides by ``batch_size`` as ``train()`` does (default: the size of each epoch's
    first batch, the nominal one).
    """
    check_batch_size(batch_size)
    if hasattr(train_iter, 'set_min_batch'):
        train_iter.set_min_batch(len(split.devices))
    # What handlers read of a Trainer (a split has one per part): the learning rate.
    trainer = SimpleNamespace(learning_rate=lr)
    state = TrainingState(split, trainer, None, split.devices, train_iter, test_iter, num_epochs)
    events = Events([EpochLine(), LossGuard()] if event_handlers is None else event_handlers,
                    state)
    events.train_begin()
    for epoch in range(state.epoch + 1, num_epochs + 1):
        state.epoch = epoch
        events.epoch_begin()
        stats = train_epoch(split, train_iter, None, trainer, split.devices, None, events,
                            split_step, batch_size)
        state.end_epoch(stats, split.evaluate_accuracy(test_iter))
        if events.epoch_end():
            break
    events.train_end()
    return state.history
