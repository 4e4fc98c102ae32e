"""Execute the notebooks from a fresh kernel and keep their outputs: ``make notebooks``.

Each English notebook runs top to bottom in a new kernel (nbclient) with this checkout first on
its path; its Chinese twin then gets its outputs cell by cell (their code cells are equal token
for token, comments aside: tests/test_notebooks.py), so that it is not trained twice. A first
markdown cell, written here, names the machine, the date, the commit and the setting; every code
cell records the hash of its code (``code_hash``), which tests/test_notebook_outputs.py checks.

The training cells of both notebooks save every epoch in the folder
``GLUON_MGPU_CHECKPOINTS``, set here to ``--checkpoints``/<setting>/<notebook>; stopped (Ctrl-C,
SIGTERM, a reboot), the same command executes the notebook again and those cells go on after
their last saved epoch. A notebook is written only once it has run to its end.

    .venv/bin/python tools/execute_notebooks.py                      # the book's settings: hours
    GLUON_MGPU_QUICK=1 .venv/bin/python tools/execute_notebooks.py   # minutes; not for committing
"""
import asyncio
import copy
import datetime
import hashlib
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'lab'))  # book_records, measuring
import gluon_mgpu  # noqa: E402,F401,I001  (first: it sets the threads the kernel inherits)
from gluon_mgpu import CommandError, Parser, UsageError, run_command  # noqa: E402
import numpy as np  # noqa: E402

import book_records  # noqa: E402
import measuring  # noqa: E402

PROG = 'tools/execute_notebooks.py'
NOTEBOOKS = {'multiple-gpus-gluon': 'multiple-gpus-gluon.zh',
             'three-ways-to-split': 'three-ways-to-split.zh'}
DEFAULT_CHECKPOINTS = os.path.join(os.path.expanduser('~'), '.cache', 'gluon_mgpu', 'notebooks')
SETTINGS = {'0': "the book's settings (in three-ways-to-split, 1 epoch per ResNet-18 split: its "
                 "settings cell)", '1': 'the quick look (GLUON_MGPU_QUICK=1)',
            'smoke': "the test suite's smoke setting (GLUON_MGPU_QUICK=smoke)"}
SETTINGS_ZH = {'0': '书中的设置（three-ways-to-split 中 ResNet-18 的两种拆分各训练 1 个迭代周期，见其设置单元）',
               '1': '快速试跑（GLUON_MGPU_QUICK=1）',
               'smoke': '测试套件的冒烟设置（GLUON_MGPU_QUICK=smoke）'}
HEADER_TAG = 'executed'  # the first cell, this script's: markdown, free of the staleness test


def path_of(name):
    return os.path.join(ROOT, 'notebooks', name + '.ipynb')


def code_hash(source):
    """sha256 of a code cell's tokens (kind and text), comments and blank lines aside: what its
    output depends on in the cell itself (a twin's Chinese comments give the English cell's
    hash). The same on every Python: an f-string is one string token, its text as written, as
    Python 3.9 to 3.11 read it (3.12 splits it into parts, PEP 701)."""
    offsets = [0]  # where each line of source starts
    for line in io.StringIO(source):
        offsets.append(offsets[-1] + len(line))
    kept, depth = [], 0
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = tokenize.tok_name[t.type]
        if kind == 'FSTRING_START':
            depth, start = depth + 1, start if depth else t.start
        elif kind == 'FSTRING_END':
            depth -= 1
            if not depth:
                text = source[offsets[start[0] - 1] + start[1]:offsets[t.end[0] - 1] + t.end[1]]
                kept.append(['STRING', text])
        elif not depth and kind not in ('COMMENT', 'NL'):
            kept.append([kind, t.string])
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()


def machine():
    """What a float32 output depends on beyond the code: the CPU, oneDNN's kernels, the threads
    (as the book table's record names them, ``book_records.machine_of``)."""
    return dict(measuring.kernel_setting(), cpu=measuring.cpu_model())


def _git(*args):
    return subprocess.run(['git', '-C', ROOT] + list(args), capture_output=True, text=True,
                          check=True).stdout.strip()


def code_state():
    """``(commit, changed)``: HEAD, and whether gluon_mgpu/ differs from it."""
    return _git('rev-parse', 'HEAD'), bool(_git('status', '--porcelain', '--', 'gluon_mgpu'))


def _read(path):
    import nbformat
    return nbformat.read(path, as_version=4)


def _write(nb, path):
    import nbformat
    text = nbformat.writes(nb) + '\n'
    with tempfile.NamedTemporaryFile('w', dir=os.path.dirname(path), prefix='.', suffix='.tmp',
                                     delete=False) as f:
        f.write(text)
    os.replace(f.name, path)


def clean(nb):
    """``nb`` without this script's header cell and without any output."""
    nb.cells = [c for c in nb.cells if HEADER_TAG not in c.metadata.get('tags', [])]
    nb.metadata.pop('gluon_mgpu', None)
    for cell in nb.cells:
        if cell.cell_type == 'code':
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop('gluon_mgpu', None)
    return nb


def _setting(name):
    quick = os.environ.get('GLUON_MGPU_QUICK', '0') or '0'
    if quick not in SETTINGS:
        raise UsageError('GLUON_MGPU_QUICK must be 0 (the book\'s settings), 1 (a quick '
                         'look) or smoke, got %r; unset it for the book\'s settings' % quick)
    # three-ways-to-split knows no smoke setting: its quick look takes a minute.
    return '1' if quick == 'smoke' and name == 'three-ways-to-split' else quick


def package_hash():
    """sha256 of gluon_mgpu/'s Python files as they are now, committed or not."""
    digest = hashlib.sha256()
    package = os.path.join(ROOT, 'gluon_mgpu')
    for folder, dirs, files in sorted(os.walk(package)):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith('.py')):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, package).encode() + b'\0')
            with open(path, 'rb') as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def _run_record(folder, commit, hashes, resumed):
    """Check (or start, when no epoch is kept) the record of what trained the epochs kept in
    ``folder``: a later execution continues them only with the same package, code cells and
    machine (the header names one: another CPU's kernels or threads give other float32 numbers)."""
    path = os.path.join(folder, 'run.json')
    now = {'commit': commit, 'package_sha256': package_hash(), 'code': hashes,
           'machine': machine()}
    if not resumed:
        os.makedirs(folder, exist_ok=True)
        with open(path, 'w') as f:
            json.dump(now, f)
        return now
    try:
        with open(path) as f:
            was = json.load(f)
    except (OSError, ValueError):
        was = None
    if not isinstance(was, dict) or not isinstance(was.get('commit'), str):
        raise UsageError('%s holds checkpoints but no run.json of this script; delete the '
                         'folder to train again (rm -r %s)' % (folder, folder))
    changed = [what for what, key in (('gluon_mgpu/', 'package_sha256'),
                                      ("the notebook's code", 'code'),
                                      ('the machine (CPU, kernels or threads)', 'machine'))
               if was.get(key) != now[key]]
    if changed:
        raise UsageError('%s holds epochs trained at commit %s, and %s changed since; delete '
                         'the folder to train again (rm -r %s)'
                         % (folder, was['commit'][:7], ' and '.join(changed), folder))
    return was


def _saved_epochs(folder):
    from gluon_mgpu import list_checkpoints
    done = {}
    for sub in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if os.path.isdir(os.path.join(folder, sub)) and list_checkpoints(os.path.join(folder, sub)):
            done[sub] = max(list_checkpoints(os.path.join(folder, sub)))
    return done


def header(info, lang):
    """The first cell's text: the machine, the date, the commit and the setting."""
    m = info['machine']
    zh = lang == 'zh'
    where = ('%s；oneDNN 内核：%s；线程：%s' if zh else '%s; oneDNN kernels: %s; threads: %s') % (
        m['cpu'], book_records.kernels(m, lang), 'OMP_NUM_THREADS=%s' % m['threads'])
    if info.get('python'):  # since 2026-12-02; before, Python 3.11 with numpy 1.23.5
        where += ('；Python %s' if zh else '; Python %s') % info['python']
    commit = '`%s`%s' % (info['commit'][:7], (
        '（gluon_mgpu/ 有未提交的改动）' if zh else ' with uncommitted changes to gluon_mgpu/')
        if info['gluon_mgpu_changed'] else '')
    trained = '' if info['trained_at'] == info['commit'] else (
        ('（训练单元的迭代周期在 `%s` 训练，gluon_mgpu/ 相同）' if zh else
         ' (the training cells\' epochs at `%s`, the same gluon_mgpu/)') % info['trained_at'][:7])
    resumed = ('，' if zh else ', ').join(
        ('%s 到第 %d 个迭代周期' if zh else '%s up to epoch %d') % kv
        for kv in sorted(info['resumed'].items()))
    if not zh:
        text = ('*Executed from a fresh kernel by `make notebooks` (`%s`) on %s, at commit %s%s, '
                'with %s, on %s.*' % (PROG, info['date'], commit, trained,
                                      SETTINGS[info['setting']], where))
        if resumed:
            text += ('\n\n*Its training cells continued from the epochs an earlier execution '
                     'saved (%s), and printed those epochs\' lines as recorded.*' % resumed)
        return text + ('\n\n*A code cell changed since holds a stale output, which '
                       '`tests/test_notebook_outputs.py` refuses: run `make notebooks` again.*')
    text = ('*本笔记本的输出是从英文笔记本逐个单元复制来的：两者的代码单元除注释外逐词相同'
            '（`tests/test_notebooks.py` 检查），打印的内容也就相同。英文笔记本由 `make notebooks`'
            '（`%s`）于 %s 在新内核中执行，提交 %s%s，设置：%s，机器：%s。*'
            % (PROG, info['date'], commit, trained, SETTINGS_ZH[info['setting']], where))
    if resumed:
        text += ('\n\n*训练单元从之前一次执行保存的迭代周期接着训练（%s），并按记录打印了那些迭代周期'
                 '的行。*' % resumed)
    return text + ('\n\n*代码单元改动后，它的旧输出会被 `tests/test_notebook_outputs.py` 拒绝：请重新'
                   '运行 `make notebooks`。*')


def _with_header(nb, info, lang):
    import nbformat
    cell = nbformat.v4.new_markdown_cell(header(info, lang), metadata={'tags': [HEADER_TAG]})
    if nb.nbformat_minor < 5:  # cell ids came with 4.5
        cell.pop('id', None)
    nb.cells.insert(0, cell)
    nb.metadata['gluon_mgpu'] = info
    return nb


def _progress(cell, cell_index, **kwargs):
    """After each code cell: its tag, and what it printed of the book's epoch lines."""
    if cell.cell_type == 'code':
        lines = [line for o in cell.outputs if o.output_type == 'stream'
                 for line in o.text.splitlines() if line.startswith('epoch ')]
        print('  [%s] %s' % (datetime.datetime.now().strftime('%H:%M:%S'), ' '.join(
            (cell.metadata.get('tags') or ['cell %d' % cell_index])[:1] + lines[-1:])),
            flush=True)


def execute(name, checkpoints):
    """Execute notebook ``name`` and write it and its twin; return the seconds it took."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError
    setting = _setting(name)
    nb = clean(_read(path_of(name)))
    hashes = [code_hash(c.source) for c in nb.cells if c.cell_type == 'code']
    commit, changed = code_state()
    folder = os.path.join(checkpoints, setting, name)
    from gluon_mgpu import CheckpointError, DeferredInterrupt, lock_dir
    try:  # a folder held or unusable is refused as the train command refuses it
        lock = lock_dir(folder, '--checkpoints')
    except (CheckpointError, ValueError) as e:
        raise UsageError(str(e)) from None
    with lock:
        resumed = _saved_epochs(folder)
        was = _run_record(folder, commit, hashes, resumed)
        kernels = tempfile.mkdtemp()
        try:  # a kernel "python3" that is this interpreter, found before any other
            spec = os.path.join(kernels, 'kernels', 'python3')
            os.makedirs(spec)
            with open(os.path.join(spec, 'kernel.json'), 'w') as f:
                json.dump({'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f',
                                    '{connection_file}'],
                           'display_name': 'Python 3', 'language': 'python'}, f)
            os.environ['JUPYTER_PATH'] = kernels
            env = dict(os.environ, GLUON_MGPU_QUICK=setting, GLUON_MGPU_CHECKPOINTS=folder,
                       PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH'))
                                                  if p))
            start = datetime.datetime.now(datetime.timezone.utc)
            print('%s: executing %s with %s (checkpoints: %s)' % (
                PROG, os.path.relpath(path_of(name), ROOT), SETTINGS[setting], folder),
                flush=True)
            client = NotebookClient(
                nb, timeout=None, kernel_name='python3', record_timing=False,
                resources={'metadata': {'path': os.path.join(ROOT, 'notebooks')}},
                on_cell_executed=_progress, shutdown_kernel='immediate')
            loop = _SignalsNoted()
            asyncio.set_event_loop(loop)  # what nbclient and zmq take as the loop
            try:
                loop.run_until_complete(client.async_execute(env=env))
            except DeadKernelError as e:
                if loop.signum is None:
                    raise CommandError('the kernel died (%s)%s' % (e, AGAIN)) from None
            except CellExecutionError as e:
                if loop.signum is None:
                    raise CommandError('a cell failed, so no notebook was written: %s'
                                       % str(e).strip().splitlines()[-1]) from None
            except Exception:
                if loop.signum is None:
                    raise
            finally:  # nbclient's watch on the kernel ends with it
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()
            if loop.signum is not None:  # nbclient stopped the kernel: the finished epochs stay
                with DeferredInterrupt():  # the stop as that signal's (nbclient took it)
                    signal.raise_signal(loop.signum)
        finally:
            shutil.rmtree(kernels)
    seconds = (datetime.datetime.now(datetime.timezone.utc) - start).total_seconds()
    for cell, h in zip([c for c in nb.cells if c.cell_type == 'code'], hashes):
        cell.metadata['gluon_mgpu'] = {'code_sha256': h}
    info = {'commit': commit, 'gluon_mgpu_changed': changed, 'trained_at': was['commit'],
            'date': start.strftime('%Y-%m-%d'), 'setting': setting, 'machine': machine(),
            'resumed': resumed, 'seconds': round(seconds),
            'python': '%s, numpy %s' % (platform.python_version(), np.__version__)}
    _write(_with_header(nb, info, 'en'), path_of(name))
    twin = copy_to_twin(nb, clean(_read(path_of(NOTEBOOKS[name]))))
    _write(_with_header(twin, info, 'zh'), path_of(NOTEBOOKS[name]))
    print('wrote %s and %s (%.0f s)' % (os.path.relpath(path_of(name), ROOT),
                                         os.path.relpath(path_of(NOTEBOOKS[name]), ROOT),
                                         seconds), flush=True)
    return seconds


def copy_to_twin(nb, twin):
    """``twin`` (clean) given ``nb``'s outputs, code cell by code cell, once their code is equal
    token for token; else ``UsageError``: the twins drifted apart."""
    ours = [c for c in nb.cells if c.cell_type == 'code' and HEADER_TAG not in c.metadata.get(
        'tags', [])]
    theirs = [c for c in twin.cells if c.cell_type == 'code']
    if [code_hash(c.source) for c in ours] != [code_hash(c.source) for c in theirs]:
        raise UsageError('the Chinese notebook\'s code cells are not the English one\'s, '
                         'token for token (tests/test_notebooks.py '
                         'test_both_languages_run_the_same_code says where); make them so')
    for mine, twin_cell in zip(ours, theirs):
        twin_cell.outputs = copy.deepcopy(mine.outputs)
        twin_cell.execution_count = mine.execution_count
        twin_cell.metadata['gluon_mgpu'] = copy.deepcopy(mine.metadata['gluon_mgpu'])
    return twin


def build_parser():
    p = Parser(prog=PROG, description=__doc__.split('\n\n')[0])
    p.add_argument('notebooks', nargs='*', metavar='NOTEBOOK', help='which English notebooks (default: both): %s' % ', '.join(sorted(
                       NOTEBOOKS)))
    p.add_argument('--checkpoints', default=DEFAULT_CHECKPOINTS, metavar='DIR',
                   type=Parser.output_folder('--checkpoints', example='~/notebook-epochs'),
                   help='where the training cells keep their epochs (default %(default)s)')
    return p


AGAIN = '; the finished epochs are saved, give the same command again to continue'


def _saved(e, why):  # the failure table's clause on what a stop kept
    return AGAIN if isinstance(e, KeyboardInterrupt) else ''


class _SignalsNoted(asyncio.SelectorEventLoop):
    """An event loop that notes the first signal nbclient's own handlers take (SIGINT and
    SIGTERM shut its kernel down; the cell running then fails as a dead kernel, and nbclient
    0.10's second clean-up raises an AssertionError), so that the stop is reported as one."""

    signum = None

    def add_signal_handler(self, sig, callback, *args):
        def noted(*args):
            self.signum = sig if self.signum is None else self.signum
            callback(*args)
        super().add_signal_handler(sig, noted, *args)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)

    def body():
        args = build_parser().parse_args(argv)
        unknown = [n for n in args.notebooks if n not in NOTEBOOKS]
        if unknown:
            raise UsageError('no English notebook %r; name %s (or none: both)'
                             % (unknown[0], ' or '.join(sorted(NOTEBOOKS))))
        names = args.notebooks or sorted(NOTEBOOKS)
        for name in names:
            _setting(name)  # a bad GLUON_MGPU_QUICK before anything runs
        from gluon_mgpu import DeferredInterrupt
        for name in names:  # one folder for this script and the kernel, which runs elsewhere
            with DeferredInterrupt():  # per notebook: nbclient leaves them at their defaults
                execute(name, os.path.abspath(args.checkpoints))
        return 0
    return run_command(PROG, argv, body, lambda e: {'saved': _saved})


if __name__ == '__main__':
    sys.exit(main())
