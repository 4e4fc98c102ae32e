"""Every flag, given something wrong: one line naming the flag, the value and the fix; exit 2.

The table runs through ``main(argv)`` (the function behind ``python -m gluon_mgpu.train``); a
representative subset also runs as a real process, where nothing else may reach stderr.
"""
import gzip
import os
import subprocess
import sys

import pytest
from mxnet.base import MXNetError

from gluon_mgpu import data, devices
from gluon_mgpu.commands.train import main

PROG = 'python -m gluon_mgpu.train: error: '

# (argv, flag, value, how the fix begins); {tmp}, {file}, {empty}, {broken}, {magic} are
# filled in by the `paths` fixture.
CASES = [
    (['--num-gpus', 'two'], '--num-gpus', "'two'", 'for example --num-gpus 2'),
    (['--num-gpus', '0'], '--num-gpus', '0', 'for example --num-gpus 2'),
    (['--num-gpus', '-2'], '--num-gpus', '-2', 'for example --num-gpus 2'),
    (['--num-gpus', '2.5'], '--num-gpus', "'2.5'", 'for example --num-gpus 2'),
    (['--num-gpus', ''], '--num-gpus', "''", 'for example --num-gpus 2'),
    (['--batch-size', 'big'], '--batch-size', "'big'", 'for example --batch-size 2'),
    (['--batch-size', '0'], '--batch-size', '0', 'for example --batch-size 2'),
    (['--batch-size', '-16'], '--batch-size', '-16', 'for example --batch-size 2'),
    (['--batch-size', '1e3'], '--batch-size', "'1e3'", 'for example --batch-size 2'),
    (['--num-gpus', '4', '--batch-size', '3'], '--batch-size', '3',
     'pass --batch-size 4 or more'),
    (['--lr', 'fast'], '--lr', "'fast'", 'for example --lr 0.1'),
    (['--lr', '0'], '--lr', "'0'", 'for example --lr 0.1'),
    (['--lr', '-0.1'], '--lr', "'-0.1'", 'for example --lr 0.1'),
    (['--lr', 'inf'], '--lr', "'inf'", 'for example --lr 0.1'),
    (['--lr', 'nan'], '--lr', "'nan'", 'for example --lr 0.1'),
    (['--lr', '1e400'], '--lr', "'1e400'", 'for example --lr 0.1'),
    (['--lr'], '--lr', 'expected one argument', 'see --help'),
    (['--epochs', 'x'], '--epochs', "'x'", 'for example --epochs 2'),
    (['--epochs', '0'], '--epochs', '0', 'for example --epochs 2'),
    (['--epochs', '-3'], '--epochs', '-3', 'for example --epochs 2'),
    (['--epochs', '1.5'], '--epochs', "'1.5'", 'for example --epochs 2'),
    (['--train-limit', 'all'], '--train-limit', "'all'", 'for example --train-limit 2'),
    (['--train-limit', '0'], '--train-limit', '0', 'for example --train-limit 2'),
    (['--train-limit', '-5'], '--train-limit', '-5', 'for example --train-limit 2'),
    (['--train-limit', '60001'], '--train-limit', '60001', 'pass at most 60000'),
    (['--test-limit', 'x'], '--test-limit', "'x'", 'for example --test-limit 2'),
    (['--test-limit', '0'], '--test-limit', '0', 'for example --test-limit 2'),
    (['--test-limit', '10001'], '--test-limit', '10001', 'pass at most 10000'),
    (['--seed', 'x'], '--seed', "'x'", 'for example --seed 0'),
    (['--seed', '-1'], '--seed', '-1', 'for example --seed 0'),
    (['--seed', '2147483648'], '--seed', '2147483648', 'for example --seed 0'),
    (['--device', 'tpu'], '--device', "'tpu'", "choose from 'auto', 'gpu', 'cpu'"),
    (['--device', 'GPU'], '--device', "'GPU'", "choose from 'auto', 'gpu', 'cpu'"),
    (['--device', 'gpu'], '--device', 'gpu', 'install a CUDA build of MXNet'),
    (['--loader', 'torch'], '--loader', "'torch'", "choose from 'array', 'gluon'"),
    (['--dtype', 'float16'], '--dtype', "'float16'", "choose from 'float32', 'bfloat16'"),
    (['--force-dtype', '--dtype', 'bfloat16', '--parallel', 'layers', '--num-gpus', '2'],
     '--dtype', 'bfloat16', 'drop it or pass --parallel data'),
    (['--data-dir', '{tmp}/none'], '--data-dir', '{tmp}/none', 'pass a folder that holds'),
    (['--data-dir', '{file}'], '--data-dir', '{file}', 'is a file, not a folder; pass a folder'),
    (['--data-dir', '{empty}'], '--data-dir', '{empty}', 'apt-get install'),
    (['--data-dir', '{broken}'], '--data-dir', '{broken}', 'replace it with a fresh copy'),
    (['--data-dir', '{magic}'], '--data-dir', '{magic}', 'is it the right file?'),
    (['--checkpoint-dir', '{file}/ck'], '--checkpoint-dir', '{file}/ck',
     'pass a folder you can write to'),
    (['--resume'], '--resume', '--checkpoint-dir', 'needs --checkpoint-dir DIR'),
    (['--resume', '--checkpoint-dir', '{empty}'], '--resume', '{empty}',
     'leave out --resume to start a new run'),
    (['--resume', '--checkpoint-dir', '{tmp}/none'], '--resume', '{tmp}/none',
     'leave out --resume to start a new run'),
    (['--resume', '--checkpoint-dir', '{file}'], '--resume', '{file}',
     'leave out --resume to start a new run'),
    (['--metrics-json', '{file}/run.json'], '--metrics-json', '{file}/run.json',
     'name a file in a folder'),
    (['--metrics-json', '{tmp}/none/run.json'], '--metrics-json', '{tmp}/none/run.json',
     'create it first'),
    (['--plot', '{tmp}/curves.pdf'], '--plot', '{tmp}/curves.pdf', 'for example --plot curves.png'),
    (['--plot', '{empty}'], '--plot', '{empty}', 'name a file in it'),
    (['--check-replicas', '0'], '--check-replicas', '0', 'for example --check-replicas 2'),
    (['--check-replicas', '1.5'], '--check-replicas', "'1.5'",
     'for example --check-replicas 2'),
    (['--check-replicas', 'often'], '--check-replicas', "'often'",
     'for example --check-replicas 2'),
    (['--model', 'vgg'], '--model', "'vgg'", "choose from 'resnet18', 'lenet'"),
    (['--kvstore', 'dist_async'], '--kvstore', "'dist_async'", "choose from 'device', 'local'"),
    (['--kvstore', 'dist_sync'], '--kvstore', 'dist_sync',
     'start the job with python -m gluon_mgpu.launch'),
    (['--kvstore', 'dist_sync', '--checkpoint-dir', '{tmp}/ck'], '--checkpoint-dir', 'dist_sync',
     'drop --checkpoint-dir'),
    (['--num-gpus', '2', '--device-weights', '3,x'], '--device-weights', "'3,x'",
     'for example --device-weights 3,1'),
    (['--num-gpus', '2', '--device-weights', '3,0'], '--device-weights', "'3,0'",
     'for example --device-weights 3,1'),
    (['--num-gpus', '2', '--device-weights', '3,1,1'], '--device-weights', '3,1,1',
     'give one weight per device, e.g. --device-weights 1,1'),
    (['--balance', 'fast'], '--balance', "'fast'", "choose from 'even', 'auto'"),
    (['--num-gpus', '2', '--balance', 'auto', '--device-weights', '3,1'], '--balance',
     '--device-weights', 'see --help'),
    (['--model', 'lenet', '--sync-bn'], '--sync-bn', '--model lenet',
     'drop --sync-bn or use --model resnet18'),
    (['--save-params', '{tmp}/none/net.params'], '--save-params', '{tmp}/none/net.params',
     'create it first'),
    (['--save-params', '{empty}'], '--save-params', '{empty}', 'name a file in it'),
    (['--quiet', 'yes'], 'unrecognized arguments', 'yes', 'see --help'),
    (['--bogus', '3'], '--bogus', '3', 'see --help'),
    (['--parallel', 'pipes'], '--parallel', "'pipes'", "choose from 'data', 'scratch'"),
    (['--micro-batches', '0'], '--micro-batches', '0', 'for example --micro-batches 2'),
    (['--micro-batches', '2'], '--micro-batches', '2', 'pass --parallel layers'),
    (['--cut', ''], '--cut', "''", "give 'params', 'time' or the names of the units"),
    (['--cut', 'stage2'], '--cut', 'stage2', 'pass --parallel layers or drop --cut'),
    (['--warmup-steps', '-5'], '--warmup-steps', '-5', 'for example --warmup-steps 2'),
    (['--warmup-steps', '10', '--parallel', 'channels', '--num-gpus', '2'], '--warmup-steps',
     '--parallel data only', 'drop it or pass --parallel data'),
]
SUBPROCESS = ['--num-gpus two', '--lr -0.1', '--train-limit 60001', '--device tpu',
              '--data-dir {broken}', '--checkpoint-dir {file}/ck',
              '--resume --checkpoint-dir {empty}']


@pytest.fixture(scope='module')
def paths(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp('bad')
    (root / 'file').write_text('not a folder')
    (root / 'empty').mkdir()
    for name, payload in (('broken', None), ('magic', b'\0\0\x08\x01' + b'\0' * 20)):
        folder = root / name
        folder.mkdir()
        for n in data.FILES['train'] + data.FILES['test']:
            os.symlink(os.path.join(data_dir, n), folder / n)
        target = folder / 'train-images-idx3-ubyte.gz'
        os.remove(target)
        if payload is None:  # a download cut short: the first half of the real file
            with open(os.path.join(data_dir, target.name), 'rb') as f:
                raw = f.read()
            target.write_bytes(raw[:len(raw) // 2])
        else:  # a complete gzip file, but of labels, not images
            with gzip.open(target, 'wb') as f:
                f.write(payload)
    return {'tmp': str(root), 'file': str(root / 'file'), 'empty': str(root / 'empty'),
            'broken': str(root / 'broken'), 'magic': str(root / 'magic')}


def _fill(text, paths):
    return text.format(**paths)


def _check_line(err, flag, value, fix):
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(PROG), line
    assert 'Traceback' not in line
    assert flag in line and value in line and fix in line, line


def test_the_table_covers_every_flag():
    flags = {a.option_strings[0] for a in
             sys.modules['gluon_mgpu.commands.train'].build_parser()._actions if a.option_strings}
    covered = {case[1] for case in CASES} | {case[0][0] for case in CASES}
    # --hybridize/--no-hybridize take no value; --debug is tested below; -h is argparse's.
    assert flags - covered == {'-h', '--hybridize', '--debug'}
    assert len(CASES) >= 40


@pytest.mark.parametrize('argv,flag,value,fix', CASES, ids=[' '.join(c[0]) for c in CASES])
def test_bad_input_gets_one_line_naming_flag_value_and_fix(argv, flag, value, fix, paths, capsys,
                                                           data_dir):
    argv = [_fill(a, paths) for a in argv]
    if '--data-dir' not in argv:
        argv += ['--data-dir', data_dir]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ''
    _check_line(err, flag, _fill(value, paths), fix)


def test_sync_bn_with_the_naive_engine_is_refused_before_it_deadlocks(monkeypatch, capsys,
                                                                       data_dir):
    # NaiveEngine computes in the issuing thread: the first device's SyncBatchNorm would wait
    # for the second's, which is never issued (measured: no step within 60 s).
    monkeypatch.setenv('MXNET_ENGINE_TYPE', 'NaiveEngine')
    assert main(['--num-gpus', '2', '--device', 'cpu', '--sync-bn', '--data-dir', data_dir]) == 2
    out, err = capsys.readouterr()
    assert out == ''
    _check_line(err, '--sync-bn', 'MXNET_ENGINE_TYPE=NaiveEngine',
                'unset MXNET_ENGINE_TYPE or drop --sync-bn')


@pytest.mark.parametrize('args', SUBPROCESS)
def test_bad_input_in_a_real_process(args, paths, data_dir):
    argv = [_fill(a, paths) for a in args.split()]
    if '--data-dir' not in argv:
        argv += ['--data-dir', data_dir]
    result = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *argv],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stdout == ''
    case = next(c for c in CASES if ' '.join(c[0]) == args)
    _check_line(result.stderr, case[1], _fill(case[2], paths), case[3])


def test_more_devices_than_gpus_present(monkeypatch, capsys, data_dir):
    monkeypatch.setattr(devices, 'num_gpus', lambda: 2)
    assert main(['--num-gpus', '4', '--data-dir', data_dir, '--train-limit', '8']) == 2
    out, err = capsys.readouterr()
    assert out == ''
    _check_line(err, '--num-gpus', '4', 'pass --num-gpus 2')
    assert 'asked for 4 GPUs but 2 GPUs found' in err


# Unexpected errors: one line and a hint, or the traceback with --debug.

def _boom(message, cls=TypeError):
    def run(args, *rest):
        raise cls(message)
    return run


@pytest.fixture
def broken_run(monkeypatch):
    monkeypatch.delenv('GLUON_MGPU_DEBUG', raising=False)
    cli = sys.modules['gluon_mgpu.assembly.runs']
    monkeypatch.setattr(cli, 'run', _boom("unsupported operand type(s) for +: 'int' and 'str'"))
    return cli


def test_an_unexpected_error_is_one_line_with_a_hint(broken_run, capsys):
    assert main([]) == 1
    assert capsys.readouterr().err == (
        "python -m gluon_mgpu.train: error: unexpected TypeError: unsupported operand type(s) "
        "for +: 'int' and 'str'; nothing was saved (pass --checkpoint-dir DIR to keep every "
        "finished epoch); rerun with --debug (or GLUON_MGPU_DEBUG=1) for the full traceback, "
        "and include it in a bug report\n")


@pytest.mark.parametrize('how', ['flag', 'env'])
def test_debug_shows_the_traceback(broken_run, capsys, monkeypatch, how):
    argv = ['--debug'] if how == 'flag' else []
    if how == 'env':
        monkeypatch.setenv('GLUON_MGPU_DEBUG', '1')
    assert main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == 'Traceback (most recent call last):'
    assert any('in run' in line for line in err)
    assert err[-2] == "TypeError: unsupported operand type(s) for +: 'int' and 'str'"
    assert err[-1] == ("python -m gluon_mgpu.train: error: unexpected TypeError: unsupported "
                       "operand type(s) for +: 'int' and 'str'; nothing was saved (pass "
                       "--checkpoint-dir DIR to keep every finished epoch)")


def test_debug_zero_means_off(broken_run, capsys, monkeypatch):
    monkeypatch.setenv('GLUON_MGPU_DEBUG', '0')
    assert main([]) == 1
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_an_mxnet_error_is_shortened_to_its_message(monkeypatch, capsys):
    monkeypatch.delenv('GLUON_MGPU_DEBUG', raising=False)
    message = ('Traceback (most recent call last):\n  File "../src/storage/storage.cc", line 199'
               '\n  [bt] (0) libmxnet.so(+0x1234)\n'
               'MXNetError: Check failed: e == cudaSuccess: out of memory\n')
    monkeypatch.setattr(sys.modules['gluon_mgpu.assembly.runs'], 'run', _boom(message, MXNetError))
    assert main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith('python -m gluon_mgpu.train: error: unexpected MXNetError: Check '
                          'failed: e == cudaSuccess: out of memory; nothing was saved (pass '
                          '--checkpoint-dir DIR to keep every finished epoch); rerun with '
                          '--debug')
    assert len(err.splitlines()) == 1


def test_debug_also_traces_bad_input_in_a_real_process():
    result = subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', '--debug', '--lr', 'x'],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert lines[0] == 'Traceback (most recent call last):'
    assert lines[-1] == ("python -m gluon_mgpu.train: error: argument --lr: --lr expects a "
                         "number, got 'x'; for example --lr 0.1 (see --help)")
