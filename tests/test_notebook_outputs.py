"""The notebooks' committed outputs are what their committed code prints (docs/notebooks.md).

``make notebooks`` (tools/execute_notebooks.py) executes each English notebook from a fresh
kernel, gives its Chinese twin the same outputs, and records in every code cell the hash of its
code. An output is stale when its cell's code changed since (or the cell is new), when the cells
did not run top to bottom in one kernel, or when a twin's outputs are not the English one's. The
cells whose outputs do not depend on training run again here and must print what is committed:
exactly on the machine that executed the notebook (its CPU, oneDNN's kernels, its threads, as
the notebook's metadata records them); elsewhere the same words, each number within a relative
1e-4 (``Out[4]``'s tolerance against the book), but for the cells named below.
Markdown cells are free: prose and the tables ``book_table.py --tables`` writes are not outputs.
Notebooks without outputs pass with nothing to compare.
"""
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tools'))
import execute_notebooks as runner  # noqa: E402

TWINS = sorted(runner.NOTEBOOKS.items())
# The cells whose outputs training makes: the training cells and what reads the trained net.
TRAINED = {'multiple-gpus-gluon': 'train-1',  # this cell and every one after it
           'three-ways-to-split': {'train-scratch', 'layers-train', 'channels-train'}}
# Elsewhere than on the machine that executed the notebook, these print that machine's own
# numbers: its thread choice (not compared there), differences of float32 rounding between two
# ways of computing the same thing (only the words compared).
THREADS = 'threads'
ROUNDING = {'scratch-vs-gluon', 'layers-micro', 'channels-equal'}
NUMBER = re.compile(r'-?\d+(?:\.\d+)?(?:e[-+]?\d+)?')


def _read(name):
    return nbformat.read(runner.path_of(name), as_version=4)


def _code(nb):
    return [c for c in nb.cells if c.cell_type == 'code']


def _tag(cell):
    return (cell.metadata.get('tags') or ['untagged'])[0]


def stale(nb):
    """What is stale in notebook ``nb``: one line per problem, naming the cell."""
    executed = 'gluon_mgpu' in nb.metadata
    problems = []
    if executed != bool(nb.cells and runner.HEADER_TAG in nb.cells[0].metadata.get('tags', [])):
        problems.append('the first cell is %s make notebooks\' header, but the notebook %s its '
                        'record' % (('not', 'holds') if executed else ('', 'lacks')))
    for i, cell in enumerate(_code(nb), 1):
        recorded = cell.metadata.get('gluon_mgpu', {}).get('code_sha256')
        if not executed:
            if cell.outputs or cell.execution_count is not None or recorded:
                problems.append('%s: an output, but no record of make notebooks' % _tag(cell))
        elif recorded is None:
            problems.append('%s: new since make notebooks ran' % _tag(cell))
        elif recorded != runner.code_hash(cell.source):
            problems.append('%s: its code changed since make notebooks ran' % _tag(cell))
        elif cell.execution_count != i:
            problems.append('%s: In [%s], not In [%d]: not executed top to bottom in one kernel'
                            % (_tag(cell), cell.execution_count, i))
    return problems


@pytest.mark.parametrize('name', [n for pair in TWINS for n in pair])
def test_no_committed_output_is_stale(name):
    nb = _read(name)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == 'python3'
    assert stale(nb) == [], 'run make notebooks (docs/notebooks.md)'


def _executed_copy(nb):
    """``nb`` as make notebooks leaves it, outputs aside: header, hashes, execution counts."""
    nb = runner.clean(copy.deepcopy(nb))
    nb.cells.insert(0, nbformat.v4.new_markdown_cell('header', metadata={
        'tags': [runner.HEADER_TAG]}))
    nb.metadata['gluon_mgpu'] = {'commit': '0' * 40}
    for i, cell in enumerate(_code(nb), 1):
        cell.execution_count = i
        cell.metadata['gluon_mgpu'] = {'code_sha256': runner.code_hash(cell.source)}
    return nb


def test_a_changed_or_added_cell_is_stale():
    nb = _executed_copy(_read('multiple-gpus-gluon'))
    assert stale(nb) == []
    # A comment is no change of code; a changed value is.
    _code(nb)[1].source += '  # a comment'
    nb.cells[5].source += '\n'  # markdown: free
    assert stale(nb) == []
    _code(nb)[1].source = _code(nb)[1].source.replace('print(', 'print(1, ')
    cell = nbformat.v4.new_code_cell('x = 1', metadata={'tags': ['added']})
    nb.cells.append(cell)
    assert stale(nb) == ['threads: its code changed since make notebooks ran',
                         'added: new since make notebooks ran']
    nb = _executed_copy(_read('multiple-gpus-gluon'))
    _code(nb)[3].execution_count = 9
    assert stale(nb) == ['network: In [9], not In [4]: not executed top to bottom in one kernel']
    nb = runner.clean(_read('three-ways-to-split'))
    _code(nb)[0].outputs = [nbformat.v4.new_output('stream', name='stdout', text='hand-made\n')]
    assert stale(nb) == ['imports: an output, but no record of make notebooks']


@pytest.mark.parametrize('en,zh', TWINS)
def test_the_chinese_twin_holds_the_english_outputs(en, zh):
    en, zh = _read(en), _read(zh)
    assert [(c.outputs, c.execution_count, c.metadata.get('gluon_mgpu')) for c in _code(en)] == \
        [(c.outputs, c.execution_count, c.metadata.get('gluon_mgpu')) for c in _code(zh)]
    assert en.metadata.get('gluon_mgpu') == zh.metadata.get('gluon_mgpu')


def _fixed(name, nb):
    """The code cells of ``nb`` whose outputs do not depend on training, by position."""
    cells = _code(nb)
    if isinstance(TRAINED[name], str):
        first = [_tag(c) for c in cells].index(TRAINED[name])
        return list(range(first))
    return [i for i, c in enumerate(cells) if _tag(c) not in TRAINED[name]]


def _shown(output):
    """What an output shows, without its In/Out number."""
    return (output.output_type, output.get('name'), output.get('text'), output.get('data'))


def _masked(output):
    text = json.dumps(_shown(output), sort_keys=True)
    return NUMBER.sub('#', text), [float(v) for v in NUMBER.findall(text)]


def _rerun(name, nb, monkeypatch):
    """The code cells of ``nb`` up to its last fixed one, executed as make notebooks does."""
    nb = runner.clean(copy.deepcopy(nb))
    last = _code(nb)[max(_fixed(name, nb))]
    nb.cells = nb.cells[:[id(c) for c in nb.cells].index(id(last)) + 1]
    monkeypatch.setenv('GLUON_MGPU_QUICK', 'smoke' if name == 'multiple-gpus-gluon' else '1')
    monkeypatch.delenv('GLUON_MGPU_CHECKPOINTS', raising=False)
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
        p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))
    NotebookClient(nb, timeout=1200, kernel_name='python3', record_timing=False,
                   resources={'metadata': {'path': os.path.join(ROOT, 'notebooks')}}).execute()
    return _code(nb)


@pytest.mark.parametrize('name', [  # three-ways-to-split's cells run again: make test-slow
    pytest.param(n, marks=pytest.mark.slow) if n == 'three-ways-to-split' else n
    for n in sorted(runner.NOTEBOOKS)])
def test_outputs_that_do_not_depend_on_training_are_what_the_code_prints(name, monkeypatch):
    nb = _read(name)
    fixed = _fixed(name, nb)
    committed = [_code(nb)[i] for i in fixed]
    if 'gluon_mgpu' not in nb.metadata:  # nothing executed, nothing to compare
        assert [c.outputs for c in committed] == [[]] * len(committed)
        return
    rerun = _rerun(name, nb, monkeypatch)
    same_machine = nb.metadata.gluon_mgpu.get('machine') == runner.machine()
    for i in fixed:
        cell, new = _code(nb)[i], rerun[i]
        assert _tag(cell) == _tag(new)
        if same_machine:
            assert [_shown(o) for o in cell.outputs] == [_shown(o) for o in new.outputs], \
                _tag(cell)
        elif _tag(cell) != THREADS:
            ours, theirs = ([_masked(o) for o in c.outputs] for c in (cell, new))
            assert [t for t, _ in ours] == [t for t, _ in theirs], _tag(cell)
            for (_, a), (_, b) in zip(ours, theirs):
                if _tag(cell) not in ROUNDING:
                    np.testing.assert_allclose(a, b, rtol=1e-4, atol=0, err_msg=_tag(cell))


def test_the_runner_refuses_bad_input_in_one_line(capsys, monkeypatch):
    assert runner.main(['three-ways']) == 2
    assert capsys.readouterr().err == (
        "%s: error: no English notebook 'three-ways'; name multiple-gpus-gluon or "
        "three-ways-to-split (or none: both)\n" % runner.PROG)
    monkeypatch.setenv('GLUON_MGPU_QUICK', 'yes')
    assert runner.main(['three-ways-to-split']) == 2
    assert capsys.readouterr().err == (
        "%s: error: GLUON_MGPU_QUICK must be 0 (the book's settings), 1 (a quick look) or "
        "smoke, got 'yes'; unset it for the book's settings\n" % runner.PROG)


def test_epochs_trained_by_other_code_are_not_continued(tmp_path):
    folder = str(tmp_path)
    hashes = [runner.code_hash(c.source) for c in _code(_read('multiple-gpus-gluon'))]
    assert runner._run_record(folder, 'a' * 40, hashes, {})['code'] == hashes  # a new run
    os.mkdir(os.path.join(folder, 'train-1'))
    open(os.path.join(folder, 'train-1', 'epoch-0001.json'), 'w').close()
    resumed = runner._saved_epochs(folder)
    assert resumed == {'train-1': 1}
    assert runner._run_record(folder, 'b' * 40, hashes, resumed)['commit'] == 'a' * 40
    with pytest.raises(runner.UsageError, match=re.escape(
            "%s holds epochs trained at commit aaaaaaa, and the notebook's code changed since; "
            "delete the folder to train again (rm -r %s)" % (folder, folder))):
        runner._run_record(folder, 'b' * 40, hashes[:-1], resumed)
    os.remove(os.path.join(folder, 'run.json'))
    with pytest.raises(runner.UsageError, match='holds checkpoints but no run.json'):
        runner._run_record(folder, 'b' * 40, hashes, resumed)


def test_epochs_trained_on_another_machine_are_not_continued(tmp_path, monkeypatch):
    # The header names one machine: another thread count (or CPU, or kernel cap) would give the
    # epochs still to train other float32 numbers than the kept ones had.
    folder = str(tmp_path)
    hashes = [runner.code_hash(c.source) for c in _code(_read('multiple-gpus-gluon'))]
    monkeypatch.setenv('OMP_NUM_THREADS', '2')
    runner._run_record(folder, 'a' * 40, hashes, {})
    resumed = {'train-1': 1}
    assert runner._run_record(folder, 'b' * 40, hashes, resumed)['commit'] == 'a' * 40
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    with pytest.raises(runner.UsageError, match=re.escape(
            "%s holds epochs trained at commit aaaaaaa, and the machine (CPU, kernels or threads) "
            "changed since; delete the folder to train again (rm -r %s)" % (folder, folder))):
        runner._run_record(folder, 'b' * 40, hashes, resumed)


@pytest.mark.parametrize('lang', ['en', 'zh'])
def test_the_header_names_the_python_of_the_execution(lang):
    name = 'multiple-gpus-gluon'
    info = _read(name).metadata['gluon_mgpu']  # written before executions recorded their Python
    assert 'Python' not in runner.header(info, lang).split('\n\n')[0]
    first = runner.header(dict(info, python='3.13.5, numpy 2.4.6'), lang).split('\n\n')[0]
    assert first.endswith('OMP_NUM_THREADS=2; Python 3.13.5, numpy 2.4.6.*' if lang == 'en' else
                          'OMP_NUM_THREADS=2；Python 3.13.5, numpy 2.4.6。*')


def test_the_checkpoints_folder_is_one_absolute_folder_and_never_empty(tmp_path, monkeypatch,
                                                                       capsys):
    # The kernel runs in notebooks/: a relative --checkpoints was resolved there for the epochs
    # and here for the lock and run.json, two folders; '' meant the working folder.
    given = []
    monkeypatch.setattr(runner, 'execute', lambda name, folder: given.append((name, folder)))
    monkeypatch.chdir(tmp_path)
    assert runner.main(['multiple-gpus-gluon', '--checkpoints', 'epochs']) == 0
    assert given == [('multiple-gpus-gluon', str(tmp_path / 'epochs'))]
    assert runner.main(['--checkpoints', '']) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tools/execute_notebooks.py: error: argument --checkpoints: --checkpoints is empty ('';"
        " an unset variable?); for example --checkpoints ~/notebook-epochs (see --help)")


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_training_is_one_line_keeps_the_epochs_and_writes_no_notebook(tmp_path,
                                                                                   signum):
    # nbclient's own handler shut the kernel down: the cell failed as a dead kernel, nbclient's
    # second clean-up raised an AssertionError, and the script said "unexpected AssertionError".
    notebooks = [runner.path_of(n) for pair in runner.NOTEBOOKS.items() for n in pair]
    before = {path: open(path, 'rb').read() for path in notebooks}
    folder = tmp_path / 'epochs'
    run = subprocess.Popen([sys.executable, os.path.join(ROOT, 'tools', 'execute_notebooks.py'),
                            'multiple-gpus-gluon', '--checkpoints', str(folder)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, GLUON_MGPU_QUICK='smoke'))
    first = folder / 'smoke' / 'multiple-gpus-gluon' / 'train-1' / 'epoch-0001.json'
    deadline = time.time() + 600
    while not first.exists():
        assert run.poll() is None and time.time() < deadline, run.communicate()
        time.sleep(0.5)
    run.send_signal(signum)
    out, err = run.communicate(timeout=120)
    lines = [l for l in err.splitlines() if 'running over TCP without encryption' not in l]
    assert (run.returncode, lines) == (128 + signum, [
        'tools/execute_notebooks.py: %s; the finished epochs are saved, give the same command '
        'again to continue' % ('terminated (SIGTERM)' if signum == signal.SIGTERM
                               else 'interrupted (Ctrl-C)')])
    assert first.exists()
    assert {path: open(path, 'rb').read() for path in notebooks} == before


def test_a_folder_another_execution_holds_is_refused_naming_this_scripts_flag(
        tmp_path, monkeypatch, capsys):
    # The checkpoint folder's lock is the train command's; the fix names this script's flag.
    from gluon_mgpu.handlers import checkpoint
    monkeypatch.setenv('GLUON_MGPU_QUICK', 'smoke')
    folder = tmp_path / 'smoke' / 'multiple-gpus-gluon'
    held = checkpoint.lock_dir(str(folder))
    try:
        code = runner.main(['multiple-gpus-gluon', '--checkpoints', str(tmp_path)])
    finally:
        held.release()
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        '%s: error: %s is in use by another run (pid %d); wait for it to end, or pass another '
        '--checkpoints' % (runner.PROG, folder, os.getpid()))
