"""The epochs of a split network (``make_parallel``): ``training.train`` itself, whose step is
the split network's own ``step``, so that the command line's handlers work for every way of
splitting (docs/three-ways.md).
"""
from types import SimpleNamespace

from ..training import train

__all__ = ['train_split']


def train_split(split, train_iter, test_iter, lr, num_epochs=4, event_handlers=None,
                batch_size=None):
    """``train(split, ...)`` on ``split.devices``: print the book's line per epoch; return the
    history (``train_acc`` None: a split network returns only its loss).

    ``event_handlers`` as in ``train()``; they see the split network as ``estimator.net`` and
    ``lr`` as ``estimator.trainer.learning_rate`` (a split has one Trainer per part, or none).
    """
    return train(split, train_iter, test_iter, split.devices, num_epochs,
                 SimpleNamespace(learning_rate=lr), event_handlers, batch_size=batch_size)
