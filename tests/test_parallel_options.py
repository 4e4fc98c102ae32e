"""What the command line calls: the refusals, --cut, make_parallel, and the placement report."""
import mxnet as mx
import pytest
from mxnet import nd
from mxnet.gluon import nn

from gluon_mgpu.model import resnet18
from gluon_mgpu.parallel import (check_parallel_options, data_parallel_summary, init_one_device,
                                 make_parallel, parse_cut)
from gluon_mgpu.parallel.channels import ChannelSplitNet
from gluon_mgpu.parallel.layers import LayerSplit
from gluon_mgpu.parallel.scratch import ScratchDataParallel
from gluon_mgpu.replicas.placement import format_bytes, format_placement, inspect_placement

DEVICES = [mx.cpu(0), mx.cpu(1)]


@pytest.mark.parametrize('kwargs, message', [
    (dict(parallel='pipes', num_devices=2),
     r"--parallel 'pipes': choose one of data, scratch, layers, channels"),
    (dict(parallel='data', num_devices=2, micro_batches=4),
     r'--micro-batches 4 pipelines the layer split; pass --parallel layers or drop '
     r'--micro-batches'),
    (dict(parallel='layers', num_devices=2, micro_batches=0),
     r'--micro-batches 0: pass a whole number >= 1'),
    (dict(parallel='layers', num_devices=2, micro_batches=8, batch_size=4),
     r'--micro-batches 8 but the batch has 4 examples; use at most 4 micro-batches'),
    (dict(parallel='channels', num_devices=2, cut=('stage2',)),
     r'--cut stage2 chooses where the layer split cuts; pass --parallel layers or drop --cut'),
    (dict(parallel='scratch', num_devices=2, model='resnet18'),
     r"--parallel scratch trains the book's LeNet written from scratch, not --model resnet18; "
     r"drop --model or pass --parallel data"),
    (dict(parallel='scratch', num_devices=2, hybridize=True),
     r'--parallel scratch runs the network as plain functions, which cannot be hybridized; '
     r'pass --no-hybridize'),
    (dict(parallel='scratch', num_devices=3, batch_size=256),
     r"--batch-size 256 cannot be split evenly over 3 devices, as the book's split_batch "
     r"needs; use a multiple of 3"),
    (dict(parallel='layers', num_devices=2, data_only=['--kvstore dist_sync']),
     r'--kvstore dist_sync works with --parallel data only; drop it or pass --parallel data'),
])
def test_bad_combinations_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        check_parallel_options(**kwargs)
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('kwargs', [
    dict(parallel='data', num_devices=2, data_only=['--sync-bn']),
    dict(parallel='layers', num_devices=3, micro_batches=4, batch_size=64, cut=('stage2',)),
    dict(parallel='scratch', num_devices=2, batch_size=256, hybridize=False),
    dict(parallel='channels', num_devices=4, batch_size=8),
])
def test_good_combinations_pass(kwargs):
    assert check_parallel_options(**kwargs) is None


def test_parse_cut():
    assert parse_cut('params') == 'params' and parse_cut('time') == 'time'
    assert parse_cut('stage2') == ('stage2',)
    assert parse_cut('stage1, stage3') == ('stage1', 'stage3')
    with pytest.raises(ValueError, match=r"--cut 'stage1,': give 'params', 'time' or the names"):
        parse_cut('stage1,')


def test_make_parallel_builds_each_method():
    assert isinstance(make_parallel('scratch', DEVICES, 0.1), ScratchDataParallel)
    net = init_one_device(resnet18(10))
    assert isinstance(make_parallel('layers', DEVICES, 0.1, net, micro_batches=2), LayerSplit)
    net = init_one_device(resnet18(10))
    assert isinstance(make_parallel('channels', DEVICES, 0.1, net), ChannelSplitNet)
    with pytest.raises(ValueError, match=r"make_parallel builds 'scratch', 'layers' or "
                                         r"'channels', got 'data'"):
        make_parallel('data', DEVICES, 0.1, net)
    with pytest.raises(ValueError, match=r'--parallel layers splits a network: pass net'):
        make_parallel('layers', DEVICES, 0.1)
    with pytest.raises(ValueError, match=r'name a device twice'):
        make_parallel('scratch', [mx.cpu(0), mx.cpu(0)], 0.1)


def test_data_parallel_summary_counts_one_replica_per_device():
    net = resnet18(10)
    net.initialize(ctx=DEVICES)
    X = nd.zeros((4, 1, 28, 28))
    for d in DEVICES:
        net(X.as_in_context(d))
    s = data_parallel_summary(net, DEVICES, X)
    assert s['parameter_bytes'] == [44734504, 44734504]
    trained = sum(p.data(DEVICES[0]).size * 4 for p in net.collect_params().values()
                  if p.grad_req != 'null')
    assert s['copied_bytes_per_step'] == 2 * trained
    assert s['activation_bytes'][0] == s['activation_bytes'][1] > 0


def test_placement_of_a_layer_split_and_of_replicas():
    net = nn.HybridSequential()
    net.add(nn.Dense(3, in_units=2), nn.Dense(4, in_units=3))
    net.initialize(ctx=mx.cpu(0))
    net[1].collect_params().reset_ctx(mx.cpu(1))
    p = inspect_placement(net)
    assert [(q.shape, q.contexts, q.nbytes) for q in p.parameters] == [
        ((3, 2), (mx.cpu(0),), 24), ((3,), (mx.cpu(0),), 12),
        ((4, 3), (mx.cpu(1),), 48), ((4,), (mx.cpu(1),), 16)]
    assert p.devices == (mx.cpu(0), mx.cpu(1)) and p.bytes_per_device == (36, 64)
    text = format_placement(p).splitlines()
    assert text[0].endswith('(3, 2)             float32, 24 B: cpu(0)')
    assert text[-3:] == ['cpu(0): 2 parameters, 36 B (36.0%)', 'cpu(1): 2 parameters, 64 B (64.0%)',
                         'every parameter lives on exactly one device: there are no replicas '
                         'to compare']
    net.collect_params().reset_ctx(DEVICES)
    p = inspect_placement(net)
    assert p.bytes_per_device == (100, 100) and p.count_per_device == (4, 4)
    assert format_placement(p, per_parameter=False).splitlines()[-1].startswith(
        'every device holds a full replica')


def test_format_bytes():
    assert [format_bytes(n) for n in (512, 2048, 2706432, 42028072)] == [
        '512 B', '2.0 KiB', '2.6 MiB', '40.1 MiB']
