"""BatchNorm statistics and test accuracy: three ways to normalize at test time (each device's
running statistics, re-estimated ones, batch statistics), diagnostics beside the book's measure.
docs/notebooks.md ("The diagnosis") explains them.
"""
from mxnet import autograd, nd
from mxnet.gluon import nn

from ..training import evaluate_accuracy

__all__ = ['batch_norm_layers', 'reestimate_running_stats', 'evaluate_with_batch_stats']


def batch_norm_layers(net):
    """Every ``nn.BatchNorm`` inside ``net``, in order (17 in the chapter's ResNet-18)."""
    found = [net] if isinstance(net, nn.BatchNorm) else []
    for child in net._children.values():
        found += batch_norm_layers(child)
    return found


def reestimate_running_stats(net, X, device):
    """Set every BatchNorm's running statistics on ``device`` to those of the batch ``X``.

    One forward and backward pass in training mode with momentum 0, so that MXNet's own update
    writes the batch's mean and (biased) variance; no weight changes, and the other devices'
    copies stay.

    Parameters
    ----------
    net : mxnet.gluon.Block
        Initialized on ``device``, not hybridized (a hybridized graph holds its own momentum).
    X : mxnet.nd.NDArray
        A batch of training images.
    device : mxnet.Context

    Raises
    ------
    ValueError
        If ``net`` is hybridized or holds no BatchNorm.
    """
    if getattr(net, '_active', False):
        raise ValueError('%s is hybridized, so its BatchNorm momentum cannot change; pass a '
                         'network that is not (new_network(..., hybridize=False)) and '
                         'hybridize it afterwards' % type(net).__name__)
    layers = batch_norm_layers(net)
    if not layers:
        raise ValueError('%s holds no nn.BatchNorm, so there are no running statistics to '
                         're-estimate' % type(net).__name__)
    saved = [layer._kwargs['momentum'] for layer in layers]
    try:
        for layer in layers:
            layer._kwargs['momentum'] = 0.0
        with autograd.record():
            out = net(X.as_in_context(device))
        out.backward()
        nd.waitall()
    finally:
        for layer, momentum in zip(layers, saved):
            layer._kwargs['momentum'] = momentum


def evaluate_with_batch_stats(data_iter, net, device):
    """Accuracy of ``net`` on ``data_iter`` with BatchNorm normalizing by each batch's own
    statistics (training mode, no gradients), on one ``device``.

    The result depends on the batch size: the issue's and docs' numbers use batches of 500.
    Running statistics may change on ``device`` (MXNet updates them in training mode), so use
    a copy of the network that is not needed afterwards.
    """
    def in_train_mode(X):
        with autograd.train_mode():
            return net(X)

    return evaluate_accuracy(data_iter, in_train_mode, [device])
