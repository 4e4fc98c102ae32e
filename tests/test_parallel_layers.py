"""Method 1, the layer split: equal to one device bit for bit, and every array where it belongs."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

from gluon_mgpu.model import lenet, resnet18
from gluon_mgpu.parallel import CopyCounter, check_trace, layers, trace_devices
from gluon_mgpu.parallel.common import layer_output_bytes
from gluon_mgpu.parallel.scratch import gluon_lenet
from parallel_helpers import (assert_lives_on, backward, batch, grad, named, train_and_reload,
                              stepped, twins, value)

DEVICES = {2: [mx.cpu(0), mx.cpu(1)], 3: [mx.cpu(0), mx.cpu(1), mx.cpu(2)]}


def test_units_of_the_chapters_resnet18_and_of_any_sequence():
    names = [n for n, _ in layers.stage_units(resnet18(10))]
    assert names == ['stem', 'stage1', 'stage2', 'stage3', 'stage4', 'head']
    assert [n for n, _ in layers.stage_units(lenet())] == ['0', '1', '2', '3', '4', '5', '6']


@pytest.mark.parametrize('costs, n, cut', [
    ([1, 2, 3, 4], 2, (3,)),           # 6 | 4
    ([1, 1, 1, 1], 2, (2,)),
    ([5, 1, 1, 1, 1, 1], 3, (1, 3)),   # 5 | 2 | 3: the largest run is 5 whatever happens
    ([3584, 594944, 2107904, 8410112, 33597440, 20520], 4, (3, 4, 5)),
])
def test_choose_cut(costs, n, cut):
    assert layers.choose_cut(costs, n) == cut


def test_even_parameters_cut_resnet18_before_stage4(tmp_path):
    net, _, _ = twins(lambda: resnet18(10), tmp_path)
    units = layers.stage_units(net)
    sizes = layers.unit_bytes(units)
    # stage4 alone holds 32.0 MiB of 42.7: nothing beats putting it on a device of its own.
    assert sizes[4] == 33597440 and sum(sizes) == 44734504
    assert layers.resolve_cut(units, 'params', 2) == (4,)
    assert layers.resolve_cut(units, 'params', 3) == (4, 5)
    assert layers.resolve_cut(units, ('stage2',), 2) == (3,)


@pytest.mark.parametrize('cut, message', [
    (('stage5',), r"cannot cut after 'stage5': cut after one of stem, stage1, stage2, stage3, "
                  r"stage4 \(the last unit, head, ends the network\)"),
    (('head',), r"cannot cut after 'head'"),
    (('stage1', 'stage2'), r'2 devices need 1 cut, got 2 \(stage1, stage2\)'),
    ('halves', r"cut must be 'params', 'time' or the names of the units"),
    ('time', r"cut='time' times every unit on a sample batch; pass sample=X"),
])
def test_bad_cuts_are_refused(cut, message):
    with pytest.raises(ValueError, match=message):
        layers.resolve_cut(layers.stage_units(resnet18(10)), cut, 2)


def test_cuts_out_of_order_and_too_many_devices_are_refused():
    units = layers.stage_units(resnet18(10))
    with pytest.raises(ValueError, match=r'cuts stage3, stage1 are not in the order'):
        layers.resolve_cut(units, ('stage3', 'stage1'), 3)
    with pytest.raises(ValueError, match=r'a layer split over 7 devices needs 7 units, but the '
                                         r'network has 6 .*; use at most 6 devices'):
        layers.resolve_cut(units, 'params', 7)


def test_an_uninitialized_network_is_refused():
    net = resnet18(10)
    net.initialize()
    with pytest.raises(RuntimeError, match=r'is not initialized yet.*call init_one_device'):
        layers.split_layers(net, DEVICES[2])


@pytest.mark.parametrize('n', [2, 3])
def test_layer_split_equals_one_device_bit_for_bit(n, tmp_path):
    """The same operations on the same numbers: loss, gradients, step and BatchNorm statistics."""
    net, reference, _ = twins(lambda: resnet18(10), tmp_path)
    split = layers.LayerSplit(net, DEVICES[n], lr=0.1, cut='params')
    X, y = batch()
    expected = backward(reference, X, y)
    gluon.Trainer(reference.collect_params(), 'sgd', {'learning_rate': 0.1}).step(4)
    assert split.train_batch(X, y).asscalar() == expected
    ours, theirs = named(net), named(reference)
    for name, param in theirs.items():
        assert np.array_equal(value(ours[name]), param.data().asnumpy()), name
        if param.grad_req != 'null':
            assert np.array_equal(grad(ours[name]), param.grad().asnumpy()), name


@pytest.mark.parametrize('n', [2, 3])
def test_every_parameter_gradient_and_activation_lives_on_its_device(n, tmp_path):
    split, X = stepped(lambda net, devices: layers.LayerSplit(net, devices, lr=0.1), DEVICES[n],
                       tmp_path)
    for part, device in zip(split.parts, split.devices):
        assert_lives_on(part, device)
    records = trace_devices(split.parts, lambda: split(X))
    # n parts + 9 children of the network + 8 residual blocks + their 35 layers
    assert check_trace(records) == len(records) == n + 9 + 8 + 35
    # Each part takes its input on its own device and leaves its output there.
    parts = [r for r in records if r['name'].startswith('part')]
    assert [(r['inputs'], r['outputs']) for r in parts] == [((d,), (d,)) for d in split.devices]
    assert split(X).context == split.devices[-1]
    # The only copies: each boundary activation, from one device to the next.
    assert set(split.copies.sent) == set(zip(split.devices, split.devices[1:]))


def test_cpu_contexts_mix_silently_so_the_tests_check_every_array():
    """MXNet checks only the device type: this is why a missing copy must be tested for."""
    mixed = nd.ones((2,), ctx=mx.cpu(0)) + nd.ones((2,), ctx=mx.cpu(1))
    assert mixed.asnumpy().tolist() == [2.0, 2.0]
    record = {'name': 'conv9', 'inputs': (mx.cpu(0),), 'outputs': (mx.cpu(0),),
              'parameters': ((mx.cpu(1),),)}
    with pytest.raises(RuntimeError, match=r'block conv9 mixed devices: inputs on \[cpu\(0\)\], '
                                           r'output on \[cpu\(0\)\], parameters on '
                                           r'\[\(cpu\(1\),\)\]; a copy \(as_in_context\) is '
                                           r'missing'):
        check_trace([record])


def test_one_trainer_cannot_span_devices_so_each_part_has_its_own(tmp_path):
    net, _, _ = twins(lambda: resnet18(10), tmp_path)
    split = layers.LayerSplit(net, DEVICES[2], lr=0.1)
    with pytest.raises(AssertionError, match='same set of contexts'):
        gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    assert [t._contexts for t in split.trainers] == [[d] for d in split.devices]


def test_micro_batches_without_batchnorm_equal_the_whole_batch(tmp_path):
    """Gradients of 4 micro-batches added = the whole batch's, up to float32 summation order."""
    net, reference, _ = twins(gluon_lenet, tmp_path, input_shape=(8, 1, 28, 28))
    split = layers.LayerSplit(net, DEVICES[2], lr=0.1, cut=('1',), micro_batches=4)
    X, y = batch(8)
    expected = backward(reference, X, y)
    assert abs(split.train_batch(X, y).asscalar() - expected) <= 1e-5 * abs(expected)
    ours = named(net)
    for name, param in named(reference).items():
        g = param.grad().asnumpy()
        assert np.abs(grad(ours[name]) - g).max() <= 1e-5 * np.abs(g).max(), name


def test_micro_batches_with_batchnorm_normalize_each_micro_batch_on_its_own(tmp_path):
    """With BatchNorm the pipeline is not the whole batch: it is one device fed the micro-batches."""
    net, reference, path = twins(lambda: resnet18(10), tmp_path)
    whole = resnet18(10)
    whole.load_parameters(path, ctx=mx.cpu(0))
    split = layers.LayerSplit(net, DEVICES[2], lr=0.1, micro_batches=2)
    X, y = batch()
    split.train_batch(X, y)
    for p in reference.collect_params().values():
        if p.grad_req != 'null':
            p.grad_req = 'add'
    backward(reference, X[:2], y[:2])
    backward(reference, X[2:], y[2:])
    backward(whole, X, y)
    ours, far = named(net), []
    for name, param in named(reference).items():
        if param.grad_req != 'null':
            assert np.array_equal(grad(ours[name]), param.grad().asnumpy()), name
            g = named(whole)[name].grad().asnumpy()
            far.append(np.abs(param.grad().asnumpy() - g).max() / np.abs(g).max())
    assert max(far) > 0.1  # the whole batch's statistics are not the micro-batches'


def test_params_file_round_trip(tmp_path):
    net, reference, path = twins(lambda: resnet18(10), tmp_path)
    split = layers.LayerSplit(net, DEVICES[2], lr=0.1)
    X, plain = train_and_reload(split, lambda: resnet18(10), tmp_path)
    assert np.array_equal(plain(X).asnumpy(), split(X).asnumpy())
    split.load_parameters(path)  # back to the starting point, every parameter on its device
    for name, param in named(reference).items():
        assert np.array_equal(value(named(net)[name]), param.data().asnumpy()), name
    for part, device in zip(split.parts, split.devices):
        assert {c for p in part.collect_params().values() for c in p.list_ctx()} == {device}


def test_hybridized_parts_give_the_same_logits(tmp_path):
    net, reference, _ = twins(lambda: resnet18(10), tmp_path)
    split = layers.LayerSplit(net, DEVICES[2], lr=0.1)
    X, _ = batch()
    split.hybridize()
    assert np.abs(split(X).asnumpy() - reference(X).asnumpy()).max() <= 1e-6
    with pytest.raises(RuntimeError, match=r'call summary\(\) before hybridize\(\)'):
        split.summary(X)


def test_summary_counts_parameters_activations_and_copies(tmp_path):
    net, reference, _ = twins(lambda: resnet18(10), tmp_path)
    split = layers.LayerSplit(net, DEVICES[2], lr=0.1, cut=('stage2',))
    X, _ = batch()
    s = split.summary(X)
    assert s['units'] == [['stem', 'stage1', 'stage2'], ['stage3', 'stage4', 'head']]
    assert s['parameter_bytes'] == [2706432, 42028072]  # 2.6 and 40.1 MiB
    boundary = 4 * 128 * 14 * 14 * 4  # stage2's output, float32
    assert s['copied_bytes_per_step'] == 2 * boundary  # forward, and its gradient back
    one = layer_output_bytes([reference], lambda: reference(X))
    assert sum(s['activation_bytes']) == one[mx.cpu(0)] + boundary


def test_cut_by_time_leaves_batchnorm_statistics_alone(tmp_path):
    net, _, _ = twins(lambda: resnet18(10), tmp_path)
    units = layers.stage_units(net)
    before = {n: value(p) for n, p in named(net).items() if 'running' in n}
    X, _ = batch()
    times = layers.unit_times(units, X, repeats=1)
    assert len(times) == 6 and all(t > 0 for t in times)
    assert all(np.array_equal(value(named(net)[n]), v) for n, v in before.items())
    split = layers.LayerSplit(net, DEVICES[2], lr=0.1, cut='time', sample=X)
    assert len(split.names) == 2 and sum(split.names, []) == list(layers.RESNET18_UNITS)


def test_copy_counter_counts_only_real_copies():
    counter = CopyCounter()
    x = nd.ones((2, 3), ctx=mx.cpu(0))
    assert counter.copy(x, mx.cpu(0)) is x
    assert counter.copy(x, mx.cpu(1)).context == mx.cpu(1)
    assert counter.sent == {(mx.cpu(0), mx.cpu(1)): 24}
    assert counter.received(mx.cpu(1)) == 24 and counter.received(mx.cpu(0)) == 0


def test_the_gradient_comes_back_through_the_copy():
    x = nd.ones((2,), ctx=mx.cpu(0))
    x.attach_grad()
    with autograd.record():
        y = (x.as_in_context(mx.cpu(1)) * 3).sum()
    y.backward()
    assert x.grad.context == mx.cpu(0) and x.grad.asnumpy().tolist() == [3.0, 3.0]
