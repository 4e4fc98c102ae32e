"""Checkpoints: after every epoch the run's state goes into its folder, so that a stopped run
goes on where it was (docs/checkpoints.md). Each epoch writes three files, each put in place
atomically, the JSON last: ``epoch-0003.params`` (device 0's parameters, ``save_parameters``),
``epoch-0003.replicas`` (each device's copies that differ from those: BatchNorm's running
statistics) and ``epoch-0003.json`` (format, step, history, the learning rate and update count,
what the caller adds, such as the command line, and each file's size and sha256). Nothing read
back can run code: MXNet array files and JSON, checked before anything is loaded.
"""
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import tempfile

import mxnet as mx
import numpy as np
from mxnet import nd

from ..runtime.checkpoint_names import (_TEMP, KINDS, LOCK_NAME, checkpoint_path,
                                        is_checkpoint_file, list_checkpoints)
from .events import OLD_STEP, PRIORITY, STEP, EpochEnd, TrainBegin
from .metrics import epoch_problem
from ..runtime.files import InputError, atomic_path, open_input
from ..runtime.checks import one_line

__all__ = ['CheckpointError', 'FORMAT', 'KINDS', 'checkpoint_path', 'is_checkpoint_file',
           'list_checkpoints', 'lock_dir', 'prepare_dir', 'save_checkpoint', 'read_checkpoint',
           'restore', 'Resume', 'CheckpointHandler']

FORMAT = 'gluon_mgpu checkpoint 4'
# Older formats, refused with the last commit that resumes them.
_OLDER = {'gluon_mgpu checkpoint 1': ('84e04e4', 'format 1, whose optimizer state is a pickle'),
          'gluon_mgpu checkpoint 2': ('03b47ec', 'format 2, trained with the old step %s'
                                      % OLD_STEP),
          'gluon_mgpu checkpoint 3': ('452e568', 'format 3, with an optimizer state file')}
JSON_LIMIT = 64 << 20  # bytes; a history of a thousand epochs is about 200 kB


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged or does not fit this run, or a folder in use; the
    message is one line naming the file and what to do."""


class _Lock:
    def __init__(self, path, fd):
        self.path, self._fd = path, fd

    def release(self):
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the descriptor; .lock stays
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release()


def lock_dir(directory):
    """Take the lock of checkpoint folder ``directory`` (created if needed): ``flock`` on its
    ``.lock``, which holds the owner's pid and is never deleted; the system releases it when the
    process ends, even by SIGKILL. Returns the lock (``release()``, or a ``with`` block).

    Raises
    ------
    CheckpointError
        When another process holds it (naming its pid).
    ValueError
        When the folder or its ``.lock`` cannot be created or is not a regular file.
    """
    path = os.path.join(directory, LOCK_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        what = '%s is a symbolic link' % path if os.path.islink(path) else e.strerror or str(e)
        raise ValueError('cannot write checkpoints to %s (%s); pass a folder you can write to'
                         % (directory, what)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError('cannot write checkpoints to %s (%s is not a regular file); pass '
                             'another folder' % (directory, path))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode('ascii', 'replace').strip()
        os.close(fd)
        raise CheckpointError('%s is in use by another run (pid %s); wait for it to end, or pass '
                              'another --checkpoint-dir' % (directory, text if text.isdigit()
                                                            and text.isascii() else 'unknown'))
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, b'%d\n' % os.getpid(), 0)
    return _Lock(path, fd)


def prepare_dir(directory):
    """Create ``directory`` if needed, check that it is writable and delete the temporary files
    a killed run left (hold its lock first); return their names.

    Raises
    ------
    ValueError
        Naming the folder and the system's reason.
    """
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
        names = os.listdir(directory)
        stale = sorted(n for n in names if _TEMP.match(n))
        for name in stale:
            os.remove(os.path.join(directory, name))
        for name in sorted(set(names) - set(stale)):  # where the run writes: regular files
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if is_checkpoint_file(name) and not stat.S_ISREG(mode):
                raise ValueError('%s holds %s, which is %s where a checkpoint file goes; remove '
                                 'it or pass another folder' % (directory, name, _KIND.get(
                                     stat.S_IFMT(mode), 'not a regular file')))
    except OSError as e:
        raise ValueError('cannot write checkpoints to %s (%s); pass a folder you can write to'
                         % (directory, e.strerror or e)) from None
    return stale


_KIND = {stat.S_IFDIR: 'a folder', stat.S_IFLNK: 'a symbolic link', stat.S_IFIFO: 'a FIFO'}


def _write(path, write):
    """``write(tmp)``, then the file in place atomically; return its JSON entry."""
    with atomic_path(path) as tmp:
        write(tmp)
        with open(tmp, 'rb') as f:
            data = f.read()
    return {'name': os.path.basename(path), 'bytes': len(data),
            'sha256': hashlib.sha256(data).hexdigest()}


def _initialized(trainer):
    """``trainer`` as its first step leaves it (kvstore made, every device given device 0's
    values); return its updaters, which hold the optimizer's states (MXNet 1.9.1)."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return [trainer._kvstore._updater] if trainer._update_on_kvstore else trainer._updaters


def _optimizer_states(trainer):
    updaters = _initialized(trainer)
    return [s for u in updaters for s in u.states.values() if s is not None]


def save_checkpoint(directory, epoch, net, trainer, info):
    """Write the checkpoint of finished epoch ``epoch`` (from 1); return its JSON file's path.

    ``info`` is stored as given beside ``format``, ``step``, ``epoch``, ``optimizer`` and
    ``files``; the CLI stores ``argv``, ``history``, ``network`` and ``devices``. ``trainer``'s
    optimizer must keep no state (the chapter's SGD without momentum): only its learning rate
    and update count are recorded.

    Raises
    ------
    CheckpointError
        For an optimizer with state, before anything is written.
    files.OutputError
        When a file cannot be written; this checkpoint is then not committed.
    """
    if _optimizer_states(trainer):
        raise CheckpointError('the optimizer %s keeps state (momentum or the like), which a '
                              'checkpoint does not hold; train with SGD without momentum, as the '
                              'chapter does' % type(trainer._optimizer).__name__)
    params = checkpoint_path(directory, epoch, 'params')
    files = {'params': _write(params, net.save_parameters)}
    saved, replicas = nd.load(params), {}
    for name, param in net._collect_params_with_prefix().items():
        copies = param.list_data()  # those that differ from the file: every device's
        if any(not np.array_equal(c.asnumpy(), saved[name].asnumpy()) for c in copies):
            replicas.update(('%s@%d' % (name, i), c.copyto(mx.cpu())) for i, c in enumerate(copies))
    files['replicas'] = _write(checkpoint_path(directory, epoch, 'replicas'),
                               lambda tmp: nd.save(tmp, replicas))
    record = dict(info, format=FORMAT, step=STEP, epoch=epoch, files=files,
                  optimizer={'lr': trainer.learning_rate,
                             'num_update': trainer._optimizer.num_update})
    text = json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + '\n'
    path = checkpoint_path(directory, epoch, 'json')

    def write_json(tmp):
        with open(tmp, 'w') as f:
            f.write(text)
    _write(path, write_json)
    return path


def _fix(directory, epoch):
    earlier = [e for e in list_checkpoints(directory) if e < epoch]
    if earlier:
        return ('delete %s to resume from epoch %d instead'
                % (checkpoint_path(directory, epoch, '*'), earlier[-1]))
    return 'start a new run with an empty --checkpoint-dir'


def _not_ours(path, what):
    return CheckpointError('%s: %s; the file was not written by this version of gluon_mgpu or was '
                           'changed: start a new run in an empty --checkpoint-dir' % (path, what))


def _refuse_constant(name):
    raise ValueError('%s is not a number JSON allows' % name)


def _read_json(path, directory, epoch):
    try:
        with open_input(path) as f:
            raw = f.read(JSON_LIMIT + 1)
        if len(raw) > JSON_LIMIT:
            raise ValueError('it is larger than %d MB' % (JSON_LIMIT >> 20))
        return json.loads(raw.decode('utf-8'), parse_constant=_refuse_constant)
    except InputError as e:
        reason = e.reason
    except (OSError, ValueError, RecursionError) as e:
        reason = ('it is nested too deeply' if isinstance(e, RecursionError)
                  else getattr(e, 'strerror', None) or str(e))
    raise CheckpointError('%s cannot be read (%s); %s' % (path, reason, _fix(directory, epoch)))


def read_checkpoint(directory, epoch=None):
    """Read a checkpoint's JSON (default: the latest), check it and the files it lists; return
    it as a dict.

    Raises
    ------
    CheckpointError
        One line: no checkpoint, an older format, a JSON that cannot be read or holds values this
        package never writes, or a listed file that is missing, not a regular file, or has
        another size or sha256 than recorded.
    """
    if epoch is None:
        epochs = list_checkpoints(directory)
        if not epochs:
            what = ('holds no checkpoint' if os.path.isdir(directory) else
                    'is not a folder' if os.path.exists(directory) else 'does not exist')
            raise CheckpointError('%s %s (no epoch-NNNN.json file), so there is nothing to '
                                  'resume; leave out --resume to start a new run'
                                  % (directory, what))
        epoch = epochs[-1]
    path = checkpoint_path(directory, epoch, 'json')
    record = _read_json(path, directory, epoch)
    if isinstance(record, dict) and record.get('format') in _OLDER:
        commit, what = _OLDER[record['format']]
        raise CheckpointError('%s was written by an older gluon_mgpu (%s); start a new run with '
                              'another --checkpoint-dir, or resume it with gluon_mgpu at commit '
                              '%s' % (path, what, commit))
    if not isinstance(record, dict) or record.get('format') != FORMAT \
            or record.get('step') != STEP or type(record.get('epoch')) is not int \
            or record['epoch'] != epoch \
            or not isinstance(record.get('files'), dict) or set(record['files']) != set(KINDS):
        raise CheckpointError('%s is not a %s file for epoch %d; %s'
                              % (path, FORMAT, epoch, _fix(directory, epoch)))
    history, optimizer = record.get('history'), record.get('optimizer')
    if not isinstance(history, list) or len(history) != epoch:
        raise _not_ours(path, 'history is not a list of %d epoch records' % epoch)
    for i, entry in enumerate(history):
        problem = epoch_problem(entry) or (entry['epoch'] != i + 1 and 'epoch is not %d' % (i + 1))
        if problem:
            raise _not_ours(path, 'history[%d]: %s' % (i, problem))
    lr, updates = (optimizer.get(k) if isinstance(optimizer, dict) else None
                   for k in ('lr', 'num_update'))
    if not (type(lr) in (int, float) and math.isfinite(lr) and lr > 0
            and type(updates) is int and 0 <= updates < 2 ** 63):
        raise _not_ours(path, 'optimizer is %s, not a learning rate above 0 and an update '
                              'count' % json.dumps(optimizer)[:40])
    for kind in KINDS:
        _verified(directory, record, kind)
    return record


def _verified(directory, record, kind):
    """The bytes of one file of the checkpoint, once their size and sha256 are those recorded."""
    epoch, entry = record['epoch'], record['files'][kind]
    json_path, fix = checkpoint_path(directory, epoch, 'json'), _fix(directory, epoch)
    name = os.path.basename(checkpoint_path(directory, epoch, kind))
    if not (isinstance(entry, dict) and entry.get('name') == name
            and type(entry.get('bytes')) is int and 0 <= entry['bytes'] < 2 ** 40
            and re.fullmatch(r'[0-9a-f]{64}', str(entry.get('sha256')))):
        raise CheckpointError('%s has no valid entry for its .%s file; %s' % (json_path, kind, fix))
    path = os.path.join(directory, name)
    try:
        with open_input(path) as f:
            data = f.read(entry['bytes'] + 1)
            size = max(len(data), os.fstat(f.fileno()).st_size)
    except InputError as e:
        raise CheckpointError('%s %s, but %s lists it; %s' % (
            path, 'is missing' if e.reason == 'does not exist' else e.reason,
            os.path.basename(json_path), fix)) from None
    except OSError as e:
        raise CheckpointError('%s cannot be read (%s); %s'
                              % (path, e.strerror or e, fix)) from None
    if size != entry['bytes']:
        raise CheckpointError('%s is %s: %d bytes, but the run wrote %d bytes; %s'
                              % (path, 'truncated' if size < entry['bytes'] else 'changed',
                                 size, entry['bytes'], fix))
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry['sha256']:
        raise CheckpointError('%s has sha256 %s..., but the run recorded %s...: it was changed '
                              'after the run wrote it, and only files the run wrote are loaded; '
                              '%s' % (path, digest[:12], entry['sha256'][:12], fix))
    return data


def _arrays(data, path):
    try:
        loaded = nd.load_frombuffer(data)
    except Exception as e:  # MXNet's loader says what it could not parse
        raise CheckpointError('%s is not an MXNet array file (%s); start a new run in an empty '
                              '--checkpoint-dir' % (path, one_line(e, 200))) from None
    if isinstance(loaded, list) and not loaded:
        return {}  # nd.save of an empty dict
    if not isinstance(loaded, dict) or not all(type(v) is nd.NDArray and v.stype == 'default'
                                               for v in loaded.values()):
        raise CheckpointError('%s does not hold named dense arrays; start a new run in an empty '
                              '--checkpoint-dir' % path)
    return loaded


def _fits(saved, expected):  # 0 in a shape not inferred yet stands for any size
    return len(saved) == len(expected) and all(e in (0, s) for s, e in zip(saved, expected))


def restore(directory, record, net, trainer, devices):
    """Load a checkpoint (``record`` from ``read_checkpoint``) into ``net``, initialized on
    ``devices``, and ``trainer``, made for them: every array is checked against the network
    and the devices before anything is loaded, then the parameters, each device's own copies,
    the learning rate and the update count.

    Raises
    ------
    CheckpointError
        One line: a file changed since ``read_checkpoint``, is not an MXNet file, or does not
        fit ``net`` (another network) or ``devices`` (another count).
    """
    paths = {k: checkpoint_path(directory, record['epoch'], k) for k in KINDS}
    loaded, replicas = (_arrays(_verified(directory, record, k), paths[k]) for k in KINDS)
    params = net._collect_params_with_prefix()

    def refuse(what):
        raise CheckpointError('%s does not fit this network (%s): the checkpoint was written for '
                              'another network (%s)' % (paths['params'], what,
                                                        record.get('network')))
    names = sorted(set(params) ^ set(loaded))
    if names:
        refuse('%s %s' % ('it lacks' if names[0] in params else 'it holds', names[0]))
    for name, value in loaded.items():
        param = params[name]
        if not _fits(value.shape, param.shape) or np.dtype(value.dtype) != np.dtype(param.dtype):
            refuse('%s has shape %s (%s) in the file but %s (%s) in the network' % (
                name, value.shape, np.dtype(value.dtype), param.shape, np.dtype(param.dtype)))
    for key, value in replicas.items():
        name, _, index = key.rpartition('@')
        if name not in loaded or not re.fullmatch(r'0|[1-9]\d{0,3}', index) \
                or value.shape != loaded[name].shape or value.dtype != loaded[name].dtype:
            raise _not_ours(paths['replicas'], 'it holds %s, which is no copy of a parameter of '
                                               'this network' % key[:60])
        if int(index) >= len(devices):
            raise CheckpointError('%s holds a copy for device %s, but this run has %d devices; '
                                  'resume with --num-gpus %d' % (paths['replicas'], index,
                                                                 len(devices), int(index) + 1))
    for path, arrays in ((paths['params'], loaded), (paths['replicas'], replicas)):
        bad = next((k for k, v in sorted(arrays.items()) if not np.isfinite(v.asnumpy()).all()),
                   None)
        if bad:
            raise _not_ours(path, '%s holds NaN or infinite values' % bad)
    for name, value in loaded.items():
        params[name]._load_init(value, devices)
    # Before the copies: the Trainer's first use copies device 0's values to every device.
    _initialized(trainer)
    trainer.set_learning_rate(record['optimizer']['lr'])
    trainer._optimizer.num_update = record['optimizer']['num_update']
    for key, value in replicas.items():
        name, _, index = key.rpartition('@')
        copy = params[name].list_data()[int(index)]
        copy[:] = value.as_in_context(copy.context)


class Resume(TrainBegin):
    """Event handler: continue a restored run after the epoch of its ``record`` (``None``:
    nothing to do), with its history; for a process that does not save."""

    priority = PRIORITY['CheckpointHandler']

    def __init__(self, record):
        self.resume = record

    def train_begin(self, estimator, *args, **kwargs):
        if self.resume is not None:
            estimator.resume(self.resume['epoch'], self.resume['history'])


class CheckpointHandler(Resume, EpochEnd):
    """Event handler: save a checkpoint at the end of every epoch (``save_checkpoint`` with
    ``info`` and the history); continue a restored run (``resume``, its record)."""

    def __init__(self, directory, info, resume=None):
        super().__init__(resume)
        self.directory, self.info = directory, dict(info)

    def epoch_end(self, estimator, *args, **kwargs):
        save_checkpoint(self.directory, estimator.record['epoch'], estimator.net,
                        estimator.trainer, dict(self.info, history=list(estimator.history)))
        return False
