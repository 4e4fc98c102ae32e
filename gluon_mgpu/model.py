"""The chapter's network: the residual block and the small-image ResNet-18, as ``HybridBlock``s
that run line by line as the book does or, hybridized, as one graph (docs/speed.md).
"""
import functools

from mxnet.gluon import nn

from .runtime.checks import check_whole

__all__ = ['Residual', 'resnet_block', 'resnet18', 'sync_batch_norm', 'lenet', 'network_name']


class Residual(nn.HybridBlock):
    """A residual block: two 3x3 convolutions with BatchNorm, plus a shortcut; its children
    come in ``d2lzh.Residual``'s order, so weights copy one to one.

    Parameters
    ----------
    num_channels : int
        Output channels of both convolutions (and of the 1x1 shortcut).
    use_1x1conv : bool, default False
        A 1x1 convolution on the shortcut, for a change of channels or resolution.
    strides : int, default 1
        Stride of the first 3x3 convolution and of the shortcut.
    norm_layer : callable, optional
        Makes each normalization layer; default ``nn.BatchNorm`` (``sync_batch_norm(n)``).
    """

    def __init__(self, num_channels, use_1x1conv=False, strides=1, norm_layer=None, **kwargs):
        super().__init__(**kwargs)
        check_whole('num_channels', num_channels, 'for example Residual(64)')
        norm_layer = nn.BatchNorm if norm_layer is None else norm_layer
        with self.name_scope():
            self.conv1 = nn.Conv2D(num_channels, kernel_size=3, padding=1,
                                   strides=strides)
            self.conv2 = nn.Conv2D(num_channels, kernel_size=3, padding=1)
            if use_1x1conv:
                self.conv3 = nn.Conv2D(num_channels, kernel_size=1,
                                       strides=strides)
            else:
                self.conv3 = None
            self.bn1 = norm_layer()
            self.bn2 = norm_layer()

    def hybrid_forward(self, F, X):
        Y = relu(F, self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return relu(F, Y + X)


def relu(F, x):
    """The book's ``F.relu(x)`` as ``F.Activation(x, act_type='relu')``, which MXNet runs in
    oneDNN on CPU: faster, the same values (docs/speed.md)."""
    return F.Activation(x, act_type='relu')


def resnet_block(num_channels, num_residuals, first_block=False, norm_layer=None):
    """A stage of ``num_residuals`` residual blocks; all but the first halve the resolution."""
    blk = nn.HybridSequential()
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blk.add(Residual(num_channels, use_1x1conv=True, strides=2, norm_layer=norm_layer))
        else:
            blk.add(Residual(num_channels, norm_layer=norm_layer))
    return blk


def resnet18(num_classes, norm_layer=None):
    """The chapter's ResNet-18 for 28x28 images, uninitialized: a 3x3 stride-1 stem without
    max-pooling, four stages of two residual blocks, global average pooling and a dense layer
    of ``num_classes`` outputs. ``norm_layer`` as in ``Residual``."""
    check_whole('num_classes', num_classes, "for example resnet18(10), Fashion-MNIST's classes")
    norm_layer = nn.BatchNorm if norm_layer is None else norm_layer
    net = nn.HybridSequential()
    net.add(nn.Conv2D(64, kernel_size=3, strides=1, padding=1),
            norm_layer(), nn.Activation('relu'))
    net.add(resnet_block(64, 2, first_block=True, norm_layer=norm_layer),
            resnet_block(128, 2, norm_layer=norm_layer),
            resnet_block(256, 2, norm_layer=norm_layer),
            resnet_block(512, 2, norm_layer=norm_layer))
    net.add(nn.GlobalAvgPool2D(), nn.Dense(num_classes))
    return net


def sync_batch_norm(num_devices):
    """Return a ``norm_layer`` making ``SyncBatchNorm`` layers synchronized over ``num_devices``,
    the number of devices the batch is split over: each layer waits for that many
    (docs/devices.md)."""
    from mxnet.gluon.contrib.nn import SyncBatchNorm
    check_whole('num_devices', num_devices, 'pass the number of devices the batch is split over')
    return functools.partial(SyncBatchNorm, num_devices=num_devices)


def lenet(num_classes=10):
    """The book's LeNet (sigmoid, max-pooling): without BatchNorm, its gradient does not depend
    on how a batch is split, so the checks that compare splits use it."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(channels=6, kernel_size=5, activation='sigmoid'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=16, kernel_size=5, activation='sigmoid'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Dense(120, activation='sigmoid'),
            nn.Dense(84, activation='sigmoid'),
            nn.Dense(num_classes))
    return net


def network_name(model='resnet18', sync_bn_devices=None):
    """How checkpoints name a network: ``resnet18(10)``, ``lenet(10)``, or with SyncBatchNorm."""
    if model == 'resnet18' and sync_bn_devices:
        return 'resnet18(10, norm_layer=sync_batch_norm(%d))' % sync_bn_devices
    return '%s(10)' % model
