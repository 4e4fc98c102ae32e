"""The chapter's ResNet-18 with BatchNorm+ReLU as one operator, and the fence that makes it safe.

A benchmark-only candidate (benchmarks/candidates.py, group ``bnrelu``; docs/bn-relu-race.md).

``nn.BatchNormReLU`` runs MXNet 1.9.1's ``_contrib_BatchNormWithReLU``. Its backward operator
(oneDNN) updates ``running_mean`` and ``running_var`` in place, as ``_backward_BatchNorm`` does,
but unlike that one it does not declare them as written (no ``FMutateInputs``): the engine sees
the update as a read. An operator that writes them afterwards (the next forward pass, in
training or predict mode) still waits for it, but a reader does not: ``asnumpy()``,
``nd.save``, ``save_parameters`` (whose copies to the CPU are readers), a ``copyto`` can see the
statistics before the update, or half-way through it.

``fence(net)``, called after ``backward()``, pushes for every fused layer and device an
operator that reads the gradient of ``gamma`` (written by that backward operator, so it runs
after it) and writes the running statistics (an identity onto themselves): every later reader
then waits for it, as for ``_backward_BatchNorm``.
"""
import contextlib

from mxnet import nd
from mxnet.gluon import nn

from gluon_mgpu import model


class FusedResidual(model.Residual):
    """``model.Residual`` whose first BatchNorm also applies the ReLU (one oneDNN operator).

    The layers are the same ``nn.BatchNorm`` blocks, created in the same order, so parameter
    names (``residual0_batchnorm0_gamma``) and their order are those of ``model.Residual``
    and ``d2lzh.Residual``: checkpoints load either way.
    """

    def __init__(self, num_channels, use_1x1conv=False, strides=1, norm_layer=None, **kwargs):
        super().__init__(num_channels, use_1x1conv, strides, norm_layer, **kwargs)
        self.bn1.fuse_relu = True  # what nn.BatchNormReLU sets: _contrib_BatchNormWithReLU

    def _alias(self):
        return 'residual'  # the prefix of model.Residual: residual0_, residual1_, ...

    def hybrid_forward(self, F, X):
        Y = self.bn2(self.conv2(self.bn1(self.conv1(X))))  # bn1 applied the ReLU
        if self.conv3:
            X = self.conv3(X)
        return model.relu(F, Y + X)


@contextlib.contextmanager
def _residual_is(block_type):
    """``model.resnet_block`` builds ``block_type`` blocks inside this ``with``."""
    plain = model.Residual
    model.Residual = block_type
    try:
        yield
    finally:
        model.Residual = plain


def fused_resnet18(num_classes=10):
    """``model.resnet18`` with the stem's and every block's BatchNorm+ReLU fused; the same
    parameters, with the same names, in the same order."""
    with _residual_is(FusedResidual):
        net = model.resnet18(num_classes)
    net[1].fuse_relu = True
    net.register_child(nn.HybridLambda(lambda F, x: x), '2')  # the stem's ReLU, now in net[1]
    return net


def fused_layers(net):
    """The BatchNorm layers of ``net`` that run ``_contrib_BatchNormWithReLU``."""
    found = []

    def visit(block):
        if getattr(block, 'fuse_relu', False):
            found.append(block)
        for child in block._children.values():
            visit(child)
    visit(net)
    return found


def fence(layers):
    """Order every later reader of the layers' running statistics after their update.

    Call after ``backward()`` (before or after ``trainer.step``), with ``fused_layers(net)``.
    Pushes two identity operators per layer and device; nothing waits here.
    """
    for layer in layers:
        for grad, mean, var in zip(layer.gamma.list_grad(), layer.running_mean.list_data(),
                                   layer.running_var.list_data()):
            # Reads grad (so runs after the backward operator), writes mean/var in place.
            nd.reshape_like(mean, grad, out=mean)
            nd.reshape_like(var, grad, out=var)
