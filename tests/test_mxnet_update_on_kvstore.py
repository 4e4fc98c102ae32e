"""What MXNet 1.9.1's Trainer does with an optimizer's error, which the package relies on
(``training.init_training`` makes its Trainer with ``update_on_kvstore=False``;
``train_checks.check_trainer`` refuses one that would update on the kvstore): updated in Python,
the error raises from ``trainer.step`` as it is; updated by the kvstore from C, MXNet prints it
and drops it. The numbers of a good step are the same either way.
"""
import os
import subprocess
import sys
import textwrap
import traceback

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn

PY = sys.executable
TESTS = os.path.dirname(os.path.abspath(__file__))


class _Failing(mx.optimizer.SGD):
    """SGD whose update raises, as MXNet's own does for a learning rate float32 cannot hold."""

    def update(self, index, weight, grad, state):
        raise ValueError('boom')

    update_multi_precision = update


def _trainer(n, optimizer, kvstore='device', update_on_kvstore=None):
    ctx = [mx.cpu(i) for i in range(n)]
    net = nn.Dense(2, in_units=3)
    net.initialize(mx.init.One(), ctx=ctx)
    trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=kvstore,
                            update_on_kvstore=update_on_kvstore)

    def step():
        X = nd.ones((2 * n, 3))
        with autograd.record():
            losses = [net(x).sum() for x in gluon.utils.split_and_load(X, ctx)]
        for loss in losses:
            loss.backward()
        trainer.step(2 * n)
    return net, trainer, step


@pytest.mark.parametrize('kvstore', ['device', 'local'])
@pytest.mark.parametrize('n', [1, 2])
def test_an_exception_in_the_optimizer_raises_from_trainer_step(kvstore, n):
    net, trainer, step = _trainer(n, _Failing(learning_rate=0.1), kvstore, False)
    with pytest.raises(ValueError, match='^boom$') as e:
        step()
    assert any(f.name == 'step' and f.filename.endswith(os.path.join('gluon', 'trainer.py'))
               for f in traceback.extract_tb(e.tb))
    assert 'step' not in vars(trainer) and 'update' not in vars(trainer)  # MXNet's own


def test_without_update_on_kvstore_false_mxnet_prints_and_drops_it():
    code = textwrap.dedent('''
        import sys
        sys.path.insert(0, sys.argv[1])
        import gluon_mgpu
        from test_mxnet_update_on_kvstore import _Failing, _trainer
        net, trainer, step = _trainer(2, _Failing(learning_rate=0.1))
        step()
        print('step returned; weight still', net.weight.data().asnumpy().ravel()[0])
    ''')
    out = subprocess.run([PY, '-c', code, TESTS], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == 'step returned; weight still 1.0\n'
    assert out.stderr.count('Exception ignored on calling ctypes callback function') == 2
    assert out.stderr.count('ValueError: boom') == 2


@pytest.mark.parametrize('n', [1, 2])
def test_a_learning_rate_float32_cannot_hold_raises_from_trainer_step(n):
    _, trainer, step = _trainer(n, mx.optimizer.SGD(learning_rate=1e39), 'device', False)
    with pytest.raises(mx.base.MXNetError, match=r"Invalid Parameter format for lrs expect tuple "
                                                 r"of <float> but value='\[1e\+39"):
        step()


def test_a_good_step_is_the_same_updated_in_python_as_on_the_kvstore():
    weights = []
    for update_on_kvstore in (None, False):
        net, trainer, step = _trainer(2, mx.optimizer.SGD(learning_rate=0.5), 'device',
                                      update_on_kvstore)
        step()
        step()
        weights.append([net.weight.data(mx.cpu(i)).asnumpy() for i in (0, 1)])
    # Per step: gradient 2 on each of the 2 devices (two rows of ones), summed and scaled by
    # 1/4, times lr 0.5: every weight goes from 1 to 0.5, then 0.
    assert np.array_equal(weights[0], weights[1])
    assert np.array_equal(weights[1][0], np.full((2, 3), 1 - 2 * 0.5, np.float32))


def test_ctrl_c_inside_the_optimizer_comes_out_as_it_is():
    class Interrupting(mx.optimizer.SGD):
        def update(self, *args):
            raise KeyboardInterrupt

        update_multi_precision = update
    _, trainer, step = _trainer(2, Interrupting(learning_rate=0.1), 'device', False)
    with pytest.raises(KeyboardInterrupt) as e:
        step()
    assert type(e.value) is KeyboardInterrupt
