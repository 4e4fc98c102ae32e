"""python -m gluon_mgpu.train --parallel scratch|layers|channels: the book's lines, the bytes per
device, the metrics file, an ordinary .params file, and the refusals."""
import json
import os
import re

import jsonschema
import mxnet as mx
import pytest
from mxnet import nd

import gluon_mgpu
from gluon_mgpu.handlers import metrics
from gluon_mgpu.parallel import scratch
from gluon_mgpu.commands.train import main

PROG = 'python -m gluon_mgpu.train'
TINY = ['--num-gpus', '2', '--device', 'cpu', '--batch-size', '16', '--train-limit', '32',
        '--test-limit', '16', '--seed', '0', '--epochs', '2']


@pytest.mark.parametrize('method,extra,split_line,params', [
    ('layers', ['--micro-batches', '2'],
     'split: cpu(0): stem, stage1, stage2, stage3 | cpu(1): stage4, head', '10.6 MiB, 32.1 MiB'),
    ('layers', ['--cut', 'stage2'],
     'split: cpu(0): stem, stage1, stage2 | cpu(1): stage3, stage4, head', '2.6 MiB, 40.1 MiB'),
    ('channels', [], 'split: 38 layers split by channels over cpu(0), cpu(1) (first layer: 32 | '
                     '32)', '21.3 MiB, 21.3 MiB'),
    ('scratch', [], None, '504.2 KiB, 504.2 KiB'),
])
def test_each_method_trains_with_the_books_lines_and_the_bytes_per_device(
        method, extra, split_line, params, tmp_path, capsys, data_dir):
    path = str(tmp_path / 'run.json')
    saved = str(tmp_path / 'net.params')
    assert main(TINY + ['--data-dir', data_dir, '--parallel', method, '--metrics-json', path,
                        '--save-params', saved, '--check-replicas', '1'] + extra) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == 'running on: [cpu(0), cpu(1)]' and err == ''
    if split_line is not None:
        assert lines.pop(1) == split_line
    assert re.fullmatch(r'bytes per device: parameters %s; activations of a batch of 16: '
                        r'\S+ \S+, \S+ \S+; copied per step: \S+ \S+' % re.escape(params),
                        lines[1]), lines[1]
    for epoch in (1, 2):
        line, check = lines[2 * epoch], lines[2 * epoch + 1]
        assert re.fullmatch(r'epoch %d, training time: \d+\.\d sec, test_acc [01]\.\d\d' % epoch,
                            line), line
        if method == 'scratch':
            assert check == ('replicas: 8 parameters identical on 2 devices (data parallelism '
                             'from scratch)')
        else:
            assert check.startswith('placement: cpu(0): ') and check.endswith(
                'every parameter lives on exactly one device: there are no replicas to compare')
    assert re.fullmatch(r'test acc: [01]\.\d\d, \d+\.\d sec/epoch on \[cpu\(0\), cpu\(1\)\]',
                        lines[6])
    doc = json.load(open(path))
    assert list(jsonschema.Draft202012Validator(metrics.SCHEMA).iter_errors(doc)) == []
    assert doc['status'] == 'finished' and doc['arguments']['parallel'] == method
    placement = doc['placement']
    assert placement['method'] == method and placement['devices'] == ['cpu(0)', 'cpu(1)']
    assert placement['batch_size'] == 16 and len(placement['activation_bytes']) == 2
    assert all(r['train_acc'] is None for r in doc['history'])
    # A model trained split is an ordinary model.
    if method == 'scratch':
        loaded = scratch.load_params(saved)
        assert [p.shape for p in loaded] == [p.shape for p in scratch.init_params()]
    else:
        net = gluon_mgpu.resnet18(10)
        net.load_parameters(saved, ctx=mx.cpu())
        assert net(nd.zeros((1, 1, 28, 28))).shape == (1, 10)
        assert sorted(nd.load(saved)) == sorted(net._collect_params_with_prefix())


def test_the_layer_split_saves_what_it_trained(tmp_path, capsys, data_dir):
    # Evaluated as one ordinary network, the saved parameters give the run's last test_acc.
    saved = str(tmp_path / 'net.params')
    assert main(TINY + ['--data-dir', data_dir, '--parallel', 'layers', '--save-params',
                        saved, '--no-hybridize']) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    net = gluon_mgpu.resnet18(10)
    net.load_parameters(saved, ctx=mx.cpu())
    _, test_iter = gluon_mgpu.load_data_fashion_mnist(16, data_dir=data_dir, train_limit=32,
                                                      test_limit=16)
    assert last.startswith('test acc: %.2f, ' % gluon_mgpu.evaluate_accuracy(
        test_iter, net, [mx.cpu()]))


@pytest.mark.parametrize('argv,message', [
    (['--micro-batches', '4'], '--micro-batches 4 pipelines the layer split; pass --parallel '
                               'layers or drop --micro-batches'),
    (['--cut', 'stage2'], '--cut stage2 chooses where the layer split cuts; pass --parallel '
                          'layers or drop --cut'),
    (['--parallel', 'scratch', '--model', 'resnet18'],
     "--parallel scratch trains the book's LeNet written from scratch, not --model resnet18; "
     "drop --model or pass --parallel data"),
    (['--parallel', 'scratch', '--hybridize'], '--parallel scratch runs the network as plain '
                                               'functions, which cannot be hybridized; pass '
                                               '--no-hybridize'),
    (['--parallel', 'layers', '--checkpoint-dir', '{tmp}/ck'],
     '--checkpoint-dir works with --parallel data only; drop it or pass --parallel data'),
    (['--parallel', 'channels', '--device-weights', '3,1'],
     '--device-weights works with --parallel data only; drop it or pass --parallel data'),
    (['--parallel', 'layers', '--micro-batches', '20'],
     '--micro-batches 20 but the batch has 16 examples; use at most 16 micro-batches'),
    (['--parallel', 'layers', '--cut', 'nope'],
     "--parallel layers: cannot cut after 'nope': cut after one of stem, stage1, stage2, "
     "stage3, stage4 (the last unit, head, ends the network)"),
    (['--parallel', 'channels', '--num-gpus', '11', '--batch-size', '22'],
     ' has 10 output channels, fewer than the 11 devices; split over at most 10 devices'),
    (['--parallel', 'pipes'], "argument --parallel: invalid choice: 'pipes'"),
])
def test_bad_combinations_are_one_line_and_exit_2(argv, message, tmp_path, capsys, data_dir):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(TINY + ['--data-dir', data_dir] + argv) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    assert err.startswith('%s: error: ' % PROG) and message in err, err
    assert not os.path.exists(tmp_path / 'ck')
