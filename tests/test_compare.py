import gzip
import json
import os
import re
import struct
import subprocess
import sys

import mxnet as mx
import pytest
from mxnet import nd

from gluon_mgpu.commands import compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, 'docs', 'book-comparison.md')


@pytest.fixture(scope='module')
def cells():
    return compare.chapter_cells([mx.cpu(0), mx.cpu(1)])


def _by(rows, cell):
    return [r for r in rows if r['cell'] == cell]


def test_book_data_parses_to_the_printed_shapes():
    assert [len(compare.printed_numbers(t)) for t in compare.BOOK['out4']] == [20, 20]
    assert compare.printed_numbers(compare.BOOK['out5'])[:3] == ['-0.01473444', '-0.01073093',
                                                                 '-0.01042483']
    assert len(compare.printed_numbers(compare.BOOK['out5'])) == 9


def test_fresh_process_reproduces_the_books_weights_digit_for_digit(cells):
    assert cells['devices'] == ['cpu(0)', 'cpu(1)']
    for weights in cells['weights']:
        assert compare.format_like_book(weights) == compare.BOOK['out5']


def test_deterministic_rows_match_the_book(cells):
    rows = compare.deterministic_rows(cells)
    assert [r['status'] for r in _by(rows, 'Out[4]')] == ['match', 'match']
    assert [r['status'] for r in _by(rows, 'Out[5]')] == ['match', 'match', 'match']
    assert [r['diff'] for r in _by(rows, 'Out[5]')][:2] == ['9/9 printed equal'] * 2
    for row in _by(rows, 'Out[4]'):
        assert float(re.fullmatch(r'max rel (\S+)', row['diff']).group(1)) <= compare.OUT4_RTOL
    # cpu(0) is one of the simulated devices, so reading without a device does not fail there.
    [read] = _by(rows, 'In [5]')
    assert (read['book'], read['ours'], read['status']) == (
        'not initialized on cpu(0)', 'no error: cpu(0) holds a replica', 'explained')


def test_rows_catch_a_consumed_random_state():
    # Guards the test above: one random number drawn first and the book's values are gone.
    nd.random.uniform(shape=(1,)).wait_to_read()
    rows = compare.deterministic_rows(
        compare.chapter_cells([mx.cpu(0), mx.cpu(1)], fresh_process=False))
    assert [r['status'] for r in _by(rows, 'Out[4]')] == ['mismatch', 'mismatch']
    assert [r['status'] for r in _by(rows, 'Out[5]')] == ['mismatch', 'mismatch', 'match']


def test_reading_outside_the_devices_prints_the_books_line():
    # With devices that leave cpu(0) free, the book's try/except prints its line.
    rows = compare.deterministic_rows(compare.chapter_cells([mx.cpu(1), mx.cpu(2)]))
    [read] = _by(rows, 'In [5]')
    assert (read['ours'], read['status']) == ('not initialized on cpu(0)', 'match')
    assert [r['status'] for r in _by(rows, 'Out[5]')] == ['match'] * 3


def _run(*args):
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.compare', *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)))


@pytest.mark.slow
def test_cli_prints_the_table():
    result = _run()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ('devices: the book [gpu(0), gpu(1)]; ours [cpu(0), cpu(1)], simulated '
                        'on the CPU (no GPU used)')
    assert lines[1].split() == ['cell', 'what', "book's", 'value', 'ours', 'difference',
                                'verdict']
    out5 = [l for l in lines if l.startswith('Out[5]')]
    assert len(out5) == 3 and all(l.endswith('match (every printed digit)') or
                                  l.endswith('match') for l in out5)
    # The rows of the record and the accuracy table are docs/book-comparison.md's, not here.
    assert not any('not run' in l for l in lines)
    [step] = [l for l in lines if "the book's train, 2 epochs of 5 batches (64, ..., 16) on 2 "
              'devices' in l]
    assert step.endswith('match (bit for bit)')
    assert 'max abs 0.0e+00 (losses, 76 + 34 arrays per device)' in step
    assert lines[-2].startswith('note: The step: the chapter\'s train as printed')
    assert lines[-1] == compare.ACCURACY_TABLE
    assert lines[-1] == ("the book's accuracy table beside the published GPU runs and our runs "
                         'over seeds: docs/book-comparison.md (from the record, '
                         'docs/records/book-table.jsonl)')
    # --json: the same run as data (what lab/book_table.py --page puts on the page).
    as_data = _run('--json')
    assert as_data.returncode == 0, as_data.stderr
    found = json.loads(as_data.stdout)
    table = compare.format_table(found['rows']).splitlines()
    assert [found['devices']] + table == lines[:1 + len(table)]
    assert ['note: ' + n for n in found['notes']] == lines[2 + len(table):-1]
    assert (found['book'], found['ours']['devices']) == (
        json.loads(json.dumps(compare.BOOK)), ['cpu(0)', 'cpu(1)'])
    assert [len(found['ours'][k]) for k in ('out4', 'out5')] == [2, 2]
    assert found['ours']['out5'][0] == found['ours']['out5'][1]  # one replica, printed twice


def test_committed_page_agrees_with_a_run_now(cells):
    # docs/book-comparison.md shows the rows the command prints (lab/book_table.py --page puts
    # them there); its tables of the records are the lab's (lab/tests/test_book_table.py).
    with open(DOC) as f:
        page = f.read()
    [generated] = re.findall(r'<!-- begin compare: generated -->\n(.*?)\n<!-- end', page, re.S)
    [shown] = re.findall(r'<!-- begin compare: rows -->\n(.*?)<!-- end', page, re.S)
    assert generated.startswith('Generated by `lab/book_table.py --page` on ')
    for row in compare.deterministic_rows(cells):
        # Out[4]'s last digits depend on the machine's arithmetic: only the book's side is fixed.
        keys = ('cell', 'what', 'book') if row['cell'] == 'Out[4]' else (
            'cell', 'what', 'book', 'ours')
        line = '| %s |' % ' | '.join(row[k] for k in keys)
        assert line in shown, line


def test_cli_reads_the_data_before_the_cells(tmp_path, data_dir):
    # Only the files' presence was checked: a damaged or small data set failed after the
    # chapter's cells had run, as 'unexpected DataError ... bug report' or a ValueError naming
    # train_limit, which is no flag of compare.
    for name in os.listdir(data_dir):
        with gzip.open(os.path.join(data_dir, name)) as f:
            head = f.read(16 if 'images' in name else 8)
            count = 100 if 'train' in name else 50
            body = f.read(count * (784 if 'images' in name else 1))
        with gzip.open(tmp_path / name, 'wb') as f:
            f.write(head[:4] + struct.pack('>I', count) + head[8:] + body)
    result = _run('--data-dir', str(tmp_path))
    assert (result.returncode, result.stdout) == (2, '')
    assert result.stderr == (
        'python -m gluon_mgpu.compare: error: --data-dir %s: the step row trains on 272 images '
        'and tests on 200, more than it holds (train_limit=272 is more than the 100 training '
        'images); give the whole data set\n' % tmp_path)
    damaged = tmp_path / 't10k-labels-idx1-ubyte.gz'
    damaged.write_bytes(damaged.read_bytes()[:-9])
    result = _run('--data-dir', str(tmp_path))
    assert (result.returncode, result.stdout) == (2, '')
    assert result.stderr.startswith('python -m gluon_mgpu.compare: error: --data-dir %s: %s is not '
                                    'a complete gzip file' % (tmp_path, damaged)), result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize('args,expected', [
    (['--device', 'tpu'], r"python -m gluon_mgpu.compare: error: argument --device: invalid "
                          r"choice: 'tpu' \(choose from '?auto'?, '?gpu'?, '?cpu'?\) "
                          r"\(see --help\)"),
    # The record is read by lab/book_records.py, no more by the command.
    (['--record', 'docs/records/book-table.jsonl'],
     r'python -m gluon_mgpu.compare: error: unrecognized arguments: --record '
     r'docs/records/book-table.jsonl \(see --help\)'),
    (['--full'], r'python -m gluon_mgpu.compare: error: unrecognized arguments: --full \(see '
                 r'--help\)'),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, expected):
    result = _run(*args)
    assert result.returncode == 2
    assert result.stdout == ''
    assert len(result.stderr.splitlines()) == 1
    assert re.fullmatch(expected, result.stderr.strip()), result.stderr


def test_without_d2lzh_the_command_names_what_to_install_in_one_line_before_mxnet():
    # After a plain pip install . (d2lzh is in the test extra only): d2lzh hidden.
    done = subprocess.run([sys.executable, '-c', (
        'import runpy, sys\n'
        'sys.modules["d2lzh"] = None\n'
        'sys.argv = ["x"]\n'
        'try:\n'
        '    runpy.run_module("gluon_mgpu.compare", run_name="__main__", alter_sys=True)\n'
        'except SystemExit as e:\n'
        '    print(e.code, "mxnet" in sys.modules)\n')],
        capture_output=True, text=True, timeout=120)
    assert done.stdout == '2 False\n'
    assert done.stderr == (
        "python -m gluon_mgpu.compare: error: the step row trains the book's own network, from "
        "its package d2lzh, which is not installed for %s; install it with pip install "
        "d2lzh==1.0.0 (or gluon_mgpu's test extra: pip install '.[test]')\n" % sys.executable)
    setup = open(os.path.join(ROOT, 'setup.py')).read()
    assert "'test': ['pytest', '%s'," % compare.BOOK_PACKAGE in setup
