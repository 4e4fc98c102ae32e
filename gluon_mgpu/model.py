"""The chapter's network: the residual block and the small-image ResNet-18, as ``HybridBlock``s
that run line by line as the book does or, hybridized, as one graph (docs/speed.md).
"""
import functools

from mxnet.gluon import nn

__all__ = ['Residual', 'resnet_block', 'resnet18', 'sync_batch_norm', 'lenet']


class Residual(nn.HybridBlock):
    """A residual block: two 3x3 convolutions with BatchNorm, plus a shortcut.

    Parameters
    ----------
    num_channels : int
        Output channels of both convolutions (and of the 1x1 shortcut).
    use_1x1conv : bool, default False
        Pass the input through a 1x1 convolution before adding it, so that the shortcut
        matches a change of channels or of resolution.
    strides : int, default 1
        Stride of the first 3x3 convolution and of the 1x1 shortcut; 2 halves height and width.
    norm_layer : callable, optional
        Called with no arguments to make each normalization layer; default ``nn.BatchNorm``
        (the book's). ``sync_batch_norm(n)`` gives BatchNorm synchronized over ``n`` devices.

    Notes
    -----
    The children are created in the same order as ``d2lzh.Residual`` (conv1, conv2,
    conv3, bn1, bn2), so ``collect_params()`` lists parameters in the same order and
    weights can be copied between the two one to one.
    """

    def __init__(self, num_channels, use_1x1conv=False, strides=1, norm_layer=None, **kwargs):
        super().__init__(**kwargs)
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
    """The book's ``F.relu(x)``, computed as ``F.Activation(x, act_type='relu')``.

    Both give max(x, 0). On CPU, MXNet 1.9 runs ``Activation`` with oneDNN (MKLDNN) on the
    blocked layout the convolutions produce, while ``relu`` is a plain elementwise operator that
    needs the data reordered to NCHW and back around it: the same network trains 1.22x faster
    (docs/candidates.md, group relu) and its outputs stay within 1e-6 of ``d2lzh.Residual``'s.
    """
    return F.Activation(x, act_type='relu')


def resnet_block(num_channels, num_residuals, first_block=False, norm_layer=None):
    """A stage of ``num_residuals`` residual blocks; all but the first stage halve the resolution."""
    blk = nn.HybridSequential()
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blk.add(Residual(num_channels, use_1x1conv=True, strides=2, norm_layer=norm_layer))
        else:
            blk.add(Residual(num_channels, norm_layer=norm_layer))
    return blk


def resnet18(num_classes, norm_layer=None):
    """The chapter's ResNet-18 for 28x28 Fashion-MNIST images.

    Unlike the ImageNet ResNet-18 the stem is a 3x3 convolution with stride 1 and padding 1,
    and there is no max-pooling: the images are small, so the network keeps their resolution.
    Four stages of two residual blocks follow (64, 128, 256, 512 channels), then global
    average pooling and a dense layer with ``num_classes`` outputs.

    Parameters
    ----------
    num_classes : int
        Number of output classes (10 for Fashion-MNIST).
    norm_layer : callable, optional
        Makes each normalization layer; default ``nn.BatchNorm``, as the book. Pass
        ``sync_batch_norm(len(devices))`` for statistics over the whole batch of all devices.

    Returns
    -------
    mxnet.gluon.nn.HybridSequential
        Uninitialized; call ``net.initialize(..., ctx=devices)`` and pass one batch, since
        input shapes (and so parameter shapes) are inferred at the first forward pass.
    """
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
    """Return a ``norm_layer`` making ``SyncBatchNorm`` layers synchronized over ``num_devices``.

    Plain BatchNorm normalizes each device's slice with that slice's statistics, and keeps
    running statistics per device; ``mxnet.gluon.contrib.nn.SyncBatchNorm`` uses the mean and
    variance of the whole batch over all devices of one process, so every device ends with
    the same running statistics. ``num_devices`` must equal the number of devices the batch is
    split over: each layer waits until that many devices have reached it.

    Each layer blocks MXNet's engine thread of its device until all have arrived, holding a
    scratch buffer. Issued from one thread, CPU contexts share one pool of scratch buffers in
    MXNet 1.9.1 and deadlock (the book's ``train_batch`` refuses that in one line); ``train()``
    issues each CPU device's calls from its own thread (``runtime.dispatch.train_batch``), which
    gives each its own pool, and then it runs on CPU contexts too (docs/devices.md).
    """
    from mxnet.gluon.contrib.nn import SyncBatchNorm
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError('num_devices must be a whole number >= 1, got %r; pass the number of '
                         'devices the batch is split over' % (num_devices,))
    return functools.partial(SyncBatchNorm, num_devices=num_devices)


def lenet(num_classes=10):
    """The book's LeNet (sigmoid activations, max-pooling): a small network without BatchNorm.

    Its gradient is a plain sum over the examples, so it does not depend on how a batch is
    split over devices or workers: the checks that compare such splits use it.
    """
    net = nn.HybridSequential()
    net.add(nn.Conv2D(channels=6, kernel_size=5, activation='sigmoid'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Conv2D(channels=16, kernel_size=5, activation='sigmoid'),
            nn.MaxPool2D(pool_size=2, strides=2),
            nn.Dense(120, activation='sigmoid'),
            nn.Dense(84, activation='sigmoid'),
            nn.Dense(num_classes))
    return net
