"""Hostile but fair input, disks and neighbours, at the library level (issue 12).

Every case asserts the exact message, that no traceback text reaches it, and what every file
looks like afterwards. Families: A (a failed step, data that cannot train), B (outputs that are
not ours, the folder lock), C (checkpoints: pickles, JSON values, .replicas), D (the OS failing:
permissions, FIFOs, links, a full disk), E (SIGTERM, the launcher), F (absurd device counts),
G (one line from MXNet's errors).
"""
import errno
import gzip
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd
from mxnet.gluon import nn

from gluon_mgpu.handlers import checkpoint, metrics, plotting
from gluon_mgpu import data, devices, training
from gluon_mgpu.runtime import files, threads
from gluon_mgpu.commands import launch
from gluon_mgpu.handlers.interrupts import DeferredInterrupt, Interrupted
from test_checkpoint import _bn_cnn, saved_run  # noqa: F401 (saved_run: a fixture used here)
from test_mxnet_update_on_kvstore import _Failing

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _alarm():
    """Nothing here may wait: a FIFO opened the wrong way would block forever."""
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _timeout(signum, frame):
    raise TimeoutError('the test blocked for 120 s')


def _one_line(text):
    assert '\n' not in text and 'Traceback' not in text, text
    return text


# --- A, D: data ---------------------------------------------------------------------------------

def _idx(magic, dims, values):
    return gzip.compress(struct.pack('>I%dI' % len(dims), magic, *dims) + bytes(values))


def _dataset(folder, train=4, test=2, size=(28, 28), labels=None, test_size=None):
    """A tiny Fashion-MNIST look-alike: ``train`` and ``test`` images of ``size`` pixels."""
    os.makedirs(folder, exist_ok=True)
    for split, n, shape in (('train', train, size), ('test', test, test_size or size)):
        image_name, label_name = data.FILES[split]
        with open(os.path.join(folder, image_name), 'wb') as f:
            f.write(_idx(0x803, (n,) + shape, [7] * (n * shape[0] * shape[1])))
        values = labels if (labels is not None and split == 'train') else [i % 10 for i in range(n)]
        with open(os.path.join(folder, label_name), 'wb') as f:
            f.write(_idx(0x801, (n,), values))
    return str(folder)


def _load(folder):
    with pytest.raises(data.DataError) as e:
        data.load_data_fashion_mnist(2, data_dir=folder)
    return _one_line(str(e.value))


def test_a_tiny_look_alike_loads(tmp_path):
    train_iter, test_iter = data.load_data_fashion_mnist(2, data_dir=_dataset(tmp_path / 'd'))
    assert train_iter.num_examples == 4 and test_iter.num_examples == 2


@pytest.mark.parametrize('split,what', [('train', 'train on'), ('test', 'test on')])
def test_no_images_is_bad_input_naming_the_file(tmp_path, split, what):
    kwargs = {split: 0}
    folder = _dataset(tmp_path / 'd', **kwargs)
    path = os.path.join(folder, data.FILES[split][0])
    assert _load(folder) == ('%s holds 0 images, so there is nothing to %s; replace it with a '
                             'fresh copy' % (path, what))


@pytest.mark.parametrize('labels,first,index,count', [
    ([0, 1, 10, 3], 10, 2, 1),
    ([255, 1, 2, 200], 255, 0, 2),
])
def test_labels_outside_0_to_9_are_bad_input(tmp_path, labels, first, index, count):
    folder = _dataset(tmp_path / 'd', labels=labels)
    path = os.path.join(folder, data.FILES['train'][1])
    assert _load(folder) == ('%s holds label %d at index %d (%d labels outside 0..9); '
                             'Fashion-MNIST has 10 classes, 0 to 9: replace it with a fresh copy'
                             % (path, first, index, count))


@pytest.mark.parametrize('size,test_size,split,shown', [
    ((32, 32), None, 'train', '32x32'),
    ((28, 27), None, 'train', '28x27'),
    ((28, 28), (14, 14), 'test', '14x14'),  # train and test differ
    ((0, 28), None, 'train', '0x28'),
])
def test_images_that_are_not_28x28_are_bad_input(tmp_path, size, test_size, split, shown):
    folder = _dataset(tmp_path / 'd', size=size, test_size=test_size)
    path = os.path.join(folder, data.FILES[split][0])
    assert _load(folder) == ("%s holds items of %s values, but Fashion-MNIST's are 28x28; is it "
                             "the right file?" % (path, shown))


def test_a_header_whose_product_overflows_int64_is_named(tmp_path):
    path = str(tmp_path / 'x-idx3-ubyte.gz')
    with open(path, 'wb') as f:
        f.write(_idx(0x803, (0xFFFFFFFF,) * 3, [1, 2, 3]))
    with pytest.raises(data.DataError) as e:
        data.read_idx(path, 3)
    assert _one_line(str(e.value)) == (
        '%s is truncated: its header announces 4294967295x4294967295x4294967295 = %d values but '
        'it holds 3; replace it with a fresh copy' % (path, 0xFFFFFFFF ** 3))


def test_a_huge_image_count_is_read_in_blocks_and_named(tmp_path):
    path = str(tmp_path / 'x-idx3-ubyte.gz')
    with open(path, 'wb') as f:
        f.write(_idx(0x803, (0xFFFFFFFF, 28, 28), [0] * 784))
    with pytest.raises(data.DataError) as e:
        data.read_idx(path, 3, (28, 28))
    assert str(e.value) == ('%s is truncated: its header announces 4294967295x28x28 = %d values '
                            'but it holds 784; replace it with a fresh copy'
                            % (path, 0xFFFFFFFF * 784))


@pytest.mark.parametrize('split, kind, count', [('train', 0, 60001), ('test', 1, 10001)])
def test_a_file_announcing_more_examples_than_the_release_is_refused_before_reading(
        tmp_path, split, kind, count):
    # A few MB of compressed zeros expand into gigabytes: the header is refused, nothing read.
    folder = _dataset(tmp_path / 'd')
    path = os.path.join(folder, data.FILES[split][kind])
    with gzip.open(path, 'wb') as f:
        f.write(struct.pack('>I', 0x803 if kind == 0 else 0x801))
        f.write(struct.pack('>III', count, 28, 28) if kind == 0 else struct.pack('>I', count))
        zeros = bytes(1 << 20)
        for _ in range(64):  # 64 MB of values that the header would have the reader take
            f.write(zeros)
    assert os.path.getsize(path) < 1 << 20
    assert _load(folder) == ('%s announces %d items in its header, more than the %d a '
                             'Fashion-MNIST file holds; is it the right file?'
                             % (path, count, data.SIZES[split]))


def test_more_values_than_the_header_announces(tmp_path):
    folder = _dataset(tmp_path / 'd')
    path = os.path.join(folder, data.FILES['test'][1])
    with open(path, 'wb') as f:
        f.write(_idx(0x801, (2,), [1, 2, 3]))
    assert _load(folder) == ('%s holds more values than its header announces (2 = 2 values); '
                             'replace it with a fresh copy' % path)


def _replace(folder, name, make):
    path = os.path.join(folder, name)
    os.remove(path)
    make(path)
    return path


@pytest.mark.parametrize('kind,make,reason', [
    ('folder', os.mkdir, 'is a folder, not a regular file'),
    ('fifo', os.mkfifo, 'is a FIFO (named pipe), not a regular file'),
    ('dangling', lambda p: os.symlink('/nonexistent/fashion.gz', p),
     'is a dangling symbolic link (to /nonexistent/fashion.gz)'),
    ('loop', lambda p: os.symlink(os.path.basename(p), p),
     'is a symbolic link loop (it points back to itself)'),
    ('socket', lambda p: socket.socket(socket.AF_UNIX).bind(p), 'is a socket, not a regular file'),
])
@pytest.mark.parametrize('name', ['train-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'])
def test_a_data_file_that_is_not_a_file_is_named_with_what_it_is(tmp_path, kind, make, reason,
                                                                  name):
    folder = _dataset(tmp_path / 'd')
    path = _replace(folder, name, make)
    with pytest.raises(data.DataError) as e:
        data.find_data_dir(folder)
    assert _one_line(str(e.value)) == (
        "%s %s; replace it with the file itself (a copy of Fashion-MNIST's %s)"
        % (path, reason, name))
    assert _load(folder) == str(e.value)


@pytest.mark.parametrize('make,what', [
    (os.mkfifo, 'is a FIFO (named pipe), not a folder'),
    (lambda p: open(p, 'w').close(), 'is a file, not a folder'),
    (lambda p: os.symlink('/nonexistent/d', p), 'is a dangling symbolic link (to /nonexistent/d)'),
    (lambda p: None, 'does not exist'),
])
def test_a_data_dir_that_is_not_a_folder_says_what_it_is(tmp_path, make, what):
    path = str(tmp_path / 'data')
    make(path)
    with pytest.raises(data.DataNotFoundError) as e:
        data.find_data_dir(path)
    assert _one_line(str(e.value)) == (
        'data dir %s %s; pass a folder that holds %s, or leave it out to search the default '
        'places' % (path, what, ', '.join(data.FILES['train'] + data.FILES['test'])))


def test_a_fifo_read_directly_does_not_block(tmp_path):
    path = str(tmp_path / 'labels.gz')
    os.mkfifo(path)
    with pytest.raises(data.DataError) as e:
        data.read_idx(path, 1)
    assert str(e.value) == ("%s is a FIFO (named pipe), not a regular file; replace it with the "
                            "file itself (a copy of Fashion-MNIST's labels.gz)" % path)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def test_a_broken_first_folder_does_not_hide_a_complete_second(tmp_path, monkeypatch):
    home = tmp_path / 'home'
    broken = _dataset(home / 'datasets' / 'fashion-mnist')
    _replace(broken, data.FILES['test'][0], os.mkfifo)
    good = _dataset(tmp_path / 'system')
    monkeypatch.setenv('MXNET_HOME', str(home))
    monkeypatch.setattr(data, 'SYSTEM_DIR', good)
    assert data.find_data_dir() == good


def test_a_missing_file_is_still_not_found(tmp_path):
    folder = _dataset(tmp_path / 'd')
    os.remove(os.path.join(folder, data.FILES['test'][1]))
    with pytest.raises(data.DataNotFoundError, match=r'^Fashion-MNIST not found: searched %s '
                       % re.escape(folder)):
        data.find_data_dir(folder)


def test_permission_denied_is_named_not_called_a_broken_gzip(tmp_path, monkeypatch):
    folder = _dataset(tmp_path / 'd')
    path = os.path.join(folder, data.FILES['train'][0])
    real_open = os.open

    def denied(p, *args, **kwargs):
        if p == path:
            raise PermissionError(errno.EACCES, 'Permission denied', p)
        return real_open(p, *args, **kwargs)
    monkeypatch.setattr(os, 'open', denied)
    assert _load(folder) == ('%s cannot be read (Permission denied); make it readable for this '
                             'user, or copy it to a folder of your own' % path)


def test_permission_denied_for_real(tmp_path):
    # Root ignores permission bits: as root, a child process imports everything first (Python
    # may live in /root), then becomes the user nobody and reads.
    folder = tempfile.mkdtemp(prefix='gluon-mgpu-perm-')
    try:
        os.chmod(folder, 0o755)
        _dataset(folder)
        path = os.path.join(folder, data.FILES['train'][1])
        os.chmod(path, 0o600)
        code = textwrap.dedent('''
            import os, sys
            from gluon_mgpu import data
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                data.read_idx(sys.argv[1], 1)
            except data.DataError as e:
                print(e)
        ''')
        out = subprocess.run([PY, '-c', code, path], capture_output=True, text=True, timeout=120,
                             cwd='/')
        assert out.stdout == ('%s cannot be read (Permission denied); make it readable for '
                              'this user, or copy it to a folder of your own\n' % path), out.stderr
    finally:
        shutil.rmtree(folder)


def test_45_9_a_data_folder_this_user_cannot_enter_is_named_not_called_missing():
    folder = tempfile.mkdtemp(prefix='gluon-mgpu-perm-')
    try:
        os.chmod(folder, 0o755)
        inner = _dataset(os.path.join(folder, 'data'))
        os.chmod(inner, 0o700)  # root's: the user nobody cannot enter it
        code = textwrap.dedent('''
            import os, sys
            from gluon_mgpu import data
            os.setgid(65534)
            os.setuid(65534)
            try:
                data.find_data_dir(sys.argv[1])
            except (data.DataError, data.DataNotFoundError) as e:
                print(type(e).__name__, e)
        ''')
        out = subprocess.run([PY, '-c', code, inner], capture_output=True, text=True,
                             timeout=120, cwd='/')
        assert out.stdout == ('DataError %s cannot be read (Permission denied), so its files '
                              'cannot be reached; make it readable for this user, or copy it to '
                              'a folder of your own\n' % inner), out.stderr
    finally:
        shutil.rmtree(folder)


# --- B, D: outputs --------------------------------------------------------------------------

def _special(tmp_path, kind):
    """A path of ``kind`` and a function that says it is still what it was."""
    if kind in ('/dev/null', '/dev/full'):
        return kind, lambda: stat.S_ISCHR(os.lstat(kind).st_mode)
    path = str(tmp_path / kind)
    if kind == 'fifo':
        os.mkfifo(path)
        return path, lambda: stat.S_ISFIFO(os.lstat(path).st_mode)
    if kind == 'folder':
        os.mkdir(path)
        return path, lambda: os.path.isdir(path) and os.listdir(path) == []
    if kind == 'socket':
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        return path, lambda: stat.S_ISSOCK(os.lstat(path).st_mode)
    target = str(tmp_path / 'target.json')
    if kind == 'link':
        with open(target, 'w') as f:
            f.write('mine\n')
        os.symlink(target, path)
        return path, lambda: os.readlink(path) == target and open(target).read() == 'mine\n'
    os.symlink(target, path)  # dangling
    return path, lambda: os.readlink(path) == target and not os.path.exists(target)


_REFUSED = {
    '/dev/null': 'it is a character device, not a regular file, and is left as it is; name a '
                 'regular file or a new path',
    '/dev/full': 'it is a character device, not a regular file, and is left as it is; name a '
                 'regular file or a new path',
    'fifo': 'it is a FIFO (named pipe), not a regular file, and is left as it is; name a regular '
            'file or a new path',
    'socket': 'it is a socket, not a regular file, and is left as it is; name a regular file or '
              'a new path',
    'folder': 'it is a folder; name a file in it',
    'link': 'it is a symbolic link (to {target}), which would be replaced; name the file it '
            'points to, or a new path',
    'dangling': 'it is a symbolic link (to {target}), which would be replaced; name the file it '
                'points to, or a new path',
}
_WRITERS = {
    'json': lambda p: metrics.write_json_atomic(p, {'a': 1}),
    'metrics': lambda p: metrics.MetricsFile(p, {'num_gpus': 1}, [mx.cpu()]),
    'raw': lambda p: _raw_atomic(p),
}


def _raw_atomic(path):
    with files.atomic_path(path) as tmp:
        with open(tmp, 'wb') as f:
            f.write(b'x')


@pytest.mark.parametrize('kind', sorted(_REFUSED))
@pytest.mark.parametrize('writer', ['json', 'metrics', 'raw'])
def test_outputs_never_replace_what_is_not_a_regular_file(tmp_path, kind, writer):
    path, unchanged = _special(tmp_path, kind)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(files.OutputError) as e:
        _WRITERS[writer](path)
    reason = _REFUSED[kind].format(target=tmp_path / 'target.json')
    assert _one_line(str(e.value)) == 'cannot write %s: %s' % (path, reason)
    assert e.value.errno is None and e.value.filename == path
    assert files.output_problem(path) == reason
    assert unchanged()
    assert sorted(os.listdir(tmp_path)) == before  # no temporary file left


@pytest.mark.parametrize('kind', ['fifo', 'link', 'folder'])
def test_a_plot_is_not_drawn_over_what_is_not_a_regular_file(tmp_path, kind):
    path, _ = _special(tmp_path, kind)
    target = path + '.png'
    os.rename(path, target)
    with pytest.raises(files.OutputError, match=r'^cannot write %s: it is ' % re.escape(target)):
        plotting.plot_history([{'epoch': 1, 'test_acc': 0.5, 'train_loss': 1.0}], target)
    assert files.output_problem(target).startswith('it is ')


def test_a_regular_file_is_replaced_with_the_usual_mode(tmp_path):
    path = str(tmp_path / 'run.json')
    with open(path, 'w') as f:
        f.write('old\n')
    os.chmod(path, 0o600)
    metrics.write_json_atomic(path, {'a': 1})
    umask = os.umask(0)
    os.umask(umask)
    assert json.load(open(path)) == {'a': 1}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask
    assert os.listdir(tmp_path) == ['run.json']


@pytest.mark.parametrize('path,expected', [
    ('run.json', None),
    ('/dev/null', _REFUSED['/dev/null']),
    ('nowhere/run.json', 'folder {tmp}/nowhere does not exist; create it first'),
    ('a\0b', 'it contains a NUL character; name a file without one'),
    ('sub/', 'it names a folder, not a file; name a file in it'),
    ('file/run.json', '{tmp}/file is not a folder; name a file in a folder'),
])
def test_output_problem(tmp_path, monkeypatch, path, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'file').write_text('')
    expected = expected and expected.format(tmp=tmp_path)
    assert files.output_problem(path) == expected


def test_45_9_a_folder_where_no_file_can_be_created_is_refused_also_for_root(tmp_path):
    # Root passes os.access on /sys and /proc; creating the temporary file is what fails.
    root = os.geteuid() == 0
    assert files.output_problem('/sys/run.json') == (
        'no file can be created in folder /sys (Permission denied); choose another folder'
        if root else 'folder /sys is not writable; choose another folder')
    assert files.output_problem('/proc/run.json') == (
        'no file can be created in folder /proc (No such file or directory); choose another '
        'folder' if root else 'folder /proc is not writable; choose another folder')
    assert files.output_problem(str(tmp_path / 'run.json')) is None
    assert os.listdir(tmp_path) == []  # the trial file is gone


def test_a_full_disk_is_named_with_the_path_and_the_fix(tmp_path):
    path = str(tmp_path / 'run.json')
    metrics.write_json_atomic(path, {'epoch': 1})

    def disk_full(tmp):
        with open(tmp, 'w') as f:
            f.write('{"epo')
        raise OSError(errno.ENOSPC, 'No space left on device')
    with pytest.raises(files.OutputError) as e:
        with files.atomic_path(path) as tmp:
            disk_full(tmp)
    assert _one_line(str(e.value)) == ('cannot write %s (No space left on device); free some '
                                       'space on that disk or write somewhere else' % path)
    assert e.value.errno == errno.ENOSPC
    assert json.load(open(path)) == {'epoch': 1} and os.listdir(tmp_path) == ['run.json']


def test_a_folder_deleted_meanwhile_is_named(tmp_path):
    folder = tmp_path / 'out'
    folder.mkdir()
    path = str(folder / 'run.json')
    with pytest.raises(files.OutputError) as e:
        with files.atomic_path(path):
            shutil.rmtree(folder)
    assert _one_line(str(e.value)) == (
        'cannot write %s (No such file or directory); its folder %s no longer exists; create it '
        'again or write somewhere else' % (path, folder))
    assert not folder.exists()


_FSIZE_CHILD = textwrap.dedent('''
    import os, resource, signal, sys
    import gluon_mgpu
    import mxnet as mx
    from gluon_mgpu import training
    from gluon_mgpu.handlers import checkpoint, metrics
    from gluon_mgpu.runtime import files
    from mxnet.gluon import nn
    directory, what = sys.argv[1], sys.argv[2]
    net = nn.Dense(300, in_units=300)
    trainer = training.init_training(net, [mx.cpu()], 0.1)
    history = [dict(epoch=1, seconds=1.0, images_per_sec=1.0, train_loss=0.5, train_acc=0.5,
                    test_acc=0.5)]
    checkpoint.save_checkpoint(directory, 1, net, trainer, {'history': history})
    metrics.write_json_atomic(os.path.join(directory, 'run.json'), {'epoch': 1})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then writing past the limit is EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (50000, resource.RLIM_INFINITY))
    try:
        if what == 'checkpoint':
            checkpoint.save_checkpoint(directory, 2, net, trainer, {'history': history * 2})
        else:
            metrics.write_json_atomic(os.path.join(directory, 'run.json'), {'x': 'y' * 60000})
    except files.OutputError as e:
        print(e.errno, e)
''')


@pytest.mark.parametrize('what,target', [
    ('checkpoint', 'epoch-0002.params'),  # written by MXNet, which loses the OS's reason
    ('metrics', 'run.json'),
])
def test_a_file_size_limit_is_a_real_os_failure_named_with_the_path(tmp_path, what, target):
    out = subprocess.run([PY, '-c', _FSIZE_CHILD, str(tmp_path), what], capture_output=True,
                         text=True, timeout=120)
    path = os.path.join(str(tmp_path), target)
    assert out.stdout == ('%d cannot write %s (File too large); raise the file size limit '
                          '(ulimit -f) or write somewhere else\n' % (errno.EFBIG, path)), out.stderr
    assert checkpoint.list_checkpoints(str(tmp_path)) == [1]
    assert json.load(open(tmp_path / 'run.json')) == {'epoch': 1}
    assert not any(n.startswith('.') for n in os.listdir(tmp_path))
    assert checkpoint.read_checkpoint(str(tmp_path))['epoch'] == 1


# --- B: the folder lock ---------------------------------------------------------------------

def test_a_second_run_into_a_locked_folder_is_refused(tmp_path):
    directory = str(tmp_path / 'ck')
    with checkpoint.lock_dir(directory) as lock:
        assert open(lock.name).read() == '%d\n' % os.getpid()
        writing = os.path.join(directory, '.epoch-0001.params.abc.tmp')  # the holder's write
        open(writing, 'w').close()
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.lock_dir(directory)
        assert _one_line(str(e.value)) == (
            '%s is in use by another run (pid %d); wait for it to end, or pass another '
            '--checkpoint-dir' % (directory, os.getpid()))
        assert os.path.exists(writing)  # refused before it deletes anything
        os.remove(writing)
    assert os.listdir(directory) == ['.lock']  # released: the file stays, unlocked
    checkpoint.lock_dir(directory).release()


def test_the_lock_dies_with_its_process(tmp_path):
    directory = str(tmp_path / 'ck')
    code = ('import sys, time; from gluon_mgpu.handlers import checkpoint\n'
            'lock = checkpoint.lock_dir(sys.argv[1]); print("locked", flush=True)\n'
            'time.sleep(120)\n')
    child = subprocess.Popen([PY, '-c', code, directory], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == 'locked\n'
        with pytest.raises(checkpoint.CheckpointError,
                           match=r'in use by another run \(pid %d\)' % child.pid):
            checkpoint.lock_dir(directory)
    finally:
        child.kill()
        child.wait()
    assert os.listdir(directory) == ['.lock']  # SIGKILL left the file, not the lock
    with checkpoint.lock_dir(directory):
        pass


def test_leftovers_of_a_killed_write_are_deleted_and_nothing_else(tmp_path):
    directory = str(tmp_path)
    fd, leftover = tempfile.mkstemp(dir=directory, prefix='.epoch-0003.params.', suffix='.tmp')
    os.close(fd)  # what files.atomic_path leaves when the process is killed mid-write
    for name in ('.lock', 'epoch-0003.params', '.run.json.abc.tmp', 'notes.tmp'):
        open(os.path.join(directory, name), 'w').close()
    checkpoint.lock_dir(directory).release()
    assert sorted(os.listdir(directory)) == ['.lock', '.run.json.abc.tmp', 'epoch-0003.params',
                                             'notes.tmp']


@pytest.mark.parametrize('content', [b'my own lock\n', b'12 34\n', b'\xff' * 100])
def test_a_lock_file_that_is_not_ours_is_left_as_it_is(tmp_path, content):
    # It was emptied and given this process's pid: --checkpoint-dir can name any folder.
    (tmp_path / '.lock').write_bytes(content)
    (tmp_path / '.epoch-0003.params.x.tmp').write_bytes(b'')
    with pytest.raises(ValueError) as e:
        checkpoint.lock_dir(str(tmp_path))
    assert str(e.value) == ('%s holds .lock, which is not the lock file of a gluon_mgpu run (it '
                            'starts %s) and is left as it is; pass another folder'
                            % (tmp_path, json.dumps(content[:20].decode('utf-8', 'replace'))))
    assert (tmp_path / '.lock').read_bytes() == content
    assert (tmp_path / '.epoch-0003.params.x.tmp').exists()  # nothing of the folder touched
    os.remove(tmp_path / '.lock')
    os.mkfifo(tmp_path / '.lock')
    with pytest.raises(ValueError, match=r'\.lock, which is not the lock file of a gluon_mgpu '
                                         r'run \(it is a FIFO \(named pipe\)\)'):
        checkpoint.lock_dir(str(tmp_path))
    os.remove(tmp_path / '.lock')
    (tmp_path / '.lock').write_bytes(b'4242\n')  # a killed run's: taken over
    checkpoint.lock_dir(str(tmp_path)).release()
    assert (tmp_path / '.lock').read_bytes() == b'%d\n' % os.getpid()


def test_45_9_a_read_only_lock_file_is_named_not_the_folder():
    # As the user nobody: root may open a 0444 file for writing.
    folder = tempfile.mkdtemp(prefix='gluon-mgpu-lock-')
    try:
        os.chmod(folder, 0o1777)
        directory = os.path.join(folder, 'ck')
        os.mkdir(directory)
        lock = os.path.join(directory, checkpoint.LOCK_NAME)
        open(lock, 'w').close()
        os.chmod(lock, 0o444)
        for path in (directory, lock):
            os.chown(path, 65534, 65534)
        code = textwrap.dedent('''
            import os, sys
            from gluon_mgpu.handlers import checkpoint
            os.setgid(65534)
            os.setuid(65534)
            try:
                checkpoint.lock_dir(sys.argv[1])
            except ValueError as e:
                print(e)
        ''')
        out = subprocess.run([PY, '-c', code, directory], capture_output=True, text=True,
                             timeout=120, cwd='/')
        assert out.stdout == ('its lock file %s cannot be opened for writing (Permission denied, '
                              'mode 0444), though the folder is writable; make it writable (chmod '
                              'u+w %s) or pass another folder\n' % (lock, lock)), out.stderr
        assert os.listdir(directory) == [checkpoint.LOCK_NAME]
    finally:
        shutil.rmtree(folder)


def test_a_lock_file_that_is_a_link_is_refused(tmp_path):
    directory = tmp_path / 'ck'
    directory.mkdir()
    victim = tmp_path / 'victim'
    victim.write_text('keep\n')
    os.symlink(victim, directory / '.lock')
    with pytest.raises(ValueError) as e:
        checkpoint.lock_dir(str(directory))
    assert _one_line(str(e.value)) == ('cannot write checkpoints to %s (%s/.lock is a symbolic '
                                       'link); pass a folder you can write to'
                                       % (directory, directory))
    assert victim.read_text() == 'keep\n'


# --- E: signals -------------------------------------------------------------------------------

def test_sigterm_is_an_interruption_that_records_its_signal():
    with pytest.raises(Interrupted) as e:
        with DeferredInterrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(10))
    assert isinstance(e.value, KeyboardInterrupt)
    assert (e.value.signum, e.value.signal_name, e.value.exit_code) == (15, 'SIGTERM', 143)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.fixture
def default_sighup():
    # Under nohup SIGHUP starts ignored, and a shell's background job starts with SIGQUIT
    # ignored: these tests start from the default dispositions, as a terminal gives them.
    previous = {n: signal.signal(n, signal.SIG_DFL) for n in (signal.SIGHUP, signal.SIGQUIT)}
    yield
    for n, handler in previous.items():
        signal.signal(n, handler)


def test_sighup_is_an_interruption_that_records_its_signal(default_sighup):
    with pytest.raises(Interrupted) as e:
        with DeferredInterrupt():
            os.kill(os.getpid(), signal.SIGHUP)
            sum(range(10))
    assert (e.value.signum, e.value.signal_name, e.value.exit_code) == (1, 'SIGHUP', 129)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL


def test_sighup_ignored_by_nohup_stays_ignored_and_sigquit_dumps_only_inside(default_sighup):
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with DeferredInterrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # nohup's promise: nothing happens
            sum(range(10))
    finally:
        signal.signal(signal.SIGHUP, previous)
    # SIGQUIT's handler (faulthandler's, in C) is there inside the block only.
    assert signal.getsignal(signal.SIGQUIT) is signal.SIG_DFL
    with DeferredInterrupt() as interrupt:
        assert interrupt._quit_dump
    assert not interrupt._quit_dump
    assert signal.getsignal(signal.SIGQUIT) is signal.SIG_DFL


def test_ctrl_c_records_sigint():
    with pytest.raises(Interrupted) as e:
        with DeferredInterrupt():
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(10))
    assert (e.value.signal_name, e.value.exit_code) == ('SIGINT', 130)


def test_a_signal_during_a_checkpoints_write_waits_until_the_checkpoint_is_whole(
        tmp_path, monkeypatch):
    # Issue 65: a stop while the epoch's files were written discarded an epoch trained and
    # tested (12 to 45 minutes at the book's settings); now it comes right after the write.
    from mxnet.gluon import nn
    net = nn.Dense(3, in_units=4)
    trainer = training.init_training(net, [mx.cpu(0), mx.cpu(1)], 0.1)
    write = checkpoint.write_json_atomic

    def signalled(*args, **kwargs):  # the JSON, written last, is what makes the epoch count
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(10))  # where a handler that raised at once would have raised
        return write(*args, **kwargs)
    monkeypatch.setattr(checkpoint, 'write_json_atomic', signalled)
    with pytest.raises(Interrupted) as e:
        with DeferredInterrupt() as interrupt:
            checkpoint.save_checkpoint(str(tmp_path), 1, net, trainer, {'history': [dict(
                epoch=1, seconds=1.0, images_per_sec=1.0, train_loss=0.5, train_acc=0.5,
                test_acc=0.5)]})
            assert interrupt.requested and interrupt.signum == signal.SIGTERM
            assert checkpoint.list_checkpoints(str(tmp_path)) == [1]
            interrupt.check()
    assert e.value.exit_code == 143
    assert checkpoint.read_checkpoint(str(tmp_path))['epoch'] == 1


def test_sigterm_inside_a_del_waits_for_check():
    from test_interrupts import _Freed
    calls = []

    def work():
        os.kill(os.getpid(), signal.SIGTERM)
        calls.append('went on')
        os.kill(os.getpid(), signal.SIGINT)  # a second signal: the first one is reported
    with DeferredInterrupt() as interrupt:
        _Freed(work)  # freed at once, as the garbage collector frees an NDArray
        assert calls == ['went on'] and interrupt.requested and interrupt.signum == 15
        with pytest.raises(Interrupted) as e:
            interrupt.check()
        assert e.value.exit_code == 143
        interrupt.check()


def test_a_caller_owned_sigterm_handler_is_left_alone():
    mine = lambda signum, frame: None  # noqa: E731
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with DeferredInterrupt():
            assert signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(ValueError, match='DeferredInterrupt handles SIGINT, SIGTERM and '
                                             'SIGHUP, got <Signals.SIGQUIT: 3>'):
            DeferredInterrupt(signals=(signal.SIGQUIT,))
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_in_a_real_process_is_reported_and_exits_143():
    code = ('import sys, time\n'
            'from gluon_mgpu.handlers.interrupts import DeferredInterrupt, Interrupted\n'
            'try:\n'
            '    with DeferredInterrupt():\n'
            '        print("ready", flush=True)\n'
            '        time.sleep(120)\n'
            'except Interrupted as e:\n'
            '    print("stopped by", e.signal_name)\n'
            '    sys.exit(e.exit_code)\n')
    child = subprocess.Popen([PY, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline() == 'ready\n'
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert (child.returncode, out, err) == (143, 'stopped by SIGTERM\n', '')


# --- E: the launcher --------------------------------------------------------------------------

def _launch_main(argv, capsys):
    code = launch.main(argv)
    out, err = capsys.readouterr()
    assert out == ''
    return code, _one_line(err.rstrip('\n'))


@pytest.mark.parametrize('command,problem', [
    ('/nonexistent/cmd', '/nonexistent/cmd does not exist'),
    ('no-such-program-here', 'no-such-program-here is not a program on PATH'),
    ('{tmp}', '{tmp} is a folder'),
    ('{tmp}/plain', '{tmp}/plain is not executable (chmod +x)'),
    ('{tmp}/dangling', '{tmp}/dangling is a dangling symbolic link'),
    ('', 'the command is an empty string'),
])
def test_a_command_that_cannot_run_is_one_line_and_exit_2(tmp_path, capsys, command, problem):
    (tmp_path / 'plain').write_text('echo hi\n')
    os.symlink('/nonexistent/x', tmp_path / 'dangling')
    command, problem = (s.format(tmp=tmp_path) for s in (command, problem))
    code, err = _launch_main(['-n', '1', '--', command, 'arg'], capsys)
    assert (code, err) == (2, 'python -m gluon_mgpu.launch: error: cannot run the command after '
                              '--: %s; for example -- python -m gluon_mgpu.train --kvstore '
                              'dist_sync' % problem)


def test_a_port_in_use_is_one_line_and_exit_2_before_anything_starts(capsys):
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = _launch_main(['-n', '1', '--port', str(port), '--', 'true'], capsys)
    assert (code, err) == (2, 'python -m gluon_mgpu.launch: error: --port %d cannot be used on '
                              '127.0.0.1 (Address already in use); pass another port, or leave '
                              '--port out for a free one' % port)
    hold, problem = launch.hold_port(port)  # free again
    assert problem is None
    hold.close()


def test_a_process_that_cannot_be_started_stops_the_others():
    class Log:
        text = ''

        def write(self, s):
            Log.text += s

        def flush(self):
            pass
    sleeper = [PY, '-c', 'import time; time.sleep(120)']
    processes = [('scheduler', sleeper, dict(os.environ), 'localhost'),
                 ('server 0', ['/nonexistent/python'], dict(os.environ), 'localhost')]
    assert launch.run_job(processes, log=Log()) == 2
    assert Log.text == ('launch: error: cannot start server 0: /nonexistent/python: No such file '
                        'or directory; stopped the 1 processes already started\n')


def test_the_launcher_in_a_real_process(tmp_path):
    out = subprocess.run([PY, '-m', 'gluon_mgpu.launch', '-n', '1', '--', '/nonexistent/cmd'],
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (2, '')
    assert out.stderr == ('python -m gluon_mgpu.launch: error: cannot run the command after --: '
                          '/nonexistent/cmd does not exist; for example -- python -m '
                          'gluon_mgpu.train --kvstore dist_sync\n')


# --- F: absurd device counts ------------------------------------------------------------------

def _threads():
    return len(os.listdir('/proc/self/task'))


@pytest.mark.parametrize('device', ['cpu', 'auto'])
def test_a_million_cpu_devices_are_refused_at_once(device, caplog, monkeypatch):
    monkeypatch.setattr(devices, '_count_gpus', lambda: 0)
    limit, source = threads.thread_limit()
    assert limit is not None  # Linux always has threads-max
    per = threads.threads_per_cpu_context()
    assert per == int(os.environ['OMP_NUM_THREADS']) + 1
    most = (limit // 2 - 6) // per
    before = _threads()
    with pytest.raises(ValueError) as e:
        devices.get_devices(1000000, device)
    assert _one_line(str(e.value)) == (
        'num_gpus=1000000 simulated CPU devices are more than this machine can hold (at most '
        '%d: a CPU context costs %d threads (OMP_NUM_THREADS for MXNet, 1 to issue its calls), '
        'and one run may take half of the %d threads %s allows); pass at most %d (CPU contexts '
        'share the same cores, so a few, 2 to 8, show the data parallelism as well)'
        % (most, per, limit, source, most))
    assert _threads() == before and caplog.records == []


def test_the_limit_follows_the_tightest_thread_limit(monkeypatch):
    monkeypatch.setattr(threads, 'thread_limit', lambda: (100, 'ulimit -u'))
    monkeypatch.setattr(threads, 'threads_per_cpu_context', lambda: 2)
    assert threads.max_cpu_devices()[0] == 22  # (100 // 2 - 6) // 2
    assert len(devices.get_devices(22, 'cpu')) == 22
    with pytest.raises(ValueError, match=r'^num_gpus=23 simulated CPU devices are more than '
                                         r'this machine can hold \(at most 22: .* half of the '
                                         r'100 threads ulimit -u allows\)'):
        devices.get_devices(23, 'cpu')
    monkeypatch.setattr(threads, 'thread_limit', lambda: (None, None))
    assert threads.max_cpu_devices() == (None, 'no limit on threads is known')


@pytest.mark.parametrize('omp', ['1', '2', '4'])
def test_cpu_contexts_cost_no_more_threads_than_the_limit_assumes(omp):
    # A reduction runs an OpenMP loop: the engine worker of each context starts its team; the
    # package issues each context's calls from a thread of its own.
    code = ('import os, gluon_mgpu, mxnet as mx\n'
            'from mxnet import nd\n'
            'from gluon_mgpu.runtime import threads\n'
            'from gluon_mgpu.runtime import dispatch\n'
            'for i in range(3):\n'
            '    a = nd.ones((64, 64), ctx=mx.cpu(i))\n'
            '    dispatch.call(mx.cpu(i), lambda: nd.dot(a, a).sum().asscalar())\n'
            'print(threads.threads_per_cpu_context(), len(os.listdir("/proc/self/task")) <=\n'
            '      threads.ENGINE_BASE_THREADS + 3 * threads.threads_per_cpu_context())\n')
    out = subprocess.run([PY, '-c', code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS=omp))
    assert out.stdout == '%d True\n' % (int(omp) + 1), out.stderr


def test_long_device_lists_are_shortened(caplog, monkeypatch):
    many = [mx.cpu(i) for i in range(1000)]
    assert devices.abbreviate_devices(many) == '[cpu(0), cpu(1), ..., cpu(999)]'
    assert devices.abbreviate_devices(many[:8]) == devices.format_devices(many[:8])
    monkeypatch.setattr(devices, '_count_gpus', lambda: 0)
    devices.get_devices(9, 'auto')
    assert caplog.messages == ["warning: no GPU found, so [cpu(0), cpu(1), ..., cpu(8)] are "
                               "simulated devices sharing this machine's CPU: the data "
                               "parallelism is real, a speed-up is not expected"]


# --- A: the optimizer's errors inside trainer.step --------------------------------------------
# init_training's Trainer (update_on_kvstore=False) runs the optimizer in Python, so its error
# raises from train (MXNet's side of it: tests/test_mxnet_update_on_kvstore.py).

def test_an_exception_in_the_optimizer_raises_from_train():
    ctx = [mx.cpu(0), mx.cpu(1)]
    net = nn.HybridSequential()
    net.add(nn.Conv2D(2, 3), nn.Dense(4))
    net.initialize(ctx=ctx)
    trainer = gluon.Trainer(net.collect_params(), _Failing(learning_rate=0.1),
                            update_on_kvstore=False)
    batch = (nd.ones((4, 1, 28, 28)), nd.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match='^boom$'):
        training.train(net, [batch], [batch], ctx, num_epochs=1, trainer=trainer,
                       event_handlers=[])


# --- C, G: checkpoints --------------------------------------------------------------------------

@pytest.fixture
def ck(saved_run, tmp_path):
    """The first epoch of test_checkpoint's small two-device run, alone in a folder."""
    directory = str(tmp_path / 'ck')
    os.mkdir(directory)
    for kind in ('json',) + checkpoint.KINDS:
        shutil.copy(checkpoint.checkpoint_path(saved_run, 1, kind), directory)
    return directory


def _edit(directory, change, epoch=1):
    path = checkpoint.checkpoint_path(directory, epoch, 'json')
    with open(path) as f:
        record = json.load(f)
    change(record)
    with open(path, 'w') as f:
        json.dump(record, f)
    return path


def _forge(directory, kind, content, epoch=1):
    """What whoever can write the folder can do: replace a file and its size and sum."""
    with open(checkpoint.checkpoint_path(directory, epoch, kind), 'wb') as f:
        f.write(content)
    _edit(directory, lambda r: r['files'][kind].update(
        bytes=len(content), sha256=hashlib.sha256(content).hexdigest()), epoch)


def _restore(directory, net=None, n=2):
    devices_ = [mx.cpu(i) for i in range(n)]
    net = net or _bn_cnn()
    trainer = training.init_training(net, devices_, 0.1, seed=9)
    record = checkpoint.read_checkpoint(directory)
    checkpoint.restore(directory, record, net, trainer, devices_)
    return net, trainer


def _refused_restore(directory, **kwargs):
    with pytest.raises(checkpoint.CheckpointError) as e:
        _restore(directory, **kwargs)
    return _one_line(str(e.value))


class _Evil:
    """Unpickling it calls ``call(*args)``: proof that a pickle ran, if the marker appears."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def _evil_pickles(marker):
    return {
        'io.open': pickle.dumps(({0: None}, _Evil(open, marker, 'w'))),
        'posix.system': pickle.dumps(_Evil(os.system, 'touch ' + marker)),
        'builtins.exec': pickle.dumps(({}, _Evil(exec, 'open(%r, "w")' % marker))),
        'subprocess.Popen': pickle.dumps(_Evil(subprocess.Popen, ['touch', marker])),
    }


@pytest.mark.parametrize('kind', checkpoint.KINDS)
@pytest.mark.parametrize('name', sorted(_evil_pickles('x')))
def test_a_forged_pickle_with_a_matching_sha256_is_refused_and_nothing_runs(ck, tmp_path, name,
                                                                            kind):
    marker = str(tmp_path / 'ran')
    _forge(ck, kind, _evil_pickles(marker)[name])
    message = _refused_restore(ck)
    assert message.startswith('%s is not an MXNet array file (' % checkpoint.checkpoint_path(
        ck, 1, kind)), message
    assert not os.path.exists(marker)
    with open(checkpoint.checkpoint_path(ck, 1, kind), 'rb') as f:
        pickle.load(f)  # the file really is a working pickle: unpickled, it runs
    assert os.path.exists(marker) or name == 'subprocess.Popen'


@pytest.mark.parametrize('kind', checkpoint.KINDS)
def test_random_bytes_instead_of_an_mxnet_file_are_one_line(ck, kind):
    _forge(ck, kind, os.urandom(4096))
    assert re.fullmatch(r'%s is not an MXNet array file \([^()]*\); start a new run in an empty '
                        r'--checkpoint-dir' % re.escape(checkpoint.checkpoint_path(ck, 1, kind)),
                        _refused_restore(ck))


def _arrays(values):
    path = tempfile.mktemp()
    nd.save(path, values)
    try:
        return open(path, 'rb').read()
    finally:
        os.remove(path)


def _replicas(ck):
    return {k: v for k, v in nd.load(checkpoint.checkpoint_path(ck, 1, 'replicas')).items()}


_NOT_OURS = ('; the file was not written by this version of gluon_mgpu or was changed: start a '
             'new run in an empty --checkpoint-dir')
_OTHER_NETWORK = ': the checkpoint was written for another network (None)'


@pytest.mark.parametrize('kind,change,message', [
    ('replicas', lambda r: r.update({'9.weight@0': nd.ones(1)}),
     ': it holds 9.weight@0, which is no copy of a parameter of this network' + _NOT_OURS),
    ('replicas', lambda r: r.update({'1.running_mean': r['1.running_mean@0']}),
     ': it holds 1.running_mean, which is no copy of a parameter of this network' + _NOT_OURS),
    ('replicas', lambda r: r.update({'1.running_mean@00': r['1.running_mean@0']}),
     ': it holds 1.running_mean@00, which is no copy of a parameter of this network' + _NOT_OURS),
    ('replicas', lambda r: r.update({'1.running_mean@\u00b2': r['1.running_mean@0']}),
     ': it holds 1.running_mean@\u00b2, which is no copy of a parameter of this network'
     + _NOT_OURS),
    ('replicas', lambda r: r.update({'1.running_mean@0': nd.ones(5)}),
     ': it holds 1.running_mean@0, which is no copy of a parameter of this network' + _NOT_OURS),
    ('replicas', lambda r: r.update({'1.running_mean@0': nd.ones(4, dtype='float64')}),
     ': it holds 1.running_mean@0, which is no copy of a parameter of this network' + _NOT_OURS),
    ('replicas', lambda r: r.update({'1.running_mean@2': r['1.running_mean@0']}),
     ' holds a copy for device 2, but this run has 2 devices; resume with --num-gpus 3'),
    ('params', lambda p: p.pop('4.weight'),
     ' does not fit this network (it lacks 4.weight)' + _OTHER_NETWORK),
    ('params', lambda p: p.update({'5.weight': nd.ones(1)}),
     ' does not fit this network (it holds 5.weight)' + _OTHER_NETWORK),
    ('params', lambda p: p.update({'4.bias': nd.ones(11)}),
     ' does not fit this network (4.bias has shape (11,) (float32) in the file but (10,) '
     '(float32) in the network)' + _OTHER_NETWORK),
    ('params', lambda p: p.update({'4.bias': nd.ones((10, 1))}),
     ' does not fit this network (4.bias has shape (10, 1) (float32) in the file but (10,) '
     '(float32) in the network)' + _OTHER_NETWORK),
    ('params', lambda p: p.update({'4.bias': nd.ones(10, dtype='float16')}),
     ' does not fit this network (4.bias has shape (10,) (float16) in the file but (10,) '
     '(float32) in the network)' + _OTHER_NETWORK),
])
def test_arrays_must_fit_this_network_and_these_devices(ck, kind, change, message):
    path = checkpoint.checkpoint_path(ck, 1, kind)
    arrays = nd.load(path)
    change(arrays)
    _forge(ck, kind, _arrays(arrays))
    assert _refused_restore(ck) == path + message


def test_a_refused_checkpoint_leaves_the_network_as_it_was(ck):
    _forge(ck, 'replicas', os.urandom(100))
    net = _bn_cnn()
    with pytest.raises(checkpoint.CheckpointError):
        _restore(ck, net=net)
    # Refused before loading: the shapes the .params file would have set are still unknown.
    assert net[0].weight.shape == (4, 0, 3, 3) and net[4].weight.shape == (10, 0)


def test_a_good_checkpoint_still_restores_every_file(ck):
    net, trainer = _restore(ck)
    params = nd.load(checkpoint.checkpoint_path(ck, 1, 'params'))
    for name, param in net._collect_params_with_prefix().items():
        if name.startswith('1.running'):  # per device: from .replicas
            for i, copy in enumerate(param.list_data()):
                assert np.array_equal(copy.asnumpy(), _replicas(ck)['%s@%d' % (name, i)].asnumpy())
        else:
            assert all(np.array_equal(c.asnumpy(), params[name].asnumpy())
                       for c in param.list_data()), name
    assert trainer.learning_rate == 0.5 and trainer._optimizer.num_update == 2


def test_a_file_changed_after_read_checkpoint_is_caught_by_restore(ck):
    record = checkpoint.read_checkpoint(ck)
    with open(checkpoint.checkpoint_path(ck, 1, 'replicas'), 'ab') as f:
        f.write(b'x')
    net = _bn_cnn()
    trainer = training.init_training(net, [mx.cpu(0), mx.cpu(1)], 0.1)
    with pytest.raises(checkpoint.CheckpointError, match=r'epoch-0001\.replicas is changed: \d+ '
                                                         r'bytes, but the run wrote \d+ bytes'):
        checkpoint.restore(ck, record, net, trainer, [mx.cpu(0), mx.cpu(1)])


@pytest.mark.parametrize('make,reason', [
    (os.mkfifo, 'is a FIFO (named pipe), not a regular file'),
    (os.mkdir, 'is a folder, not a regular file'),
    (lambda p: os.symlink('/nonexistent/x', p), 'is a dangling symbolic link (to /nonexistent/x)'),
])
@pytest.mark.parametrize('kind', checkpoint.KINDS)
def test_a_checkpoint_file_that_is_not_a_file_is_named(ck, make, reason, kind):
    path = checkpoint.checkpoint_path(ck, 1, kind)
    os.remove(path)
    make(path)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(ck)
    assert _one_line(str(e.value)) == ('%s %s, but epoch-0001.json lists it; start a new run '
                                       'with an empty --checkpoint-dir' % (path, reason))


@pytest.mark.parametrize('text,reason', [
    ('{"epoch": NaN}', 'NaN is not a number JSON allows'),
    ('[' * 100000 + ']' * 100000, 'it is nested too deeply'),
    ('{"epoch": 1' + '0' * 5000 + '}', 'Exceeds the limit (4300 digits) for integer string '
                                       'conversion'),
])
def test_a_json_that_cannot_be_read_is_one_line(ck, text, reason):
    path = checkpoint.checkpoint_path(ck, 1, 'json')
    with open(path, 'wb') as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(ck)
    message = _one_line(str(e.value))
    assert message.startswith('%s cannot be read (' % path) and message.endswith(
        '); start a new run with an empty --checkpoint-dir'), message
    assert reason in message


def test_read_json_reads_no_more_than_its_limit(tmp_path):
    # the one JSON reader of the package's checkpoints
    path = str(tmp_path / 'big.json')
    with open(path, 'wb') as f:
        f.write(b'[' + b'0,' * (1 << 20) + b'0]')  # 2 MB and 2 bytes
    with pytest.raises(ValueError) as e:
        files.read_json(path, limit=1 << 20)
    assert str(e.value) == 'it is larger than 1 MB'
    assert files.read_json(path, limit=3 << 20) == [0] * ((1 << 20) + 1)
    os.remove(path)
    with pytest.raises(files.InputError) as e:
        files.read_json(path)
    assert e.value.reason == 'does not exist'


def test_a_json_that_is_a_fifo_does_not_block(ck):
    path = checkpoint.checkpoint_path(ck, 1, 'json')
    os.remove(path)
    os.mkfifo(path)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(ck)
    assert str(e.value) == ('%s cannot be read (is a FIFO (named pipe), not a regular file); '
                            'start a new run with an empty --checkpoint-dir' % path)


@pytest.mark.parametrize('value', [[], {}, ['gluon_mgpu checkpoint 1']])
def test_a_format_that_is_no_string_is_one_line(ck, value):
    path = _edit(ck, lambda r: r.update(format=value))
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(ck)
    assert str(e.value) == ('%s is not a gluon_mgpu checkpoint 4 file for epoch 1; start a new run '
                            'with an empty --checkpoint-dir' % path)


@pytest.mark.parametrize('entry', [
    {'name': 'epoch-0002.params'}, {'name': '../epoch-0001.params'}, {'bytes': -1},
    {'bytes': True}, {'bytes': 10 ** 400}, {'sha256': 'abc'}, {'name': 7},
])
def test_a_file_entry_must_name_this_epochs_file(ck, entry):
    path = _edit(ck, lambda r: r['files']['params'].update(entry))
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(ck)
    assert str(e.value) == ('%s has no valid entry for its .params file; start a new run with '
                            'an empty --checkpoint-dir' % path)


_DROP = object()


def _set(where, key, value=_DROP):
    """A change of the record: ``record[where...][key] = value``, or delete it."""
    def change(record):
        target = record
        for k in where:
            target = target[k]
        if value is _DROP:
            del target[key]
        else:
            target[key] = value
    return change


@pytest.mark.parametrize('change,what', [
    (_set((), 'history', 'oops'), 'history is not a list of 1 epoch records'),
    (_set((), 'history', []), 'history is not a list of 1 epoch records'),
    (_set((), 'history'), 'history is not a list of 1 epoch records'),
    (_set(('history',), 0, 'oops'), 'history[0]: an epoch record is str, not an object'),
    (_set(('history', 0), 'epoch', 2), 'history[0]: epoch is not 1'),
    (_set(('history', 0), 'epoch', 1.0), 'history[0]: epoch is 1.0, not integer (>= 1)'),
    (_set(('history', 0), 'epoch', 10 ** 400), 'history[0]: epoch is a whole number of 401 '
                                               'digits, not integer (>= 1)'),
    (_set(('history', 0), 'test_acc', 1.5), 'history[0]: test_acc is 1.5, not number (>= 0, '
                                            '<= 1)'),
    (_set(('history', 0), 'seconds', 0), 'history[0]: seconds is 0, not number (> 0, <= '
                                         '1000000000.0)'),
    (_set(('history', 0), 'images_per_sec'), 'history[0]: it lacks images_per_sec'),
    (_set(('optimizer',), 'lr', -1), 'optimizer is {"lr": -1, "num_update": 2}, not a learning '
                                     'rate above 0 and an update count'),
    (_set(('optimizer',), 'num_update', 2.0), 'optimizer is {"lr": 0.5, "num_update": 2.0}, not '
                                              'a learning rate above 0 and an update count'),
    (_set((), 'optimizer'), 'optimizer is null, not a learning rate above 0 and an update count'),
])
def test_recorded_values_this_package_never_writes_are_refused(ck, change, what):
    path = _edit(ck, change)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.read_checkpoint(ck)
    assert _one_line(str(e.value)) == '%s: %s%s' % (path, what, _NOT_OURS)


@pytest.mark.parametrize('value', [float('nan'), float('inf')])
def test_nan_images_given_to_train_are_named_before_any_step(value):
    net = nn.Dense(10)
    X = nd.zeros((4, 1, 28, 28))
    X[2, 0, 5, 5] = value
    batches = [(X, nd.array([0, 1, 2, 3], dtype='int32'))]
    with pytest.raises(ValueError) as e:
        training.train(net, batches, batches, [mx.cpu(0)], num_epochs=1,
                       event_handlers=[])
    assert str(e.value) == ('the first batch of train_iter: X holds NaN or infinite values '
                            "(image 2 of the batch); pass images of finite values, such as "
                            "ToTensor's 0 to 1")


def test_non_folder_kind_names_what_is_there_instead_of_a_folder(tmp_path):
    from gluon_mgpu.runtime.files import non_folder_kind
    (tmp_path / 'folder').mkdir()
    (tmp_path / 'file').write_text('')
    os.symlink(str(tmp_path / 'folder'), str(tmp_path / 'to-folder'))
    os.symlink(str(tmp_path / 'nowhere'), str(tmp_path / 'dangling'))
    os.mkfifo(str(tmp_path / 'fifo'))
    assert [non_folder_kind(str(tmp_path / n)) for n in (
        'folder', 'to-folder', 'missing', 'file', 'dangling', 'fifo')] == [
        None, None, None, 'a regular file', 'a symbolic link', 'a FIFO (named pipe)']
    assert non_folder_kind('/dev/null') == 'a character device'


@pytest.mark.parametrize('kvstore', ['bogus', 'dveice', 5, np.array([1, 2])])
def test_65_9_init_training_refuses_a_kvstore_name_mxnet_would_take_as_local(kvstore):
    # Before: trained, MXNet making a local kvstore of any name (a typo of 'device' included).
    net = training.new_network('lenet')
    with pytest.raises(ValueError) as e:
        training.init_training(net, [mx.cpu(0), mx.cpu(1)], 0.1, kvstore=kvstore)
    assert str(e.value) == (
        "kvstore=%s names no kvstore this package trains with; pass one of 'device', 'local', "
        "'dist_sync', 'dist_device_sync', 'horovod', 'nccl' (GPUs), or a KVStore such as "
        "mx.kv.create('local')" % (repr(kvstore),))
    with pytest.raises(RuntimeError):  # nothing initialized
        net[0].weight.data()
    for fine in ('local', mx.kv.create('device'), None):
        assert training.init_training(net, [mx.cpu(0)], 0.1, kvstore=fine).learning_rate == 0.1


@pytest.mark.parametrize('devices,line', [
    ([], 'devices is empty; pass a list of contexts such as [mx.cpu(0), mx.cpu(1)], or leave it '
         'out for try_all_gpus()'),
    ([mx.cpu(0), mx.cpu(1), mx.cpu(0)], 'devices [cpu(0), cpu(1), cpu(0)] lists cpu(0) twice; a '
                                        'device holds one replica, so list each once')])
def test_65_9_init_training_refuses_the_devices_train_refuses(devices, line):
    # Before: [] gave a Trainer over no device, and a device listed twice two replicas on it.
    net = training.new_network()
    with pytest.raises(ValueError) as e:
        training.init_training(net, devices, 0.1)
    assert str(e.value) == line
    with pytest.raises(RuntimeError):  # nothing initialized
        net[0].weight.data()


@pytest.mark.parametrize('n', [-1, 0, 1.5])
def test_65_9_book_setting_refuses_what_is_no_device_count(n):
    # Before: book_setting(-1) returned (-256, -0.1).
    with pytest.raises(ValueError) as e:
        training.book_setting(n)
    assert str(e.value) == ('num_devices must be a whole number >= 1, got %r; for example '
                            'book_setting(2), the setting for 2' % n)
    assert training.book_setting(3) == (768, 0.30000000000000004)


def test_65_9_split_batch_refuses_no_devices_as_train_does():
    # Before: ZeroDivisionError from MXNet's split_and_load.
    X, y = nd.zeros((4, 1, 28, 28)), nd.zeros((4,))
    with pytest.raises(ValueError) as e:
        training.split_batch(X, y, [])
    assert str(e.value) == ('devices is empty; pass a list of contexts such as [mx.cpu(0), '
                            'mx.cpu(1)], or leave it out for try_all_gpus()')


@pytest.mark.parametrize('call,line', [
    # Before: accepted, a network of no classes or channels (MXNetError once it ran).
    (lambda g: g.resnet18(0), "num_classes must be a whole number >= 1, got 0; for example "
                              "resnet18(10), Fashion-MNIST's classes"),
    (lambda g: g.resnet18(-1), "num_classes must be a whole number >= 1, got -1; for example "
                               "resnet18(10), Fashion-MNIST's classes"),
    (lambda g: g.Residual(0), 'num_channels must be a whole number >= 1, got 0; for example '
                              'Residual(64)'),
    (lambda g: g.Residual(64.0), 'num_channels must be a whole number >= 1, got 64.0; for '
                                 'example Residual(64)'),
    # Before: KeyError 'epoch'.
    (lambda g: g.format_epoch({}), "format_epoch takes an epoch record of train()'s history, "
     'with numbers epoch, seconds and test_acc; got {}; pass one, such as history[-1]'),
    (lambda g: g.format_epoch({'epoch': 'one', 'seconds': 1.0, 'test_acc': 0.5}),
     "format_epoch takes an epoch record of train()'s history, with numbers epoch, seconds and "
     "test_acc; got {'epoch': 'one', 'seconds': 1.0, 'test_acc': 0.5}; pass one, such as "
     'history[-1]'),
    # Before: AttributeError: 'NoneType' object has no attribute 'shape'.
    (lambda g: g.split_batch(None, nd.zeros((4,)), [mx.cpu(0)]), 'the batch to split: X is a '
     'builtins.NoneType, not an mxnet NDArray; convert it, for example nd.array(X)'),
    (lambda g: g.split_batch(nd.zeros((4, 1, 28, 28)), [0, 1, 2, 3], [mx.cpu(0)]), 'the batch '
     'to split: y is a builtins.list, not an mxnet NDArray; convert it, for example nd.array(y)')])
def test_65_9_the_networks_the_line_and_the_split_refuse_what_they_cannot_take(call, line):
    import gluon_mgpu
    with pytest.raises(ValueError) as e:
        call(gluon_mgpu)
    assert str(e.value) == line
    assert gluon_mgpu.format_epoch({'epoch': 2, 'seconds': 63.46, 'test_acc': 0.857}) == \
        'epoch 2, training time: 63.5 sec, test_acc 0.86'


@pytest.mark.parametrize('call,line', [
    (lambda g: g.get_fashion_mnist_labels([3, 11]), 'labels holds 11, not a Fashion-MNIST label '
     '(0 to 9); pass the labels the data set gives, such as y.asnumpy()'),
    # Before: -1 named the last class, 'ankle boot'.
    (lambda g: g.get_fashion_mnist_labels(np.array([-1.0])), 'labels holds -1, not a '
     'Fashion-MNIST label (0 to 9); pass the labels the data set gives, such as y.asnumpy()'),
    (lambda g: g.try_gpu(-1), 'i must be a whole number >= 0, got -1; for example try_gpu(0), '
                              'the first GPU'),  # before: mx.gpu(-1)
    (lambda g: g.try_gpu('1'), "i must be a whole number >= 0, got '1'; for example try_gpu(0), "
                               "the first GPU")])  # before: a TypeError of '<'
def test_65_9_the_books_helpers_refuse_what_names_no_label_or_gpu(call, line):
    import gluon_mgpu
    with pytest.raises(ValueError) as e:
        call(gluon_mgpu)
    assert str(e.value) == line
    assert gluon_mgpu.get_fashion_mnist_labels(np.array([0, 9.0])) == ['t-shirt', 'ankle boot']
