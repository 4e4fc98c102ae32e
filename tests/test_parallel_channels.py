"""Method 2, the channel split: the one-device network's numbers, every piece on its device.

Tolerances, and why. Each split layer computes exactly the one-device layer's formula, but
float32 sums come out in a different order (a BatchNorm over 32 channels reduces its batch
statistics differently from one over 64; a convolution's input gradient is a sum of the
pieces' parts). So:

* prediction mode (BatchNorm uses its running statistics): logits within 1e-5 of the largest
  (measured: about 1e-7);
* training mode: the loss within 1e-6 relative. The gradients of the whole network at its
  initialization amplify a 1e-6 difference in BatchNorm's batch statistics to a few per cent
  (measured 2-6e-2; moving the one-device network's input by one float32 rounding step moved
  its own gradients by up to 7e-2), so they are compared where that cannot happen: in
  float64 the split equals the one-device network within 1e-10 (measured 1e-14), and in
  float32 the stem and first stage, which amplify little, within 1e-4 (measured 3.6e-6).
"""
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd
from mxnet.gluon import nn

from gluon_mgpu.model import resnet18
from gluon_mgpu.parallel import check_trace, channels, init_one_device, trace_devices
from gluon_mgpu.parallel.common import layer_output_bytes
from parallel_helpers import (assert_lives_on, backward, batch, layer_gap, named, train_and_reload,
                              stepped, twins, value)

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICES = {2: [mx.cpu(0), mx.cpu(1)], 3: [mx.cpu(0), mx.cpu(1), mx.cpu(2)]}


@pytest.mark.parametrize('channels_, n, sizes', [(64, 4, [16, 16, 16, 16]), (10, 4, [3, 3, 2, 2]),
                                                 (64, 3, [22, 21, 21]), (10, 2, [5, 5])])
def test_channel_slices(channels_, n, sizes):
    slices = channels.channel_slices(channels_, n)
    assert [b - a for a, b in slices] == sizes
    assert slices[0][0] == 0 and slices[-1][1] == channels_
    assert all(b == a for (_, b), (a, _) in zip(slices, slices[1:]))


def _stem_and_stage1():
    full, net = resnet18(10), nn.HybridSequential()
    for i in range(4):
        net.add(full[i])
    return net


@pytest.mark.parametrize('n', [2, 3])
def test_prediction_mode_logits_equal_one_device(n, tmp_path):
    net, reference, _ = twins(lambda: resnet18(10), tmp_path)
    split = channels.ChannelSplitNet(net, DEVICES[n], lr=0.1)
    X, _ = batch()
    expected = reference(X).asnumpy()
    assert np.abs(split(X).asnumpy() - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize('n', [2, 3])
def test_training_mode_loss_equals_one_device_and_the_first_stage_gradients(n, tmp_path):
    net, reference, _ = twins(lambda: resnet18(10), tmp_path)
    split = channels.ChannelSplitNet(net, DEVICES[n], lr=0.1)
    X, y = batch()
    assert abs(backward(split.net, X, y) - backward(reference, X, y)) <= 1e-6 * backward(
        reference, X, y)
    net, reference, _ = twins(_stem_and_stage1, tmp_path)
    split = channels.ChannelSplitNet(net, DEVICES[n], lr=0.1)
    w = nd.random.normal(shape=(4, 64, 28, 28))
    for block in (split.net, reference):
        with mx.autograd.record():
            l = (block(X) * w).sum()
        l.backward()
    assert layer_gap(split, reference) <= 1e-4


@pytest.mark.parametrize('n', [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: make test-slow
def test_training_mode_gradients_equal_one_device_in_float64(n, tmp_path):
    code = 'import parallel_helpers; parallel_helpers.float64_gap(%d, 0, %r)' % (n, str(tmp_path))
    env = dict(os.environ, MXNET_ENGINE_TYPE='NaiveEngine',
               PYTHONPATH=os.pathsep.join(p for p in (HERE, os.environ.get('PYTHONPATH')) if p))
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    loss_gap, gradient_gap = map(float, out.stdout.split())
    assert loss_gap <= 1e-12 and gradient_gap <= 1e-10


@pytest.mark.parametrize('n', [2, 3])
def test_every_piece_and_its_gradient_lives_on_its_device(n, tmp_path):
    split, X = stepped(lambda net, devices: channels.ChannelSplitNet(net, devices, lr=0.1),
                       DEVICES[n], tmp_path)
    assert len(split.layers) == 38  # 20 convolutions, 17 BatchNorms, 1 dense layer
    for _, layer in split.layers:
        for piece, device in zip(layer.pieces, split.devices):
            assert_lives_on(piece, device)
    records = trace_devices([split.net], lambda: split(X))
    assert check_trace(records) == len(records)
    pieces = [r for r in records if '_part' in r['name']]
    assert len(pieces) == 38 * n
    for r in pieces:
        device = split.devices[int(r['name'].rsplit('_part', 1)[1].split('_')[0])]
        assert r['inputs'] == r['outputs'] == (device,), r['name']
    others = [r for r in records if '_part' not in r['name']]
    assert {c for r in others for c in r['inputs'] + r['outputs']} == {mx.cpu(0)}
    assert split(X).context == mx.cpu(0)
    home = mx.cpu(0)
    assert set(split.copies.sent) == {(home, d) for d in split.devices[1:]} | {
        (d, home) for d in split.devices[1:]}


def test_a_conv_split_over_four_devices_holds_a_quarter_of_the_filters_each():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(64, 3, padding=1))
    init_one_device(net, input_shape=(2, 3, 8, 8))
    whole = net[0].weight.data().asnumpy()
    split = channels.ChannelSplitNet(net, [mx.cpu(i) for i in range(4)], lr=0.1)
    layer = split.layers[0][1]
    assert [p.weight.shape for p in layer.pieces] == [(16, 3, 3, 3)] * 4
    assert np.array_equal(np.concatenate([p.weight.data(d).asnumpy() for p, d in
                                          zip(layer.pieces, split.devices)]), whole)
    X = nd.random.uniform(shape=(2, 3, 8, 8))
    s = split.summary(X)
    # The input goes to 3 other devices; each sends its 16 channels back; twice per step.
    assert s['copied_bytes_per_step'] == 2 * (3 * 2 * 3 * 8 * 8 * 4 + 3 * 2 * 16 * 8 * 8 * 4)
    assert s['parameter_bytes'] == [(16 * 27 + 16) * 4] * 4


def test_params_file_round_trip(tmp_path):
    net, reference, path = twins(lambda: resnet18(10), tmp_path)
    split = channels.ChannelSplitNet(net, DEVICES[3], lr=0.1)
    _, plain = train_and_reload(split, lambda: resnet18(10), tmp_path)
    for path_, layer in split.layers:
        for name in layer.param_names:
            assert np.array_equal(value(named(plain)[path_ + name]), layer.whole(name).asnumpy())
    split.load_parameters(path)  # back to the one-device start
    for path_, layer in split.layers:
        for name in layer.param_names:
            assert np.array_equal(layer.whole(name).asnumpy(),
                                  value(named(reference)[path_ + name])), path_ + name
        assert [p.list_ctx() for p in layer[1].collect_params().values()] == [[mx.cpu(1)]] * len(
            layer.param_names)


def test_bad_params_files_are_refused(tmp_path):
    net, _, _ = twins(lambda: resnet18(10), tmp_path)
    split = channels.ChannelSplitNet(net, DEVICES[2], lr=0.1)
    arrays = split.whole_parameters()
    missing = str(tmp_path / 'missing.params')
    nd.save(missing, {k: v for k, v in arrays.items() if k != '8.bias'})
    with pytest.raises(ValueError, match=r"missing.params has no parameter '8.bias'; pass a file "
                                         r"saved from the same network"):
        split.load_parameters(missing)
    wrong = str(tmp_path / 'wrong.params')
    nd.save(wrong, dict(arrays, **{'8.bias': nd.zeros(11)}))
    with pytest.raises(ValueError, match=r"parameter '8.bias' has shape \(11,\), this network "
                                         r"\(10,\)"):
        split.load_parameters(wrong)
    extra = str(tmp_path / 'extra.params')
    nd.save(extra, dict(arrays, **{'9.weight': nd.zeros(1)}))
    with pytest.raises(ValueError, match=r"has parameter '9.weight', which this network does not"):
        split.load_parameters(extra)


def test_more_devices_than_channels_and_unsplittable_layers_are_refused(tmp_path):
    net = init_one_device(resnet18(10), input_shape=(1, 1, 28, 28))
    with pytest.raises(ValueError, match=r'layer dense\d+ has 10 output channels, fewer than the '
                                         r'11 devices; split over at most 10 devices'):
        channels.split_channels(net, [mx.cpu(i) for i in range(11)])
    net = nn.HybridSequential()
    net.add(nn.Embedding(5, 4))
    init_one_device(net, input_shape=(2,))
    with pytest.raises(ValueError, match=r'layer embedding\d+ \(Embedding\) has parameters but is '
                                         r'not a Conv2D, BatchNorm or Dense layer'):
        channels.split_channels(net, DEVICES[2])
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3, groups=2, in_channels=2))
    init_one_device(net, input_shape=(1, 2, 5, 5))
    with pytest.raises(ValueError, match=r'only ungrouped NCHW convolutions are split by channels '
                                         r'\(groups=2, layout=NCHW\)'):
        channels.split_channels(net, DEVICES[2])


def test_hybridize_the_pieces_not_the_spanning_network(tmp_path):
    net, reference, _ = twins(lambda: resnet18(10), tmp_path)
    split = channels.ChannelSplitNet(net, DEVICES[2], lr=0.1)
    X, _ = batch()
    expected = reference(X).asnumpy()
    split.hybridize()
    assert np.abs(split(X).asnumpy() - expected).max() <= 1e-5 * np.abs(expected).max()
    split.net.hybridize()
    with pytest.raises(RuntimeError, match=r'is split over 2 devices and cannot be part of a '
                                           r'hybridized graph'):
        split.net(X)


def test_summary_halves_the_parameters_and_counts_the_traffic(tmp_path):
    net, reference, _ = twins(lambda: resnet18(10), tmp_path)
    split = channels.ChannelSplitNet(net, DEVICES[2], lr=0.1)
    X, _ = batch()
    s = split.summary(X)
    assert s['parameter_bytes'] == [22367252, 22367252]  # every layer has an even width
    assert sum(s['parameter_bytes']) == 44734504  # the one-device network's
    # Forward traffic from the one-device network's layers: a convolution or dense layer sends
    # its whole input to the other device and gets half its output back; a BatchNorm sends
    # half its input and gets half its output back. The backward pass sends as much again.
    sizes = []
    handles = [block.register_forward_hook(
        lambda b, i, o: sizes.append((type(b), i[0].size * 4, o.size * 4)))
        for block in _leaves(reference)]
    reference(X)
    for h in handles:
        h.detach()
    forward = sum(i + o // 2 if kind is not nn.BatchNorm else i // 2 + o // 2
                  for kind, i, o in sizes if kind in (nn.Conv2D, nn.Dense, nn.BatchNorm))
    assert s['copied_bytes_per_step'] == 2 * forward
    # The second device holds what it receives (every convolution's whole input, half of every
    # BatchNorm's) and its halves of the outputs: the same sum. That is more than the whole
    # one-device network's activations; the first device also keeps every gathered output.
    assert s['activation_bytes'][1] == forward
    one = layer_output_bytes([reference], lambda: reference(X))[mx.cpu(0)]
    assert s['activation_bytes'][0] > s['activation_bytes'][1] > one


def _leaves(block):
    found = []
    block.apply(lambda b: found.append(b) if not b._children else None)
    return found
