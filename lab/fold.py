"""Inference copies of the chapter's networks: BatchNorm folded into the convolutions, for
prediction only (docs/speed.md, "BatchNorm folded into the convolutions"). Used by worker.py's
``eval-1-fold`` rows; tests/test_inference.py checks it.
"""
import numpy as np
from mxnet import autograd, gluon, init, nd
from mxnet.gluon import nn
from mxnet.gluon.nn.basic_layers import _BatchNorm

from gluon_mgpu import Residual

__all__ = ['fold_batchnorm', 'FoldedResidual', 'FOLD_ATOL', 'FOLD_RTOL']

# The folded network against the original in predict mode, float32 (tests/test_inference.py):
# the chapter's ResNet-18 after a few steps of training differed by at most 2.4e-7 on outputs
# of size up to 1.2 (3e-8 on outputs up to 0.13), 40 times inside these.
FOLD_RTOL = 1e-5
FOLD_ATOL = 1e-6

_KNOWN = ('HybridSequential, gluon_mgpu.model.Residual, Conv2D (NCHW, optionally followed by '
          'BatchNorm over axis 1), Dense, Activation, MaxPool2D, AvgPool2D, GlobalAvgPool2D, '
          'GlobalMaxPool2D, Flatten')


class FoldedResidual(nn.HybridBlock):
    """``Residual`` for inference: each convolution carries the BatchNorm that followed it.

    Made by ``fold_batchnorm``; its parameters are set there. The forward pass is
    ``Residual``'s without ``bn1`` and ``bn2``.

    Parameters
    ----------
    residual : gluon_mgpu.model.Residual
        The block to copy the shapes of (not its values, not its parameters).
    """

    def __init__(self, residual, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv1 = _conv_like(residual.conv1, use_bias=True)
            self.conv2 = _conv_like(residual.conv2, use_bias=True)
            self.conv3 = _conv_like(residual.conv3) if residual.conv3 else None

    def hybrid_forward(self, F, X):
        Y = F.Activation(self.conv1(X), act_type='relu')  # as Residual computes its ReLUs
        Y = self.conv2(Y)
        if self.conv3:
            X = self.conv3(X)
        return F.Activation(Y + X, act_type='relu')


def fold_batchnorm(net, hybridize=True):
    """Return a new inference-only network: ``net`` with BatchNorm folded into the convolutions.

    Each ``Conv2D`` followed by a ``BatchNorm`` (in a ``HybridSequential``, and ``conv1 -> bn1``,
    ``conv2 -> bn2`` in a ``Residual``) becomes one ``Conv2D`` with a bias, using BatchNorm's
    running statistics, ``eps`` and (unless ``scale=False``, i.e. ``fix_gamma``) ``gamma``.
    Every other layer is copied. The copy lives on every context ``net`` was initialized on,
    and on each one it is folded from that context's replica: with plain BatchNorm every
    device keeps its own running statistics, so replicas may differ.

    The copy shares no parameter, array or block with ``net``: ``net`` is only read, and can
    be trained further; the copy does not follow it (fold again after training).

    Parameters
    ----------
    net : mxnet.gluon.HybridBlock
        A chapter network (``gluon_mgpu.resnet18``, ``training.new_network('resnet18')`` or
        ``('lenet')``), initialized and run on at least one batch, so that its shapes are known.
    hybridize : bool, default True
        Hybridize the copy (``static_alloc=True``) before returning it.

    Returns
    -------
    mxnet.gluon.HybridBlock
        Of ``net``'s structure (a ``HybridSequential`` for a ``HybridSequential``, a
        ``FoldedResidual`` for each ``Residual``), without BatchNorm layers and with
        ``grad_req='null'`` everywhere. In predict mode its outputs equal ``net``'s within
        ``rtol=FOLD_RTOL, atol=FOLD_ATOL`` (float32).

    Raises
    ------
    ValueError
        A block this function does not know how to fold (the message names it); a BatchNorm
        that does not follow a convolution; parameters that are not float32.
    RuntimeError
        ``net`` is not initialized, or has not seen a batch yet; or its parameters are not
        all on the same contexts.

    Notes
    -----
    lab/run.py measures evaluation through the copy (``eval-1-fold``), and through the
    copy partitioned by MXNet's MKLDNN backend (``eval-1-fold-mkldnn``: ReLU and the residual
    sum fused into the convolutions; CPU only), against ``net`` itself (``eval-1``).
    """
    contexts = _contexts(net)
    folded, writers = _fold(net, 'net')
    folded.collect_params().setattr('grad_req', 'null')
    folded.initialize(init.Zero(), ctx=contexts)
    with autograd.pause():
        for param, value in writers:
            for ctx in contexts:
                param.data(ctx)[:] = value(ctx)
    if hybridize:
        folded.hybridize(static_alloc=True)
    return folded


def _contexts(net):
    """The contexts all of ``net``'s parameters live on; RuntimeError if they are not set."""
    if not isinstance(net, gluon.HybridBlock):
        raise ValueError('fold_batchnorm needs a HybridBlock (such as gluon_mgpu.resnet18(10)), '
                         'got %r; build the network from HybridBlocks' % (type(net).__name__,))
    params = list(net.collect_params().values())
    if not params:
        raise ValueError('network %r has no parameters: there is nothing to fold; pass a '
                         'trained network such as gluon_mgpu.resnet18(10)' % (net.name,))
    for p in params:
        try:
            p.list_data()
        except gluon.parameter.DeferredInitializationError:
            raise RuntimeError(
                'cannot fold network %r: parameter %r has no shape yet (initialization is '
                'deferred to the first batch); pass one batch through the network first'
                % (net.name, p.name)) from None
        except RuntimeError:
            raise RuntimeError(
                'cannot fold network %r: parameter %r is not initialized; call '
                'net.initialize(ctx=devices) and train it, or load trained parameters'
                % (net.name, p.name)) from None
        if np.dtype(p.dtype) != np.float32:
            raise ValueError('cannot fold parameter %r of dtype %s: fold_batchnorm works in '
                             'float32; call net.cast("float32") first' % (p.name, p.dtype))
        if p.list_ctx() != params[0].list_ctx():
            raise RuntimeError('cannot fold network %r: parameter %r lives on %s, others on %s; '
                               'call net.collect_params().reset_ctx(devices)'
                               % (net.name, p.name, p.list_ctx(), params[0].list_ctx()))
    return params[0].list_ctx()


def _unknown(block, path, why=''):
    return ValueError('fold_batchnorm cannot fold block %s (%r, %s.%s)%s; it knows %s. Evaluate '
                      'this network unfolded, or build it from those blocks (gluon_mgpu.resnet18)'
                      % (path, block.name, type(block).__module__, type(block).__name__, why,
                         _KNOWN))


def _fold(block, path):
    """A new block computing ``block`` in predict mode, and how to fill its parameters.

    Returns ``(new_block, writers)``: ``writers`` lists ``(parameter of new_block,
    value(ctx) -> NDArray)``.
    """
    if type(block) is nn.HybridSequential:
        new, writers = nn.HybridSequential(), []
        children = [block[i] for i in range(len(block))]
        i = 0
        while i < len(children):
            child, child_path = children[i], '%s[%d]' % (path, i)
            if isinstance(child, _BatchNorm):
                raise _unknown(child, child_path, ': a BatchNorm that does not directly follow '
                               'a Conv2D has no convolution to fold into')
            nxt = children[i + 1] if i + 1 < len(children) else None
            if type(child) is nn.Conv2D and isinstance(nxt, _BatchNorm):
                conv = _conv_like(child, use_bias=True)
                w = _conv_writers(conv, child, nxt, child_path, '%s[%d]' % (path, i + 1))
                i += 2
            else:
                conv, w = _fold(child, child_path)
                i += 1
            new.add(conv)
            writers += w
        return new, writers
    if type(block) is Residual:
        new = FoldedResidual(block)
        writers = (_conv_writers(new.conv1, block.conv1, block.bn1, path + '.conv1', path + '.bn1')
                   + _conv_writers(new.conv2, block.conv2, block.bn2, path + '.conv2',
                                   path + '.bn2'))
        if block.conv3:
            writers += _copy_writers(new.conv3, block.conv3)
        return new, writers
    if type(block) is nn.Conv2D:
        _check_conv(block, path)
        new = _conv_like(block)
        return new, _copy_writers(new, block)
    if type(block) is nn.Dense:
        new = nn.Dense(block._units, activation=_act_type(block), use_bias=block.bias is not None,
                       flatten=block._flatten, in_units=block.weight.shape[1])
        return new, _copy_writers(new, block)
    if type(block) is nn.Activation:
        return nn.Activation(block._act_type), []
    if type(block) in (nn.GlobalAvgPool2D, nn.GlobalMaxPool2D):
        return type(block)(layout=block._kwargs['layout']), []
    if type(block) in (nn.MaxPool2D, nn.AvgPool2D):
        k = block._kwargs
        extra = ({'count_include_pad': k['count_include_pad']} if 'count_include_pad' in k
                 else {})
        return type(block)(pool_size=k['kernel'], strides=k['stride'], padding=k['pad'],
                           ceil_mode=k['pooling_convention'] == 'full', layout=k['layout'],
                           **extra), []
    if type(block) is nn.Flatten:
        return nn.Flatten(), []
    raise _unknown(block, path)


def _act_type(block):
    return block.act._act_type if block.act is not None else None


def _check_conv(conv, path):
    if conv._kwargs['layout'] != 'NCHW':
        raise _unknown(conv, path, ': layout %r, not NCHW' % (conv._kwargs['layout'],))


def _conv_like(conv, use_bias=None):
    """A new ``Conv2D`` of ``conv``'s shape and hyper-parameters (``in_channels`` known)."""
    k = conv._kwargs
    return nn.Conv2D(conv._channels, kernel_size=k['kernel'], strides=k['stride'],
                     padding=k['pad'], dilation=k['dilate'], groups=k['num_group'],
                     layout=k['layout'], in_channels=conv.weight.shape[1] * k['num_group'],
                     activation=_act_type(conv),
                     use_bias=conv.bias is not None if use_bias is None else use_bias)


def _conv_writers(new, conv, bn, conv_path, bn_path):
    """Writers setting ``new`` (a Conv2D with bias) to ``conv`` followed by ``bn``, folded."""
    if type(conv) is not nn.Conv2D:
        raise _unknown(conv, conv_path)
    _check_conv(conv, conv_path)
    if conv.act is not None:
        raise _unknown(conv, conv_path, ': its activation %r comes before the BatchNorm, so '
                       'the two are not one affine map' % (conv.act._act_type,))
    if not isinstance(bn, _BatchNorm):
        raise _unknown(bn, bn_path, ': expected a BatchNorm after %s' % (conv_path,))
    if bn._kwargs.get('axis', 1) != 1 or getattr(bn, 'fuse_relu', False):
        raise _unknown(bn, bn_path, ': only BatchNorm over axis 1 without fused ReLU folds')
    eps = bn._kwargs['eps']
    fix_gamma = bn._kwargs.get('fix_gamma', False)

    def scale(ctx):
        # float64 for the fold itself: the only rounding left is the final cast to float32.
        var = bn.running_var.data(ctx).astype('float64')
        gamma = (nd.ones_like(var) if fix_gamma else bn.gamma.data(ctx).astype('float64'))
        return gamma / nd.sqrt(var + eps)

    def weight(ctx):
        w = conv.weight.data(ctx).astype('float64')
        return (w * scale(ctx).reshape((-1, 1, 1, 1))).astype('float32')

    def bias(ctx):
        mean = bn.running_mean.data(ctx).astype('float64')
        b = (conv.bias.data(ctx).astype('float64') if conv.bias is not None
             else nd.zeros_like(mean))
        return ((b - mean) * scale(ctx) + bn.beta.data(ctx).astype('float64')).astype('float32')

    return [(new.weight, weight), (new.bias, bias)]


def _copy_writers(new, old):
    """Writers copying ``old``'s weight and bias into ``new`` (same shapes)."""
    writers = [(new.weight, lambda ctx: old.weight.data(ctx))]
    if old.bias is not None:
        writers.append((new.bias, lambda ctx: old.bias.data(ctx)))
    return writers
