import logging
import os
import re
import subprocess
import sys
import types

import mxnet as mx
import pytest

import gluon_mgpu
from gluon_mgpu import devices
from gluon_mgpu.assembly import runs
from gluon_mgpu.handlers import events
from gluon_mgpu.commands import sweep
from gluon_mgpu.runtime import files
from test_plotting import png_size


def _row(n, seconds, acc, cpu=True, epochs=2):
    history = [{'epoch': e, 'seconds': seconds, 'images_per_sec': 1000 / seconds,
                'train_loss': 1.0 / e, 'train_acc': acc, 'test_acc': acc}
               for e in range(1, epochs + 1)]
    return {'num_devices': n, 'devices': ['%s(%d)' % ('cpu' if cpu else 'gpu', i)
                                          for i in range(n)],
            'batch_size': 256 * n, 'lr': 0.1 * n, 'epochs': epochs, 'train_images': 1000,
            'test_images': 500, 'timed_epochs': list(range(2, epochs + 1)),
            'sec_per_epoch': seconds, 'images_per_sec': 1000 / seconds,
            'test_acc': acc, 'cpu': cpu, 'line': '', 'history': history}


def test_table_has_one_row_per_setting_with_speedups_over_one_device():
    rows = sweep.add_speedups([_row(1, 10.0, 0.91, cpu=False), _row(2, 5.5, 0.87, cpu=False),
                               _row(4, 3.2, 0.85, cpu=False)])
    assert [round(r['speedup'], 4) for r in rows] == [1.0, round(10 / 5.5, 4), 3.125]
    table = sweep.format_table(rows)
    lines = table.splitlines()
    assert lines[0] == ('ResNet-18 on Fashion-MNIST (1000 training, 500 test images), 2 epochs, '
                        'batch 256 and lr 0.1 per device.')
    assert lines[2:7] == [
        '| devices | global batch | lr | sec/epoch | images/s | speed-up over 1 device '
        '| final test acc |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
        '| 1: [gpu(0)] | 256 | 0.1 | 10.0 | 100.0 | 1.00 | 0.91 |',
        '| 2: [gpu(0), gpu(1)] | 512 | 0.2 | 5.5 | 181.8 | 1.82 | 0.87 |',
        '| 4: [gpu(0), gpu(1), gpu(2), gpu(3)] | 1024 | 0.4 | 3.2 | 312.5 | 3.12 | 0.85 |']
    assert 'not expected' not in table
    assert 'and images/s counts training images, both from epoch 2 on: epoch 1 also pays' in table


def test_table_says_when_a_speedup_is_not_expected_or_not_measurable():
    table = sweep.format_table(sweep.add_speedups([_row(2, 9.0, 0.5, epochs=1),
                                                   _row(4, 9.5, 0.5, epochs=1)]))
    assert 'both in the only epoch, which also pays one-time set-up' in table
    assert '| 2: [cpu(0), cpu(1)] | 512 | 0.2 | 9.0 | 111.1 | n/a | 0.50 |' in table
    assert 'There is no 1-device setting, so no speed-up is given; add 1 to --num-gpus.' in table
    assert ("Note: These devices are CPU contexts sharing one machine's cores (no GPU was used): "
            "the data parallelism is real, but a speed-up is not expected here.") in table


def test_plan_scales_batch_and_lr_with_the_devices():
    plan = sweep.plan_sweep([1, 2, 4], 64, 0.05, device='cpu')
    assert [(s['num_devices'], s['batch_size'], s['lr']) for s in plan] == [
        (1, 64, 0.05), (2, 128, 0.1), (4, 256, 0.2)]
    assert plan[2]['devices'] == [mx.cpu(i) for i in range(4)]


@pytest.mark.parametrize('counts,expected', [
    ([], r'num_gpus is empty; pass device counts such as \[1, 2, 4\]'),
    ([1, 0], r'every device count must be a whole number >= 1, got 0'),
    ([1, 2, 1], r'device count 1 is listed more than once; list each count once'),
])
def test_plan_refuses_bad_counts(counts, expected):
    with pytest.raises(ValueError, match=expected):
        sweep.plan_sweep(counts)


def test_sweep_cli_runs_each_setting_and_writes_table_and_plot(tmp_path, data_dir):
    out_dir = tmp_path / 'results'
    result = subprocess.run(
        [sys.executable, '-m', 'gluon_mgpu.sweep', '--num-gpus', '1', '2', '--train-limit', '16',
         '--test-limit', '16', '--batch-size-per-device', '8', '--epochs', '2', '--seed', '0',
         '--data-dir', data_dir, '--output-dir', str(out_dir)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert '\r' not in result.stdout
    out = result.stdout
    assert out.startswith('running on: [cpu(0)] (global batch 8, lr 0.1)\n'
                          'epoch 1, training time: ')
    assert 'running on: [cpu(0), cpu(1)] (global batch 16, lr 0.2)\n' in out
    table = (out_dir / 'sweep.md').read_text()
    assert table in out
    rows = [line for line in table.splitlines() if re.match(r'\| \d+: \[', line)]
    assert len(rows) == 2
    assert re.fullmatch(r'\| 1: \[cpu\(0\)\] \| 8 \| 0\.1 \| \d+\.\d \| \d+\.\d \| 1\.00 \| '
                        r'(0|1)\.\d\d \|', rows[0]), rows[0]
    assert re.fullmatch(r'\| 2: \[cpu\(0\), cpu\(1\)\] \| 16 \| 0\.2 \| \d+\.\d \| \d+\.\d \| '
                        r'\d+\.\d\d \| (0|1)\.\d\d \|', rows[1]), rows[1]
    assert 'a speed-up is not expected here' in table
    # sec/epoch leaves out epoch 1: with 2 epochs it is epoch 2's time.
    epoch2 = re.findall(r'epoch 2, training time: (\d+\.\d) sec', out)
    assert [row.split(' | ')[3] for row in rows] == epoch2
    assert png_size(out_dir / 'sweep.png') == (1000, 400)
    # One warning for the whole sweep, not one per device count.
    assert result.stderr.splitlines() == [
        "warning: no GPU found, so [cpu(0), cpu(1)] are simulated devices sharing this "
        "machine's CPU: the data parallelism is real, a speed-up is not expected"]
    assert out.endswith('wrote %s, %s\n' % (out_dir / 'sweep.md', out_dir / 'sweep.png'))
    assert sorted(os.listdir(out_dir)) == ['sweep.md', 'sweep.png']


@pytest.mark.parametrize('argv,expected', [
    (['--num-gpus', '0'], r'argument --num-gpus: --num-gpus must be at least 1, got 0'),
    (['--num-gpus'], r'argument --num-gpus: expected at least one argument'),
    ([], r'the following arguments are required: --num-gpus'),
    (['--num-gpus', '1', '2', '1'], r'--num-gpus 1 2 1 --device auto: device count 1 is listed '
                                    r'more than once'),
    (['--num-gpus', '1', '--lr-per-device', '0'], r'--lr-per-device must be a finite number '
                                                  r'above 0'),
    (['--num-gpus', '1', '--output-dir', '{tmp}/file/results'],
     r'--output-dir \S+/file/results: cannot create the folder \(Not a directory\)'),
    (['--num-gpus', '1', '--output-dir', '{tmp}/file'],
     r'--output-dir \S+/file is a regular file, not a folder; choose a folder$'),
    (['--num-gpus', '1', '--train-limit', '60001'],
     r'--train-limit=60001 is more than the 60000 training images'),
    # The 2-device setting's lr, 4e+38, is infinite in float32: found before the first trains.
    (['--num-gpus', '1', '2', '--lr-per-device', '2e38'],
     r"--lr-per-device 2e\+38 times 2 devices is 4e\+38, more than MXNet's float32 optimizer "
     r"can use \(3.4028235e\+38\); pass --lr-per-device 1.70141e\+38 or less$"),
    # Found before training, not when the results are written after the last setting.
    (['--num-gpus', '1', '--output-dir', '{tmp}/taken'],
     r'--output-dir \S+/taken holds \S+/taken/sweep.png, which is a folder, not a regular file, '
     r'and the sweep writes that name; move it away or choose another folder$'),
])
def test_sweep_bad_input_is_one_line_and_exit_2(argv, expected, tmp_path, capsys, monkeypatch,
                                                data_dir):
    monkeypatch.setattr(devices, 'num_gpus', lambda: 0)
    (tmp_path / 'file').write_text('a regular file\n')
    (tmp_path / 'taken' / 'sweep.png').mkdir(parents=True)
    argv = [a.format(tmp=tmp_path) for a in argv] + ['--data-dir', data_dir]
    if '--output-dir' not in argv:
        argv += ['--output-dir', str(tmp_path / 'out')]
    assert sweep.main(argv) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1, err
    assert err.startswith('python -m gluon_mgpu.sweep: error: ')
    assert re.search(expected, err), err
    assert 'running on' not in out


def _gluon_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == 'gluon_mgpu' and r.levelno == logging.WARNING]


def test_plan_without_gpu_warns_once_for_the_whole_sweep(monkeypatch, caplog):
    monkeypatch.setattr(devices, 'num_gpus', lambda: 0)
    plan = sweep.plan_sweep([1, 2, 4])
    assert [s['devices'] for s in plan] == [[mx.cpu(0)], [mx.cpu(0), mx.cpu(1)],
                                            [mx.cpu(i) for i in range(4)]]
    assert _gluon_warnings(caplog) == [
        "warning: no GPU found, so [cpu(0), cpu(1), cpu(2), cpu(3)] are simulated devices "
        "sharing this machine's CPU: the data parallelism is real, a speed-up is not expected"]


# Failures in a setting: main() with the training of every setting replaced (the network and
# its fit, which the train command's run builds), so nothing trains for real.

@pytest.fixture
def failing_sweep(monkeypatch, tmp_path, caplog):
    """Return ``run(argv, fail_at, error)``: the sweep CLI where setting ``fail_at`` raises."""
    monkeypatch.delenv('GLUON_MGPU_DEBUG', raising=False)
    monkeypatch.setattr(devices, 'num_gpus', lambda: 0)
    monkeypatch.setattr(gluon_mgpu.data, 'load_data_fashion_mnist', lambda batch_size, **kwargs: (
        types.SimpleNamespace(num_examples=1000), types.SimpleNamespace(num_examples=500)))

    def run(argv, fail_at, error):
        def data_parallel(args, rank, seed, record, contexts, *rest):
            def fit(train_iter, test_iter, handlers):
                n = len(contexts)
                if n == fail_at:
                    raise error
                return _row(n, 10.0 / n, 0.5)['history']
            return None, None, fit
        monkeypatch.setattr(runs, '_data_parallel', data_parallel)
        code = sweep.main(argv + ['--output-dir', str(tmp_path / 'out')])
        # Whatever happens, the no-GPU warning comes once.
        assert len(_gluon_warnings(caplog)) == 1
        return code
    return run


def test_the_sweep_trains_every_setting_with_the_train_commands_run(monkeypatch, tmp_path,
                                                                     capsys):
    from gluon_mgpu.commands import train
    monkeypatch.setattr(devices, 'num_gpus', lambda: 0)
    called = []

    def run(args, prog, *rest):
        called.append((prog, args.num_gpus, args.batch_size, args.lr, args.label))
        raise KeyboardInterrupt
    monkeypatch.setattr(runs, 'run', run)
    assert train.main(['--num-gpus', '2', '--batch-size', '8']) == 130
    assert sweep.main(['--num-gpus', '2', '1', '--batch-size-per-device', '8', '--output-dir',
                       str(tmp_path)]) == 130
    assert called == [('python -m gluon_mgpu.train', 2, 8, 0.2, None),
                      ('python -m gluon_mgpu.sweep', 2, 16, 0.2, '2 devices, ')]


def test_a_run_built_directly_takes_the_train_commands_defaults():
    from gluon_mgpu.commands import train
    defaults = {a.dest: a.default for a in train.build_parser()._actions}
    own = {k: v for k, v in vars(runs.Run).items()
           if not k.startswith('_') and k not in ('label', 'most_devices', 'devices', 'num_workers',
                                                  'outputs')}
    assert len(own) == 15
    assert own == {k: defaults[k] for k in own}


def _table_rows(text):
    return [line for line in text.splitlines() if re.match(r'\| \d+: \[', line)]


def test_a_diverged_setting_is_one_line_exit_1_and_the_finished_rows_are_kept(
        failing_sweep, tmp_path, capsys):
    nan = events.LossNotFiniteError(3, 0.2, float('nan'), epoch=1)
    assert failing_sweep(['--num-gpus', '1', '2', '4'], 2, nan) == 1
    out, err = capsys.readouterr()
    out_dir = tmp_path / 'out'
    assert err == (
        'python -m gluon_mgpu.sweep: error: the training loss became nan at epoch 1, step 3 in '
        'the 2-device setting with learning rate 0.2: training diverged; start again with a '
        'smaller learning rate, for example --lr-per-device 0.01; the finished settings (1 '
        'device) are in %s, %s\n' % (out_dir / 'sweep.md', out_dir / 'sweep.png'))
    table = (out_dir / 'sweep.md').read_text()
    assert _table_rows(table) == ['| 1: [cpu(0)] | 256 | 0.1 | 10.0 | 100.0 | 1.00 | 0.50 |']
    assert ('Note: The sweep stopped early (training diverged in the 2-device setting): only '
            'the settings that finished are listed.') in table
    assert out.endswith('\n\n' + table)
    assert 'running on: [cpu(0), cpu(1)] (global batch 512, lr 0.2)' in out
    assert 'cpu(3)' not in out
    assert png_size(out_dir / 'sweep.png') == (1000, 400)


def test_a_failure_in_the_first_setting_says_nothing_was_written(failing_sweep, tmp_path,
                                                                  capsys):
    nan = events.LossNotFiniteError(1, 0.5, float('inf'), epoch=2)
    assert failing_sweep(['--num-gpus', '1', '2', '--lr-per-device', '0.5'], 1, nan) == 1
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.sweep: error: the training loss became inf at epoch 2, step 1 in '
        'the 1-device setting with learning rate 0.5: training diverged; start again with a '
        'smaller learning rate, for example --lr-per-device 0.05; no setting had finished, so '
        'nothing was written\n')
    assert os.listdir(tmp_path / 'out') == []


def test_ctrl_c_is_one_line_exit_130_and_the_finished_rows_are_kept(failing_sweep, tmp_path,
                                                                     capsys):
    assert failing_sweep(['--num-gpus', '1', '2', '4'], 4, KeyboardInterrupt()) == 130
    out_dir = tmp_path / 'out'
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.sweep: interrupted (Ctrl-C) in the 4-device setting; the finished '
        'settings (1 and 2 devices) are in %s, %s\n' % (out_dir / 'sweep.md',
                                                       out_dir / 'sweep.png'))
    table = (out_dir / 'sweep.md').read_text()
    assert _table_rows(table) == [
        '| 1: [cpu(0)] | 256 | 0.1 | 10.0 | 100.0 | 1.00 | 0.50 |',
        '| 2: [cpu(0), cpu(1)] | 512 | 0.2 | 5.0 | 200.0 | 2.00 | 0.50 |']
    assert ('Note: The sweep stopped early (interrupted (Ctrl-C) in the 4-device setting): only '
            'the settings that finished are listed.') in table


def test_an_unexpected_error_is_one_line_with_the_setting_and_a_hint(failing_sweep, tmp_path,
                                                                      capsys):
    assert failing_sweep(['--num-gpus', '1', '2'], 2, RuntimeError('out of memory')) == 1
    out_dir = tmp_path / 'out'
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.sweep: error: unexpected RuntimeError: out of memory (in the '
        '2-device setting); the finished settings (1 device) are in %s, %s; rerun with --debug '
        '(or GLUON_MGPU_DEBUG=1) for the full traceback, and include it in a bug report\n'
        % (out_dir / 'sweep.md', out_dir / 'sweep.png'))
    assert ('Note: The sweep stopped early (unexpected RuntimeError in the 2-device setting)'
            in (out_dir / 'sweep.md').read_text())


def test_finished_rows_that_cannot_be_written_are_named_in_the_line(failing_sweep, monkeypatch,
                                                                    capsys):
    def refuse(rows, output_dir, stopped=None):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(sweep, 'write_outputs', refuse)
    assert failing_sweep(['--num-gpus', '1', '2'], 2, KeyboardInterrupt()) == 130
    out, err = capsys.readouterr()
    assert err == ('python -m gluon_mgpu.sweep: interrupted (Ctrl-C) in the 2-device setting; '
                   'the finished settings (1 device) could not be written: OSError: [Errno 28] '
                   'No space left on device\n')
    # They are still on standard output.
    assert '| 1: [cpu(0)] | 256 | 0.1 | 10.0 | 100.0 | 1.00 | 0.50 |' in out


def test_results_that_cannot_be_written_after_the_last_setting_are_one_line(
        failing_sweep, monkeypatch, tmp_path, capsys):
    path = tmp_path / 'out' / 'sweep.md'

    def full(rows, output_dir, stopped=None):
        raise files.OutputError(str(path), 'cannot write %s (No space left on device); free some '
                                'space on that disk or write somewhere else' % path, 28)
    monkeypatch.setattr(sweep, 'write_outputs', full)
    assert failing_sweep(['--num-gpus', '1', '2'], None, None) == 1
    out, err = capsys.readouterr()
    assert err == ('python -m gluon_mgpu.sweep: error: cannot write %s (No space left on device); '
                   'free some space on that disk or write somewhere else (the table is printed '
                   'above)\n' % path)
    assert _table_rows(out) == [
        '| 1: [cpu(0)] | 256 | 0.1 | 10.0 | 100.0 | 1.00 | 0.50 |',
        '| 2: [cpu(0), cpu(1)] | 512 | 0.2 | 5.0 | 200.0 | 2.00 | 0.50 |']


def test_a_data_error_in_a_later_setting_is_exit_2_and_keeps_the_finished_rows(
        failing_sweep, monkeypatch, tmp_path, capsys):
    load = gluon_mgpu.data.load_data_fashion_mnist

    def load_then_break(batch_size, **kwargs):
        if batch_size == 512:  # the 2-device setting
            raise gluon_mgpu.DataError('/data/train-images-idx3-ubyte.gz is not a complete gzip '
                                       'file; replace it with a fresh copy')
        return load(batch_size, **kwargs)
    monkeypatch.setattr(gluon_mgpu.data, 'load_data_fashion_mnist', load_then_break)
    assert failing_sweep(['--num-gpus', '1', '2'], None, None) == 2
    out_dir = tmp_path / 'out'
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.sweep: error: /data/train-images-idx3-ubyte.gz is not a complete '
        'gzip file; replace it with a fresh copy; the finished settings (1 device) are in %s, '
        '%s\n' % (out_dir / 'sweep.md', out_dir / 'sweep.png'))
    assert ('Note: The sweep stopped early (an error in the 2-device setting)'
            in (out_dir / 'sweep.md').read_text())


@pytest.mark.parametrize('how', ['flag', 'env'])
def test_debug_shows_the_traceback_first(failing_sweep, monkeypatch, capsys, how):
    argv = ['--num-gpus', '1']
    if how == 'flag':
        argv.append('--debug')
    else:
        monkeypatch.setenv('GLUON_MGPU_DEBUG', '1')
    assert failing_sweep(argv, 1, RuntimeError('out of memory')) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == 'Traceback (most recent call last):'
    assert any('in run_setting' in line for line in err)
    assert err[-2] == 'RuntimeError: out of memory'
    assert err[-1] == ('python -m gluon_mgpu.sweep: error: unexpected RuntimeError: out of memory '
                       '(in the 1-device setting); no setting had finished, so nothing was '
                       'written')


def test_53_a_folder_another_sweep_writes_into_or_whose_files_cannot_exist_is_refused(
        tmp_path, capsys, monkeypatch, data_dir):
    monkeypatch.setattr(devices, 'num_gpus', lambda: 0)
    argv = ['--num-gpus', '1', '--train-limit', '16', '--test-limit', '16', '--epochs', '1',
            '--batch-size-per-device', '8', '--data-dir', data_dir, '--output-dir']
    out_dir = str(tmp_path / 'out')
    os.mkdir(out_dir)
    with files.lock_file(os.path.join(out_dir, '.sweep.md.lock'), 'x'):  # a sweep writing it
        assert sweep.main(argv + [out_dir]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ('', 'python -m gluon_mgpu.sweep: error: --output-dir %s: %s/sweep.md is '
                              'in use by another run (pid %d); wait for it to end, or write '
                              'elsewhere\n' % (out_dir, out_dir, os.getpid()))
    assert os.listdir(out_dir) == []
    long_dir = str(tmp_path) + '/' + '/'.join(['d' * 200] * 19)
    long_dir += '/' + 'e' * (4080 - len(long_dir) - 1)  # sweep.md's temporary: more than 4095
    assert sweep.main(argv + [long_dir]) == 2
    out, err = capsys.readouterr()
    size = len(os.path.join(long_dir, '.sweep.md.XXXXXXXX.tmp'))
    assert (out, err) == ('', 'python -m gluon_mgpu.sweep: error: --output-dir %s: %s/sweep.md: '
                              'the path of the temporary file written beside it first is %d bytes '
                              'long, more than the 4095 the system allows; use a shorter path\n'
                              % (long_dir, long_dir, size))
