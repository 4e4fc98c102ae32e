"""The epochs of a split network (``make_parallel``): ``train()``'s loop around the split
network's own ``train_batch(X, y)``, so that the command line's handlers work for every way of
splitting (docs/three-ways.md).
"""
from types import SimpleNamespace

from ..handlers.events import EpochLine, Events, LossGuard, TrainingState
from ..training import check_batch_size, run_epoch, run_epochs

__all__ = ['train_split']


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

    def step(X, y):
        nonlocal batch_size
        if batch_size is None:
            batch_size = X.shape[0]
        # The sum over the batch, on one device.
        return [split.train_batch(X, y, batch_size)], None, None

    return run_epochs(state, events, lambda: run_epoch(step, train_iter, events),
                      lambda: split.evaluate_accuracy(test_iter))
