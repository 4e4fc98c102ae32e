import os
import re
import subprocess
import sys

import mxnet as mx
import pytest
from mxnet import nd

from gluon_mgpu import compare

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


def test_training_rows_say_not_run_without_full():
    rows = compare.training_rows([mx.cpu(0), mx.cpu(1)])
    assert len(rows) == 11
    assert {r['ours'] for r in rows} == {'not run'}
    assert {r['status'] for r in rows} == {'not run'}
    assert [r['book'] for r in _by(rows, 'In [7]')] == ['0.86', '0.91', '0.91', '0.93', '61.6']
    assert [r['book'] for r in _by(rows, 'In [8]')] == ['0.77', '0.86', '0.88', '0.89', '31.6']
    [speedup] = _by(rows, 'In [7]/[8]')
    assert speedup['book'] == '1.95x (PyTorch ed. 1.53x)'
    assert speedup['verdict'].startswith('not run (pass --full); cpu(0), cpu(1) are simulated '
                                         'devices: they share the same CPU cores')
    assert speedup['verdict'].endswith('so no speed-up is expected')
    [on_gpus] = _by(compare.training_rows([mx.gpu(0), mx.gpu(1)]), 'In [7]/[8]')
    assert on_gpus['verdict'] == 'not run (pass --full)'


@pytest.mark.slow
def test_training_rows_judge_a_real_run(data_dir):
    runs = {}
    for devices in ([mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]):
        runs[len(devices)] = (devices, compare.train_book_setting(
            devices, data_dir=data_dir, train_limit=8, test_limit=8, num_epochs=4))
    rows = compare.training_rows([mx.cpu(0), mx.cpu(1)], runs)
    for n, cell in ((1, 'In [7]'), (2, 'In [8]')):
        acc_rows = _by(rows, cell)[:4]
        for e, (row, book) in enumerate(zip(acc_rows, compare.BOOK['training'][n]['test_acc'])):
            ours = runs[n][1][e]['test_acc']
            band = compare.ACC_BAND_FIRST_EPOCH if e == 0 else compare.ACC_BAND
            assert row['ours'] == '%.2f' % ours
            assert row['status'] == ('match' if abs(ours - book) <= band + 1e-9 else 'mismatch')
        assert _by(rows, cell)[4]['status'] == 'not comparable'
    [speedup] = _by(rows, 'In [7]/[8]')
    one, two = (sum(r['seconds'] for r in runs[n][1]) / 4 for n in (1, 2))
    assert speedup['ours'].startswith('%.2fx' % (one / two))
    assert speedup['status'] == 'not comparable'
    assert 'simulated devices' in speedup['verdict']


def _run(*args):
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.compare', *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)))


def test_cli_prints_the_table_and_writes_the_page(tmp_path):
    out = tmp_path / 'comparison.md'
    result = _run('--output', str(out))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ('devices: the book [gpu(0), gpu(1)]; ours [cpu(0), cpu(1)], simulated '
                        'on the CPU (no GPU used)')
    assert lines[1].split() == ['cell', 'what', "book's", 'value', 'ours', 'difference',
                                'verdict']
    out5 = [l for l in lines if l.startswith('Out[5]')]
    assert len(out5) == 3 and all(l.endswith('match (every printed digit)') or
                                  l.endswith('match') for l in out5)
    assert sum(l.endswith('not run (pass --full)') for l in lines) == 10
    assert lines[-1] == 'wrote %s' % out
    page = out.read_text()
    assert '| Out[5] | first conv weight, device 0 | 1x3x3: -0.01473444 ... -0.00601594 |' in page
    assert compare.BOOK['out5'] in page


def test_committed_page_agrees_with_a_run_now(cells):
    rows = compare.deterministic_rows(cells) + compare.training_rows([mx.cpu(0), mx.cpu(1)])
    page = open(DOC).read()
    assert 'python -m gluon_mgpu.compare --output docs/book-comparison.md' in page
    for row in rows:
        # Out[4]'s last digits depend on the machine's arithmetic: only the book's side is fixed.
        keys = ('cell', 'what', 'book') if row['cell'] == 'Out[4]' else (
            'cell', 'what', 'book', 'ours')
        line = '| %s |' % ' | '.join(row[k] for k in keys)
        assert line in page, line


@pytest.mark.parametrize('args,expected', [
    (['--device', 'tpu'], r"python -m gluon_mgpu.compare: error: argument --device: invalid "
                          r"choice: 'tpu' \(choose from '?auto'?, '?gpu'?, '?cpu'?\) \(see --help\)"),
    (['--output', '/no/such/folder/x.md'], r'python -m gluon_mgpu.compare: error: --output '
                                           r'/no/such/folder/x.md: folder /no/such/folder does '
                                           r'not exist; create it or pass another path'),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, expected):
    result = _run(*args)
    assert result.returncode == 2
    assert result.stdout == ''
    assert len(result.stderr.splitlines()) == 1
    assert re.fullmatch(expected, result.stderr.strip()), result.stderr
