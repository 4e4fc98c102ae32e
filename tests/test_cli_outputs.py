"""The command line's progress, --quiet, --metrics-json and --plot, run for real on tiny data."""
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import jsonschema
import pytest

from gluon_mgpu.handlers import events, metrics
from gluon_mgpu import thread_settings, training
from gluon_mgpu.commands.train import main
from test_plotting import png_size

TINY = ['--num-gpus', '2', '--epochs', '2', '--batch-size', '8', '--train-limit', '16',
        '--test-limit', '8', '--seed', '0']
EPOCH_LINE = r'epoch %d, training time: \d+\.\d sec, test_acc (0|1)\.\d\d'
SUMMARY_LINE = r'test acc: (0|1)\.\d\d, \d+\.\d sec/epoch on \[cpu\(0\), cpu\(1\)\]'


def test_piped_run_writes_plain_lines_metrics_and_plots(tmp_path, data_dir):
    json_path, plot_path = tmp_path / 'run.json', tmp_path / 'curves.svg'
    result = subprocess.run(
        [sys.executable, '-m', 'gluon_mgpu.train', *TINY, '--data-dir', data_dir,
         '--metrics-json', str(json_path), '--plot', str(plot_path)],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    # Not a terminal: no bar, no carriage return, nothing from tqdm.
    assert '\r' not in result.stdout and 'img/s' not in result.stdout
    assert '\r' not in result.stderr and 'img/s' not in result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == 'running on: [cpu(0), cpu(1)]'
    doc = json.loads(json_path.read_text())
    assert list(jsonschema.Draft202012Validator(metrics.SCHEMA).iter_errors(doc)) == []
    assert doc['status'] == 'finished' and doc['devices'] == ['cpu(0)', 'cpu(1)']
    # The pytest process's OMP_NUM_THREADS was set by its own gluon_mgpu (for 1 device): the
    # command chose again, for its 2 simulated devices.
    # (Unless whoever runs the tests set OMP_NUM_THREADS or MXNET_CPU_TEMP_COPY: theirs stay.)
    cores, ours = len(os.sched_getaffinity(0)), thread_settings()
    assert doc['threads'] == {
        'omp_num_threads': max(1, cores // 2) if ours['source'] == 'gluon_mgpu'
        else ours['omp_num_threads'], 'cores': cores, 'source': ours['source'], 'devices': 2,
        'cpu_temp_copy': ours['cpu_temp_copy'],
        'temp_copy_source': 'mxnet' if 'MXNET_CPU_TEMP_COPY' not in os.environ else 'user'}
    assert doc['arguments']['batch_size'] == 8 and doc['arguments']['lr'] == 0.2
    assert [r['epoch'] for r in doc['history']] == [1, 2]
    # The printed lines are the file's numbers.
    assert lines[1:3] == [events.format_epoch(r) for r in doc['history']]
    assert lines[3] == doc['summary']['line'] == metrics.format_summary(
        doc['history'], ['cpu(0)', 'cpu(1)'])
    assert re.fullmatch(SUMMARY_LINE, lines[3]) and len(lines) == 4
    for r in doc['history']:
        assert r['images_per_sec'] == pytest.approx(16 / r['seconds'])
        assert r['test_acc'] in {k / 8 for k in range(9)}
    assert doc['summary']['sec_per_epoch'] == pytest.approx(
        sum(r['seconds'] for r in doc['history']) / 2)
    assert plot_path.read_text().startswith('<?xml')
    assert png_size(tmp_path / 'curves.png') == (600, 400)
    assert sorted(os.listdir(tmp_path)) == ['curves.png', 'curves.svg', 'run.json']


def test_terminal_run_shows_a_progress_bar(data_dir):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, '-m', 'gluon_mgpu.train', *TINY,
                             '--data-dir', data_dir],
                            stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    out = b''
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    proc.stderr.close()
    text = out.decode()
    for label in ('epoch 1/2:', 'epoch 2/2:'):
        assert '\r' + label in text, text
    assert 'img/s' in text and re.search(r'loss=\d+\.\d{4}', text), text
    # What stays on the screen: the same lines as in a log (a terminal turns \n into \r\n).
    shown = [line.rsplit('\r', 1)[-1] for line in text.split('\r\n') if line]
    assert shown[0] == 'running on: [cpu(0), cpu(1)]'
    assert re.fullmatch(EPOCH_LINE % 1, shown[1]) and re.fullmatch(EPOCH_LINE % 2, shown[2])
    assert re.fullmatch(SUMMARY_LINE, shown[3]) and len(shown) == 4, shown


def test_quiet_prints_only_the_summary(capsys, data_dir):
    assert main(TINY + ['--epochs', '1', '--data-dir', data_dir, '--quiet']) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(SUMMARY_LINE + '\n', out), out


def test_a_run_that_stops_keeps_its_finished_epochs(monkeypatch, tmp_path, data_dir):
    evaluate = training.evaluate_accuracy
    calls = []

    def failing_second_time(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError('simulated crash in epoch 2')
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(training, 'evaluate_accuracy', failing_second_time)
    path = tmp_path / 'run.json'
    # main() turns the unexpected error into one line and exit code 1 (see test_bad_input).
    assert main(TINY + ['--data-dir', data_dir, '--metrics-json', str(path), '--quiet']) == 1
    doc = json.loads(path.read_text())
    assert list(jsonschema.Draft202012Validator(metrics.SCHEMA).iter_errors(doc)) == []
    assert (doc['status'], doc['summary']) == ('running', None)
    assert [r['epoch'] for r in doc['history']] == [1]
    assert os.listdir(tmp_path) == ['run.json']


@pytest.mark.parametrize('flag,name,expected', [
    ('--plot', 'file/curves.png', r'--plot {tmp}/file/curves.png: {tmp}/file is not a folder'),
    ('--metrics-json', 'file/run.json',
     r'--metrics-json {tmp}/file/run.json: {tmp}/file is not a folder'),
    ('--metrics-json', 'missing/run.json', r'folder {tmp}/missing does not exist; create it '),
    ('--plot', '', r'--plot {tmp}/: it is a folder; name a file in it'),
    ('--plot', 'curves.pdf', r'--plot {tmp}/curves.pdf: the name must end in \.png or \.svg; '
                             r'for example --plot curves\.png'),
])
def test_bad_output_paths_are_one_line_and_exit_2(flag, name, expected, tmp_path, capsys):
    (tmp_path / 'file').write_text('a regular file\n')
    assert main([flag, '%s/%s' % (tmp_path, name)]) == 2
    out, err = capsys.readouterr()
    assert out == '' and len(err.splitlines()) == 1, err
    assert err.startswith('python -m gluon_mgpu.train: error: argument %s: ' % flag), err
    assert re.search(expected.format(tmp=re.escape(str(tmp_path))), err), err
    assert sorted(os.listdir(tmp_path)) == ['file']


def test_sync_bn_trains_on_simulated_devices(tmp_path, data_dir):
    # It deadlocked on CPU contexts while both devices were issued from one thread (one shared
    # scratch pool), and the command refused it; now each device has its own pool
    # (gluon_mgpu.runtime.dispatch). That the statistics agree: tests/test_model.py.
    json_path = tmp_path / 'run.json'
    result = subprocess.run(
        [sys.executable, '-m', 'gluon_mgpu.train', *TINY, '--data-dir', data_dir, '--sync-bn',
         '--metrics-json', str(json_path)],
        capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if k != 'MXNET_ENGINE_TYPE'})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == 'running on: [cpu(0), cpu(1)]'
    assert [bool(re.fullmatch(EPOCH_LINE % e, line)) for e, line in zip((1, 2), lines[1:3])] \
        == [True, True], lines
    doc = json.loads(json_path.read_text())
    assert doc['status'] == 'finished' and doc['arguments']['sync_bn'] is True
