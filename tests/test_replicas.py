import json
import os
import re
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, init, nd
from mxnet.gluon import loss as gloss
from mxnet.gluon.parameter import DeferredInitializationError

import gluon_mgpu
from gluon_mgpu import data, replicas
from gluon_mgpu.commands.train import main as train_main

BN_WHY = ('(expected: each device updates its own BatchNorm running statistics from its own '
          'slice of the batch, and the Trainer never reduces them)')
# The book's Out[5]: weight.data(ctx[0])[0] and weight.data(ctx[1])[0], both printed the same.
BOOK_WEIGHT = [[-0.01473444, -0.01073093, -0.01042483],
               [-0.01327885, -0.01474966, -0.00524142],
               [0.01266256, 0.00895064, -0.00601594]]


def cpus(n):
    return [mx.cpu(i) for i in range(n)]


@pytest.fixture(scope='module')
def images():
    x, y = data.load_fashion_mnist_arrays('train')
    return nd.array(data.to_tensor(x[:6])), nd.array(y[:6], dtype='int32')


def initialized_resnet(devices, X, seed=0):
    """The chapter's cells: initialize on the devices, one forward pass per device's slice."""
    mx.random.seed(seed)
    net = gluon_mgpu.resnet18(10)
    net.initialize(init.Normal(sigma=0.01), ctx=devices)
    for X_d in gluon.utils.split_and_load(X, devices, even_split=False):
        net(X_d)
    return net


def host_max_diff(param, devices):
    first = param.data(devices[0]).asnumpy()
    return max(float(np.abs(param.data(d).asnumpy() - first).max()) for d in devices[1:])


@pytest.mark.parametrize('ndev', [2, 3])
def test_a_single_element_off_by_1e7_is_found(ndev, images):
    devices = cpus(ndev)
    net = initialized_resnet(devices, images[0][:4])
    assert gluon_mgpu.inspect_replicas(net).ok
    weight = net[0].weight
    old = weight.data(devices[-1])[5, 0, 1, 2].asscalar()
    weight.data(devices[-1])[5, 0, 1, 2] = old + 1e-7
    changed = float(np.float32(old + 1e-7) - np.float32(old))
    assert 0.9e-7 < changed < 1.1e-7

    report = gluon_mgpu.inspect_replicas(net)
    assert not report.ok
    assert [p.name for p in report.mismatched] == [weight.name]
    worst = report.worst
    assert worst.name == weight.name and worst.kind == 'trained'
    assert worst.abs_diff == (0.0,) * (ndev - 1) + (changed,)
    assert worst.worst_context == devices[-1]
    scale = float(np.abs(weight.data(devices[0]).asnumpy()).max())
    assert worst.max_rel_diff == pytest.approx(changed / scale, rel=1e-12)
    assert all(p.identical for p in report.parameters if p.name != weight.name)

    with pytest.raises(gluon_mgpu.ReplicaMismatchError,
                       match=r"^parameter '%s' \(64, 1, 3, 3\) differs between cpu\(0\) and "
                             r"cpu\(%d\) by 1\.0e-07 \(relative .*, atol 0\); 1 of 76 trained "
                             r"parameters differ; " % (weight.name, ndev - 1)) as caught:
        gluon_mgpu.assert_replicas_match(net, atol=0.0)
    e = caught.value
    assert isinstance(e, RuntimeError)
    assert (e.parameter, e.contexts, e.abs_diff, e.atol) == (
        weight.name, (devices[0], devices[-1]), changed, 0.0)
    # A tolerance above the change lets it pass and returns the report.
    assert gluon_mgpu.assert_replicas_match(net, atol=1e-6).worst.name == weight.name


@pytest.mark.parametrize('ndev', [2, 3])
def test_trained_parameters_identical_after_init_and_5_steps_batchnorm_stats_differ(ndev,
                                                                                   images):
    devices = cpus(ndev)
    X, y = images
    net = initialized_resnet(devices, X)
    after_init = gluon_mgpu.inspect_replicas(net)
    assert after_init.ok and after_init.worst is None
    assert (len(after_init.trained), len(after_init.auxiliary)) == (76, 34)
    assert after_init.contexts == tuple(devices)
    assert all(p.identical for p in after_init.parameters)
    assert gluon_mgpu.format_replica_summary(after_init) == (
        'replicas: 76 trained parameters identical on %d devices; '
        '34 BatchNorm statistics identical' % ndev)

    start = net[0].weight.data(devices[0]).copy()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    loss = gloss.SoftmaxCrossEntropyLoss()
    for _ in range(5):
        gluon_mgpu.train_epoch(net, [(X, y)], loss, trainer, devices)
    moved = float(np.abs(net[0].weight.data(devices[0]).asnumpy() - start.asnumpy()).max())
    assert moved > 1e-4  # training did change the weights

    report = gluon_mgpu.assert_replicas_match(net)  # BatchNorm statistics are no failure
    assert report.ok and len(report.trained) == 76
    assert all(p.max_abs_diff == 0.0 for p in report.trained)
    aux = report.auxiliary
    assert len(aux) == 34 and all(p.is_batchnorm_statistic for p in aux)
    assert all(not p.identical for p in aux)
    params = net.collect_params()
    expected = max(host_max_diff(params[p.name], devices) for p in aux)
    assert report.auxiliary_max_abs_diff == expected > 0
    assert gluon_mgpu.format_replica_summary(report) == (
        'replicas: 76 trained parameters identical on %d devices; 34 BatchNorm statistics '
        'differ by at most %.1e %s' % (ndev, expected, BN_WHY))


def _backward(net, devices, X, y):
    loss = gloss.SoftmaxCrossEntropyLoss()
    Xs = gluon.utils.split_and_load(X, devices)
    ys = gluon.utils.split_and_load(y, devices)
    with mx.autograd.record():
        ls = [loss(net(X_d), y_d) for X_d, y_d in zip(Xs, ys)]
    for l in ls:
        l.backward()


def _grads(net, devices):
    return {p.name: [p.grad(d).asnumpy().copy() for d in devices]
            for p in net.collect_params().values() if p.grad_req != 'null'}


def test_gradients_differ_before_step_and_with_the_default_kvstore_after_it(two_cpus, images):
    X, y = images
    net = initialized_resnet(two_cpus, X)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    _backward(net, two_cpus, X, y)
    before = gluon_mgpu.inspect_replicas(net, what='grad')
    assert before.what == 'grad' and len(before.parameters) == 76
    assert not before.ok
    dense = net[-1].weight.name
    assert dense in [p.name for p in before.mismatched]
    assert gluon_mgpu.format_replica_summary(before).startswith(
        'gradients: %d of 76 trained parameters differ on 2 devices, worst '
        % len(before.mismatched))
    with pytest.raises(gluon_mgpu.ReplicaMismatchError,
                       match=r"^the gradient of parameter '.*' \(.*\) differs between cpu\(0\) and "
                             r"cpu\(1\) by .*before trainer.step each device holds the "
                             r"gradient of its own slice"):
        gluon_mgpu.assert_replicas_match(net, what='grad')
    grads = _grads(net, two_cpus)

    trainer.step(X.shape[0])
    # MXNet 1.9's default: the 'device' kvstore applies the update itself and sends the new
    # weights back; each device keeps the gradient of its own slice.
    assert trainer._update_on_kvstore is True
    after = gluon_mgpu.inspect_replicas(net, what='grad')
    assert [p.max_abs_diff for p in after.parameters] == \
        [p.max_abs_diff for p in before.parameters]
    assert all(np.array_equal(a, b) for name, g in _grads(net, two_cpus).items()
               for a, b in zip(g, grads[name]))
    assert gluon_mgpu.inspect_replicas(net).ok


def test_gradients_are_the_identical_sum_after_step_when_the_trainer_reduces(two_cpus,
                                                                            images):
    X, y = images
    net = initialized_resnet(two_cpus, X)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                            update_on_kvstore=False)
    _backward(net, two_cpus, X, y)
    assert not gluon_mgpu.inspect_replicas(net, what='grad').ok
    grads = _grads(net, two_cpus)

    trainer.step(X.shape[0])
    after = gluon_mgpu.assert_replicas_match(net, what='grad')
    assert after.ok and len(after.parameters) == 76
    assert gluon_mgpu.format_replica_summary(after) == \
        'gradients: 76 trained parameters identical on 2 devices'
    for name, g in _grads(net, two_cpus).items():
        assert np.array_equal(g[0], grads[name][0] + grads[name][1]), name
    assert gluon_mgpu.inspect_replicas(net).ok


def test_deferred_initialization_says_to_pass_one_batch_first(two_cpus):
    net = gluon_mgpu.resnet18(10)
    net.initialize(init.Normal(sigma=0.01), ctx=two_cpus)
    message = (r"^parameter '%s' is not initialized yet: its initialization on "
               r"\[cpu\(0\), cpu\(1\)\] is deferred until the first forward pass tells its input "
               r"shape; pass one batch through the network first" % net[0].weight.name)
    with pytest.raises(DeferredInitializationError, match=message):
        gluon_mgpu.inspect_replicas(net)
    with pytest.raises(RuntimeError, match=message):
        gluon_mgpu.assert_replicas_match(net)
    with pytest.raises(RuntimeError, match=r"^parameter '.*' is not initialized; call "
                                           r"net\.initialize\(ctx=devices\)"):
        gluon_mgpu.inspect_replicas(gluon_mgpu.resnet18(10))


def test_a_context_the_parameter_does_not_live_on_lists_where_it_lives(two_cpus, images):
    net = initialized_resnet(two_cpus, images[0][:2])
    weight = net[0].weight
    where = r"it lives on \[cpu\(0\), cpu\(1\)\]"
    with pytest.raises(ValueError, match=r"^parameter '%s' is not initialized on cpu\(2\); %s"
                                         % (weight.name, where)):
        gluon_mgpu.get_replica(weight, mx.cpu(2))
    with pytest.raises(ValueError, match=r"is not initialized on cpu\(2\); " + where):
        gluon_mgpu.inspect_replicas(net, devices=[mx.cpu(0), mx.cpu(2)])
    assert gluon_mgpu.get_replica(weight, mx.cpu(1)) is weight.data(mx.cpu(1))
    reverse = gluon_mgpu.inspect_replicas(net, devices=[mx.cpu(1), mx.cpu(0)])
    assert reverse.contexts == (mx.cpu(1), mx.cpu(0)) and reverse.ok


@pytest.mark.parametrize('call,message', [
    (lambda net: gluon_mgpu.inspect_replicas(net, what='weights'),
     r"what must be 'data' \(parameter values\) or 'grad' \(gradients\), got 'weights'"),
    (lambda net: gluon_mgpu.assert_replicas_match(net, atol=-1e-3),
     r'atol must be a number >= 0, got -0\.001; for example atol=0\.0'),
    (lambda net: gluon_mgpu.assert_replicas_match(net, atol='tight'),
     r"atol must be a number >= 0, got 'tight'"),
    (lambda net: gluon_mgpu.inspect_replicas(net, devices=[]), r'devices is empty'),
    (lambda net: gluon_mgpu.inspect_replicas([1, 2]), r'expected a gluon Block'),
    (lambda net: gluon_mgpu.get_replica(net[1].running_mean, mx.cpu(0), what='grad'),
     r"has no gradient \(grad_req='null'\); inspect its data instead"),
])
def test_bad_arguments(call, message, two_cpus, images):
    net = initialized_resnet(two_cpus, images[0][:2])
    with pytest.raises(ValueError, match=message):
        call(net)


def test_to_dict_is_json_and_matches_the_report(two_cpus, images):
    net = initialized_resnet(two_cpus, images[0][:2])
    weight, bias = net[0].weight, net[-1].bias
    weight.data(mx.cpu(1))[0, 0, 0, 0] += 0.5
    bias.data(mx.cpu(0))[3] = np.nan
    report = gluon_mgpu.inspect_replicas(net)
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d == report.to_dict()
    assert d['what'] == 'data' and d['contexts'] == ['cpu(0)', 'cpu(1)']
    assert d['ok'] is False and d['worst'] == bias.name  # NaN on one device only: infinite
    assert (d['num_trained'], d['num_auxiliary']) == (76, 34)
    assert [p['name'] for p in d['parameters']] == [p.name for p in report.parameters]
    rows = {p['name']: p for p in d['parameters']}
    assert rows[bias.name]['abs_diff'] == [0.0, 'inf']
    assert rows[weight.name]['shape'] == [64, 1, 3, 3]
    assert rows[weight.name]['kind'] == 'trained' and rows[weight.name]['identical'] is False
    assert rows[weight.name]['max_abs_diff'] == report.parameters[0].max_abs_diff == \
        pytest.approx(0.5, abs=1e-7)
    assert rows[net[1].running_var.name]['kind'] == 'auxiliary'
    # NaN in the same place on every device is agreement, not a difference.
    bias.data(mx.cpu(1))[3] = np.nan
    weight.data(mx.cpu(1))[0, 0, 0, 0] = weight.data(mx.cpu(0))[0, 0, 0, 0].asscalar()
    assert gluon_mgpu.inspect_replicas(net).ok


def test_format_report_has_one_row_per_parameter(two_cpus, images):
    net = initialized_resnet(two_cpus, images[0][:2])
    net[-1].bias.data(mx.cpu(1))[:] += 0.25
    report = gluon_mgpu.inspect_replicas(net)
    lines = gluon_mgpu.format_replica_report(report).splitlines()
    assert lines[0] == 'values of 110 parameters on [cpu(0), cpu(1)], each compared with the ' \
                       'first device'
    assert lines[1].split() == ['parameter', 'shape', 'kind', 'max', 'abs', 'diff', 'max', 'rel',
                                'diff']
    assert len(lines) == 1 + 1 + 110 + 1
    assert lines[2].split() == [net[0].weight.name, '(64,', '1,', '3,', '3)', 'trained', '0',
                                '0']
    assert lines[-2].split()[:4] == [net[-1].bias.name, '(10,)', 'trained', '2.5e-01']
    assert lines[-1] == gluon_mgpu.format_replica_summary(report) == (
        'replicas: 1 of 76 trained parameters differ on 2 devices, worst %s by 2.5e-01 '
        '(cpu(0) vs cpu(1)); 34 BatchNorm statistics identical' % net[-1].bias.name)


def test_one_device_has_nothing_to_compare(images):
    net = initialized_resnet([mx.cpu(0)], images[0][:2])
    report = gluon_mgpu.assert_replicas_match(net)
    assert report.ok and report.contexts == (mx.cpu(0),)
    assert gluon_mgpu.format_replica_summary(report) == \
        'replicas: 76 trained parameters on 1 device only, nothing to compare'


# The command line: --check-replicas N

def _cli_args(data_dir, *extra):
    return ['--num-gpus', '2', '--device', 'cpu', '--batch-size', '4', '--train-limit', '12',
            '--test-limit', '4', '--seed', '0', '--data-dir', data_dir, *extra]


def test_check_replicas_prints_a_summary_line_per_epoch(capsys, data_dir):
    assert train_main(_cli_args(data_dir, '--epochs', '2', '--check-replicas', '1')) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == 'running on: [cpu(0), cpu(1)]'
    assert len(lines) == 6
    for epoch, (epoch_line, summary) in enumerate(zip(lines[1:5:2], lines[2:5:2]), 1):
        assert epoch_line.startswith('epoch %d, training time: ' % epoch)
        assert re.fullmatch(r'replicas: 76 trained parameters identical on 2 devices; '
                            r'34 BatchNorm statistics differ by at most \d\.\de[-+]\d\d '
                            + re.escape(BN_WHY), summary), summary
    assert lines[5].startswith('test acc: ')
    assert err == ''
    # --quiet keeps its promise: only the final summary line.
    assert train_main(_cli_args(data_dir, '--epochs', '1', '--check-replicas', '1',
                                '--quiet')) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and out.startswith('test acc: ') and err == ''


def _break_a_replica_at(monkeypatch, bad_step):
    """Make the `bad_step`-th trainer.step leave the dense bias on cpu(1) off by 1e-3."""
    step, calls = gluon.Trainer.step, []

    def broken_step(self, batch_size, ignore_stale_grad=False):
        step(self, batch_size, ignore_stale_grad)
        calls.append(1)
        if len(calls) == bad_step:
            bias = next(p for p in self._params if re.fullmatch(r'dense\d+_bias', p.name))
            bias.data(mx.cpu(1))[:] += 1e-3

    monkeypatch.setattr(gluon.Trainer, 'step', broken_step)


@pytest.mark.parametrize('every,bad_step,where', [
    ('2', 2, 'epoch 1, step 2'),
    ('5', 3, 'the end of epoch 1'),  # 3 steps per epoch: only the end-of-epoch check runs
])
def test_check_replicas_stops_with_exit_1_on_a_mismatch(every, bad_step, where, monkeypatch,
                                                       capsys, data_dir):
    _break_a_replica_at(monkeypatch, bad_step)
    assert train_main(_cli_args(data_dir, '--epochs', '2', '--check-replicas', every)) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == 'running on: [cpu(0), cpu(1)]'
    if 'step' in where:
        assert len(lines) == 1
    else:  # the epoch's line is printed, its summary is not
        assert len(lines) == 2 and lines[1].startswith('epoch 1, training time: ')
    assert len(err.splitlines()) == 1
    assert re.match(r"python -m gluon_mgpu\.train: error: --check-replicas: at %s, parameter "
                    r"'dense\d+_bias' \(10,\) differs between cpu\(0\) and cpu\(1\) by 1\.0e-03 "
                    r"\(relative .*\); 1 of 76 trained parameters differ; " % where, err), err
    assert 'Traceback' not in err


# python -m gluon_mgpu.replicas

def test_replicas_main_walks_the_chapters_cells_and_prints_the_books_weight():
    result = subprocess.run([sys.executable, '-m', 'gluon_mgpu.replicas', '--num-gpus', '2',
                             '--device', 'cpu', '--seed', '0'], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ''
    out = result.stdout
    lines = out.splitlines()
    assert lines[:2] == ['running on: [cpu(0), cpu(1)]',
                         'net.initialize(init=init.Normal(sigma=0.01), ctx=[cpu(0), cpu(1)])']
    assert lines[2].startswith("inspect_replicas(net) before a forward pass: parameter "
                               "'conv0_weight' is not initialized yet")
    assert "weight.data(cpu(2)): parameter 'conv0_weight' is not initialized on cpu(2); it " \
           "lives on [cpu(0), cpu(1)]: ask for one of those" in lines
    printed = re.findall(r'weight\.data\((cpu\(\d\))\)\[0\]:\n(\[\[\[.*?\]\]\])\n'
                         r'<NDArray 1x3x3 @(cpu\(\d\))>', out, re.S)
    assert [(a, c) for a, _, c in printed] == [('cpu(0)', 'cpu(0)'), ('cpu(1)', 'cpu(1)')]
    values = [np.array(re.findall(r'-?\d\.\d+', text), dtype=float).reshape(3, 3)
              for _, text, _ in printed]
    assert np.array_equal(values[0], values[1])
    assert np.array_equal(values[0], np.array(BOOK_WEIGHT))
    assert lines[-1] == ('replicas: 76 trained parameters identical on 2 devices; '
                         '34 BatchNorm statistics identical')
    table = lines[lines.index('values of 110 parameters on [cpu(0), cpu(1)], each compared '
                              'with the first device') + 2:-1]
    assert len(table) == 110 and all(row.split()[-2:] == ['0', '0'] for row in table)


def test_replicas_main_bad_input_is_one_line_and_exit_2(capsys):
    from gluon_mgpu.commands.replicas import main
    assert main(['--num-gpus', '0']) == 2
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.replicas: error: argument --num-gpus: --num-gpus must be at '
        'least 1, got 0; for example --num-gpus 2 (see --help)\n')
    assert main(['--device', 'gpu']) == 2
    err = capsys.readouterr().err
    assert err.startswith('python -m gluon_mgpu.replicas: error: --num-gpus 2 --device gpu: '
                          'asked for 2 GPUs but no GPU was found')
    assert len(err.splitlines()) == 1


def test_public_names_are_exported():
    for name in ('inspect_replicas', 'assert_replicas_match', 'ReplicaMismatchError',
                 'ReplicaReport', 'ParameterReplicas', 'get_replica', 'format_replica_report',
                 'format_replica_summary'):
        assert getattr(gluon_mgpu, name) is getattr(replicas, name)
        assert name in gluon_mgpu.__all__


# --- issue 53: frozen parameters (grad_req='null') are compared, and named as frozen ---------

def _frozen_first_conv(images):
    devices = cpus(2)
    net = initialized_resnet(devices, images[0][:4])
    net[0].collect_params().setattr('grad_req', 'null')  # weight and bias of the first conv
    return net, devices


def test_a_frozen_layer_changed_on_one_device_fails_and_is_not_called_batchnorm_drift(images):
    # It passed, and the summary called it expected BatchNorm drift.
    net, devices = _frozen_first_conv(images)
    report = gluon_mgpu.assert_replicas_match(net)
    assert [p.name for p in report.frozen] == [net[0].weight.name, net[0].bias.name]
    assert (len(report.trained), len(report.frozen), len(report.auxiliary)) == (74, 2, 34)
    assert gluon_mgpu.format_replica_summary(report) == (
        'replicas: 74 trained and 2 frozen parameters identical on 2 devices; '
        '34 BatchNorm statistics identical')
    weight = net[0].weight.data(devices[1])
    weight[:] = weight + 0.5

    report = gluon_mgpu.inspect_replicas(net)
    assert not report.ok and [p.name for p in report.mismatched] == [net[0].weight.name]
    assert report.worst.kind == 'frozen' and report.worst.max_abs_diff == 0.5
    assert report.auxiliary_max_abs_diff == 0.0
    assert gluon_mgpu.format_replica_summary(report) == (
        'replicas: 1 of 74 trained and 2 frozen parameters differ on 2 devices, worst %s '
        '(frozen) by 5.0e-01 (cpu(0) vs cpu(1)); 34 BatchNorm statistics identical'
        % net[0].weight.name)
    with pytest.raises(gluon_mgpu.ReplicaMismatchError,
                       match=r"^frozen parameter '%s' \(64, 1, 3, 3\) differs between cpu\(0\) "
                             r"and cpu\(1\) by 5\.0e-01 \(relative .*, atol 0\); 1 of 74 trained "
                             r"and 2 frozen parameters differ; nothing updates a frozen "
                             r"parameter \(grad_req='null'\), so one replica was changed on its "
                             r"own \(for example by writing to param\.data\(ctx\) on one device\)$"
                             % net[0].weight.name):
        gluon_mgpu.assert_replicas_match(net)
    d = report.to_dict()
    assert (d['num_trained'], d['num_frozen'], d['num_auxiliary'], d['worst']) == (
        74, 2, 34, net[0].weight.name)


def test_frozen_batchnorm_scales_are_frozen_and_its_statistics_auxiliary(images):
    devices = cpus(2)
    net = initialized_resnet(devices, images[0][:4])
    net[1].gamma.grad_req = 'null'  # the first BatchNorm's scale, frozen by hand
    report = gluon_mgpu.inspect_replicas(net)
    kinds = {p.name: p.kind for p in report.parameters}
    assert (kinds[net[1].gamma.name], kinds[net[1].beta.name],
            kinds[net[1].running_mean.name]) == ('frozen', 'trained', 'auxiliary')
    # A statistic differing stays expected: only trained and frozen replicas must agree.
    stat = net[1].running_mean.data(devices[1])
    stat[:] = stat + 1
    report = gluon_mgpu.assert_replicas_match(net)
    assert report.ok and report.auxiliary_max_abs_diff == 1.0
    assert gluon_mgpu.format_replica_summary(report).endswith(
        '; 1 of 34 BatchNorm statistics differ by at most 1.0e+00 %s' % BN_WHY)
