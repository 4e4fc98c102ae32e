"""Why resnet18 does not use nn.BatchNormReLU: its running statistics race with later reads.

    .venv/bin/python benchmarks/bn_relu_race.py     # about 20 seconds; writes docs/bn-relu-race.md

One training step of a BatchNorm layer (imperative, the chapter's first-stage shape: 8 images
of 64 channels, 28x28), then ``running_mean`` is read. Three layers: ``nn.BatchNorm`` (the
control), ``nn.BatchNormReLU``, and ``nn.BatchNormReLU`` with benchmarks/bnrelu.py's ``fence``
after the backward pass. Three ways to read:

- at once, and after ``nd.waitall()``: counts of stale reads (the initial zeros) out of 20. A
  race, so the first count varies from run to run;
- held: the backward pass is held back (its head gradient comes from a Python operator that
  waits until the read has returned, or HOLD seconds at most), so a read that does not wait for
  the update sees the zeros every time: the race made deterministic. tests/test_bn_relu_race.py
  checks the same.
"""
import datetime
import os
import sys
import threading

import gluon_mgpu  # noqa: F401  (thread settings before MXNet starts)
import mxnet as mx
from mxnet import autograd, nd
from mxnet.gluon import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bnrelu  # noqa: E402

ROOT = os.path.dirname(HERE)
TRIES = 20
HELD_TRIES = 5
HOLD = 1.0  # seconds the backward pass is held at most

_GATE = threading.Event()


class _Gate(mx.operator.CustomOp):
    """Identity that waits (in MXNet's custom-operator thread) until ``_GATE`` opens."""

    def forward(self, is_train, req, in_data, out_data, aux):
        _GATE.wait(timeout=HOLD)
        self.assign(out_data[0], req[0], in_data[0])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], out_grad[0])


@mx.operator.register('bn_relu_race_gate')
class _GateProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return _Gate()


def fenced_batch_norm_relu():
    """``nn.BatchNormReLU`` whose ``fence`` is called after every backward pass by ``step``."""
    layer = nn.BatchNormReLU()
    layer.fenced = True
    return layer


def step(layer, x, held=False):
    """One training step of ``layer`` on ``x`` (``backward()`` of its output, head gradient 1);
    with ``held``, the backward pass cannot start before the gate opens."""
    with autograd.record():
        y = layer(x)
    head = nd.ones_like(y)
    if held:
        _GATE.clear()
        head = nd.Custom(head, op_type='bn_relu_race_gate')
    y.backward(head)
    if getattr(layer, 'fenced', False):
        bnrelu.fence([layer])


def open_gate():
    """Let a held backward pass run."""
    _GATE.set()


def new_layer(make, ctx=mx.cpu()):
    """A fresh layer from ``make``, initialized (running mean 0) for 64 channels on ``ctx``."""
    layer = make()
    layer.initialize(ctx=ctx)
    return layer


def stale_reads(make, how, tries):
    """How many of ``tries`` reads of ``running_mean`` after one step still saw the zeros."""
    stale = 0
    for _ in range(tries):
        x = nd.random.uniform(shape=(8, 64, 28, 28))
        layer = new_layer(make)
        step(layer, x, held=how == 'held')
        if how == 'waitall':
            nd.waitall()
        stale += int((layer.running_mean.data().asnumpy() == 0).all())
        open_gate()
        nd.waitall()
    return stale


CAUSE = """\
## Cause (MXNet 1.9.1 source)

Line numbers are those of the files as stored by the `search` tool's index of apache/mxnet
(v1.x, oneDNN era: `batch_norm_relu.cc` at 0b49dc2, `mkldnn_batch_norm-inl.h` at 0a79c24).

- On CPU, in training, neither BatchNorm operator updates the running statistics in its forward
  pass (`MKLDNNBatchNormForward`, `src/operator/nn/mkldnn/mkldnn_batch_norm-inl.h` lines
  248-259 write only the batch mean and variance). oneDNN's *backward* does, in place:
  `MKLDNNBatchNormBackward` (line 322), lines 424-437, `moving_mean_ptr[i] = moving_mean_ptr[i]
  * param.momentum + out_mean_ptr[i] * minus_mom` and the same for `moving_var`, on its inputs 6
  and 7.
- MXNet's engine orders operators only by the arrays they declare. `_backward_BatchNorm`
  (`src/operator/nn/batch_norm.cc`) declares `FMutateInputs` {6, 7} ("moving_mean,
  moving_var"), added by apache/mxnet#18644 "Fix BatchNorm backward synchronization" (v1.x:
  #18654), so a read of `running_mean` waits for it.
- `_backward_contrib_BatchNormWithReLU` (`src/operator/contrib/batch_norm_relu.cc` lines
  315-328) declares no `FMutateInputs`, yet its `BatchNormWithReLUGradComputeExCPU` (lines
  164-178) calls the same `MKLDNNBatchNormBackward` (line 174), which writes them. To the engine
  it only reads them. The forward operator declares `FMutateInputs` {3, 4} (lines 279-282), as
  BatchNorm's does.

So a *reader* pushed after the backward pass does not wait for it: `asnumpy()`, `nd.save`,
`copyto` (and so `save_parameters`, which copies every parameter to the CPU first). It can see
the old statistics, or an update half done. An operator that *writes* them is ordered (an
engine write waits for the reads before it): the next forward pass, in training or in predict
mode, sees the update, so evaluation is safe. Imperative and hybridized (`static_alloc`) runs
behave the same. In the package the checkpoints, `--save-params` and the replica check come
after an `nd.waitall()` (the epoch's timer, the check's own), which would hide the race; a
reader between two steps (a `batch_end` handler) would not be covered.

## Fix

`benchmarks/bnrelu.py`: `fence(layers)` after `backward()` pushes, per fused layer and device,
`nd.reshape_like(running_mean, gamma_grad, out=running_mean)` and the same for `running_var`:
an identity that reads the gradient of gamma, so it runs after the backward operator that
writes that gradient, and writes the running statistics, so every later reader waits for it.
The held column is deterministic: without the fence every held read sees the zeros, with it
none does. tests/test_bn_relu_race.py asserts both, for `asnumpy` and `copyto` readers, the
values against nn.BatchNorm's, the predict-mode forward pass ordered without a fence, and that
the fused network (`fused_resnet18`) has resnet18's parameter names, order and values.

## Does it pay?

The fused network (the stem's BatchNorm+ReLU and every residual block's first, 9 of 17) keeps
the package's parameters, so it could replace it; `.venv/bin/python benchmarks/candidates.py
--group bnrelu` measures it against the package, with the fence paid every step (see
docs/candidates.md). The package keeps nn.BatchNorm unless that shows a clear gain.
"""


def main():
    lines = ['# nn.BatchNormReLU: running statistics read right after a step', '',
             'Written by `benchmarks/bn_relu_race.py` on %s (MXNet %s); do not edit by hand.'
             % (datetime.date.today().isoformat(), mx.__version__), '',
             'Reads that still saw the initial running mean after one training step (of %d; '
             'held: of %d, the backward pass held until the read returned, %g s at most):'
             % (TRIES, HELD_TRIES, HOLD), '',
             '| layer | read at once | read after nd.waitall() | held |',
             '| --- | ---: | ---: | ---: |']
    for name, make in (('BatchNorm', nn.BatchNorm), ('BatchNormReLU', nn.BatchNormReLU),
                       ('BatchNormReLU, fenced', fenced_batch_norm_relu)):
        lines.append('| %s | %d | %d | %d |' % (
            name, stale_reads(make, 'at once', TRIES), stale_reads(make, 'waitall', TRIES),
            stale_reads(make, 'held', HELD_TRIES)))
    text = '\n'.join(lines + ['', CAUSE])
    with open(os.path.join(ROOT, 'docs', 'bn-relu-race.md'), 'w') as f:
        f.write(text)
    print(text)


if __name__ == '__main__':
    main()
