"""Checkpoints: after every epoch ``epoch-0003.params``, ``.replicas`` (device copies that differ)
and ``.json`` (last), each atomic; nothing read back runs code. See docs/checkpoints.md."""
import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile

import mxnet as mx
import numpy as np
from mxnet import nd

from .checkpoint_names import EPOCH_FILE, checkpoint_path, list_checkpoints
from .events import (OLD_STEP, PRIORITY, STEP, EpochEnd, EpochLine, LossGuard, TrainBegin,
                     TrainEnd)
from .metrics import epoch_problem, write_json_atomic
from ..runtime.checks import is_whole, one_line
from ..runtime.files import (InputError, OutputError, atomic_path, file_kind, lock_file,
                             non_folder_kind, open_input, read_json)

__all__ = ['CheckpointError', 'FORMAT', 'KINDS', 'LOCK_NAME', 'not_ours', 'is_checkpoint_file',
           'lock_dir', 'save_checkpoint', 'read_checkpoint', 'nonfinite', 'restore',
           'folder_identity', 'copied_from', 'CheckpointHandler', 'resumable']

FORMAT = 'gluon_mgpu checkpoint 4'
KINDS = ('params', 'replicas')  # the arrays' files, listed in the JSON file
LOCK_NAME = '.lock'
# Older formats: what they were, and the last commit that resumes them.
_OLDER = {'gluon_mgpu checkpoint 1': ('format 1, whose optimizer state is a pickle', '84e04e4'),
          'gluon_mgpu checkpoint 2': ('format 2, trained with the old step ' + OLD_STEP, '03b47ec'),
          'gluon_mgpu checkpoint 3': ('format 3, with an optimizer state file', '452e568')}
_TEMP = re.compile(r'\.epoch-\d{4,}\.\w+\.\w+\.tmp$')  # atomic_path's: .epoch-0003.params.*.tmp
_NEW_RUN = 'start a new run %s an empty --checkpoint-dir'


class CheckpointError(RuntimeError):
    """A checkpoint missing, damaged or not of this run, or a folder in use: one line, and a fix."""


def not_ours(path, what):
    """The ``CheckpointError`` of checkpoint file ``path`` holding ``what``, which no run writes."""
    return CheckpointError('%s: %s; the file was not written by this version of gluon_mgpu or was '
                           'changed: %s' % (path, what, _NEW_RUN % 'in'))


def is_checkpoint_file(name):
    """Whether ``name`` is a checkpoint folder's own: a checkpoint file, its temporary, the lock."""
    return bool(EPOCH_FILE.match(name) or _TEMP.match(name)) or name == LOCK_NAME


def lock_dir(directory, flag='--checkpoint-dir'):
    """Lock checkpoint folder ``directory`` (made if needed) by its kept ``.lock``; delete killed
    writes' temporaries. ``CheckpointError`` if another run holds it (the fix names ``flag``, the
    command's for the folder), ``ValueError`` if unusable."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
        with contextlib.ExitStack() as undo:
            lock = undo.enter_context(lock_file(path, directory, 'pass another %s' % flag,
                                                keep=True))
            tempfile.TemporaryFile(dir=directory).close()
            for name in sorted(os.listdir(directory)):
                mode = os.lstat(os.path.join(directory, name)).st_mode
                if is_checkpoint_file(name) and not stat.S_ISREG(mode):  # a temporary's too
                    raise ValueError('%s holds %s, which is %s where a checkpoint file goes; '
                                     'remove it or pass another folder'
                                     % (directory, name, file_kind(mode)))
                if _TEMP.match(name):
                    os.remove(os.path.join(directory, name))
            undo.pop_all()
            return lock
    except OutputError as e:  # held by another run
        raise CheckpointError(str(e)) from None
    except OSError as e:
        kind = non_folder_kind(directory)
        reason = ('it is %s, not a folder' % kind if kind else '%s is a symbolic link' % path
                  if os.path.islink(path) else e.strerror or e)
        raise ValueError('cannot write checkpoints to %s (%s); pass a folder you can write to'
                         % (directory, reason)) from None


def _write(path, write):
    """``write(tmp)``, then the file in place atomically; return its JSON entry."""
    with atomic_path(path) as tmp:
        write(tmp)
        with open(tmp, 'rb') as f:
            data = f.read()
    return {'name': os.path.basename(path), 'bytes': len(data),
            'sha256': hashlib.sha256(data).hexdigest()}


def _updaters(trainer):
    """``trainer`` as its first step leaves it; its updaters, with the optimizer's states."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return [trainer._kvstore._updater] if trainer._update_on_kvstore else trainer._updaters


def save_checkpoint(directory, epoch, net, trainer, info):
    """Write finished epoch ``epoch``'s checkpoint, its JSON with ``info``, the learning rate and
    update count; ``CheckpointError`` for an optimizer with state, ``OutputError`` for a write."""
    if any(s is not None for u in _updaters(trainer) for s in u.states.values()):
        raise CheckpointError('the optimizer %s keeps state (momentum or the like), which a '
                              'checkpoint does not hold; train with SGD without momentum, as the '
                              'chapter does' % type(trainer._optimizer).__name__)
    params = checkpoint_path(directory, epoch, 'params')
    files = {'params': _write(params, net.save_parameters)}
    saved, replicas = nd.load(params), {}
    for name, param in net._collect_params_with_prefix().items():
        copies = param.list_data()  # all of them, if one differs from the file's
        if any(not np.array_equal(c.asnumpy(), saved[name].asnumpy()) for c in copies):
            replicas.update(('%s@%d' % (name, i), c.copyto(mx.cpu())) for i, c in enumerate(copies))
    files['replicas'] = _write(checkpoint_path(directory, epoch, 'replicas'),
                               lambda tmp: nd.save(tmp, replicas))
    write_json_atomic(checkpoint_path(directory, epoch, 'json'), dict(
        info, format=FORMAT, step=STEP, epoch=epoch, files=files,
        folder=folder_identity(directory), optimizer={
            'lr': trainer.learning_rate, 'num_update': trainer._optimizer.num_update}))


def folder_identity(directory):
    """Folder ``directory``'s real path, device and inode (``cp -r`` gets another inode)."""
    st = os.stat(directory)
    return {'path': os.path.realpath(directory), 'device': st.st_dev, 'inode': st.st_ino}


def copied_from(directory, record):
    """If ``directory`` is a copy of the folder ``record`` was written in (or moved to a disk):
    that folder and this one, as paths, or with device and inode where the paths are equal."""
    folder, here = record.get('folder'), folder_identity(directory)
    same = folder is not None and os.path.normpath(folder['path']) == here['path']
    if folder is None or here['inode'] == folder['inode'] and (
            here['device'] == folder['device'] or same):
        return None
    return tuple(f['path'] + (' (device %d, inode %d)' % (f['device'], f['inode']) if same else '')
                 for f in (folder, here))


def _fix(directory, epoch):
    earlier = [e for e in list_checkpoints(directory) if e < epoch]
    return ('delete %s to resume from epoch %d instead' % (checkpoint_path(
        directory, epoch, '*'), earlier[-1]) if earlier else _NEW_RUN % 'with')


def read_checkpoint(directory, epoch=None, record=None):
    """The JSON of epoch ``epoch``'s checkpoint (default: the latest; or ``record``) as a dict,
    once it and its files are checked; else ``CheckpointError``."""
    epoch = max(list_checkpoints(directory), default=None) if epoch is None else epoch
    if epoch is None:
        state = ('holds no checkpoint' if os.path.isdir(directory) else 'is not a folder'
                 if os.path.exists(directory) else 'does not exist')
        raise CheckpointError('%s %s (no epoch-NNNN.json file), so there is nothing to resume; '
                              'leave out --resume to start a new run' % (directory, state))
    path, fix = checkpoint_path(directory, epoch, 'json'), _fix(directory, epoch)
    try:
        record = read_json(path) if record is None else record
    except (OSError, ValueError) as e:  # an InputError's strerror is its reason
        raise CheckpointError('%s cannot be read (%s); %s' % (
            path, getattr(e, 'strerror', None) or e, getattr(e, 'fix', None) or fix)) from None
    if isinstance(record, dict) and str(record.get('format')) in _OLDER:  # a list: unhashable
        raise CheckpointError('%s was written by an older gluon_mgpu (%s); start a new run with '
                              'another --checkpoint-dir, or resume it with gluon_mgpu at commit '
                              '%s' % ((path,) + _OLDER[record['format']]))
    if not isinstance(record, dict) or type(record.get('epoch')) is not int \
            or tuple(map(record.get, ('format', 'step', 'epoch'))) != (FORMAT, STEP, epoch) \
            or not isinstance(record.get('files'), dict) or set(record['files']) != set(KINDS):
        raise CheckpointError('%s is not a %s file for epoch %d; %s' % (path, FORMAT, epoch, fix))
    history, optimizer, folder, cwd = map(record.get, ('history', 'optimizer', 'folder', 'cwd'))
    if not isinstance(history, list) or len(history) != epoch:
        raise not_ours(path, 'history is not a list of %d epoch records' % epoch)
    for i, entry in enumerate(history):
        problem = epoch_problem(entry) or (entry['epoch'] != i + 1 and 'epoch is not %d' % (i + 1))
        if problem:
            raise not_ours(path, 'history[%d]: %s' % (i, problem))
    if folder is not None and not (isinstance(folder, dict) and set(folder) == {
            'path', 'device', 'inode'} and isinstance(folder['path'], str) and all(
            type(folder[k]) is int and 0 <= folder[k] < 2 ** 64 for k in ('device', 'inode'))):
        raise not_ours(path, 'folder is %s, not a path, a device and an inode'
                       % json.dumps(folder)[:40])
    if cwd is not None and not (isinstance(cwd, str) and os.path.isabs(cwd) and '\0' not in cwd):
        raise not_ours(path, 'cwd is %s, not an absolute path' % json.dumps(cwd)[:40])
    lr, updates = map((optimizer if isinstance(optimizer, dict) else {}).get, ('lr', 'num_update'))
    if not (type(lr) in (int, float) and 0 < lr < float('inf') and is_whole(updates, 0)):
        raise not_ours(path, 'optimizer is %s, not a learning rate above 0 and an update count'
                       % json.dumps(optimizer)[:40])
    for kind in KINDS:
        _arrays(directory, record, kind)
    return record


def _arrays(directory, record, kind):
    """The named dense arrays of one file of checkpoint ``record``, of its recorded sha256."""
    epoch, entry = record['epoch'], record['files'][kind]
    path, fix = checkpoint_path(directory, epoch, kind), _fix(directory, epoch)
    if not (isinstance(entry, dict) and entry.get('name') == os.path.basename(path) and is_whole(
            entry.get('bytes'), 0) and re.fullmatch(r'[0-9a-f]{64}', str(entry.get('sha256')))):
        raise CheckpointError('%s has no valid entry for its .%s file; %s'
                              % (checkpoint_path(directory, epoch, 'json'), kind, fix))
    try:
        with open_input(path) as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(min(size, entry['bytes']) + 1)
    except InputError as e:
        raise CheckpointError('%s %s, but epoch-%04d.json lists it; %s' % (path, 'is missing' if (
            e.reason == 'does not exist') else e.reason, epoch, fix)) from None
    except OSError as e:
        raise CheckpointError('%s cannot be read (%s); %s' % (path, e.strerror or e, fix)) from None
    if size != entry['bytes']:
        raise CheckpointError('%s is %s: %d bytes, but the run wrote %d bytes; %s' % (
            path, 'truncated' if size < entry['bytes'] else 'changed', size, entry['bytes'], fix))
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry['sha256']:
        raise CheckpointError('%s has sha256 %s..., but the run recorded %s...: it was changed '
                              'after the run wrote it, and only files the run wrote are loaded; '
                              '%s' % (path, digest[:12], entry['sha256'][:12], fix))
    try:
        loaded = nd.load_frombuffer(data) or {}  # [] for an empty dict
        if not isinstance(loaded, dict) or any(v.stype != 'default' for v in loaded.values()):
            raise TypeError('it does not hold named dense arrays')
    except Exception as e:  # MXNet's loader says what it could not parse
        raise CheckpointError('%s is not an MXNet array file (%s); %s'
                              % (path, one_line(e, 200), _NEW_RUN % 'in')) from None
    return loaded


def nonfinite(directory, record, arrays=None):
    """``(path, name)`` of ``record``'s first array (of ``arrays``, if read) not finite, or None."""
    arrays = arrays or [_arrays(directory, record, kind) for kind in KINDS]
    return next(((checkpoint_path(directory, record['epoch'], kind), name)
                 for kind, named in zip(KINDS, arrays) for name, value in sorted(named.items())
                 if not np.isfinite(value.asnumpy()).all()), None)


def restore(directory, record, net, trainer, devices):
    """Load checkpoint ``record`` into ``net`` (initialized on ``devices``) and ``trainer``, or
    raise ``CheckpointError`` before loading anything changed or not fitting them."""
    loaded, replicas = (_arrays(directory, record, kind) for kind in KINDS)
    paths = {kind: checkpoint_path(directory, record['epoch'], kind) for kind in KINDS}
    params = net._collect_params_with_prefix()
    names = sorted(set(params) ^ set(loaded))
    problem = names and '%s %s' % ('it lacks' if names[0] in params else 'it holds', names[0])
    for name, value in [] if problem else loaded.items():
        shape, dtype = params[name].shape, np.dtype(params[name].dtype)  # 0: not inferred yet
        if len(value.shape) != len(shape) or np.dtype(value.dtype) != dtype \
                or any(e not in (0, s) for s, e in zip(value.shape, shape)):
            problem = '%s has shape %s (%s) in the file but %s (%s) in the network' % (
                name, value.shape, np.dtype(value.dtype), shape, dtype)
            break
    bad = nonfinite(directory, record, (loaded, replicas))
    if bad:  # a run that diverged before this epoch ended, or a changed file: no way on from it
        raise CheckpointError('%s: %s holds NaN or infinite values (the run diverged before it '
                              'was saved, or the file was changed), so training cannot go on '
                              'from it; %s' % (bad + (_fix(directory, record['epoch']),)))
    if problem:
        raise CheckpointError('%s does not fit this network (%s): the checkpoint was written for '
                              'another network (%s)' % (paths['params'], problem,
                                                        record.get('network')))
    copies = []
    for key, value in replicas.items():
        name, _, index = key.rpartition('@')
        if name not in loaded or not re.fullmatch(r'0|[1-9]\d{0,3}', index) \
                or value.shape != loaded[name].shape or value.dtype != loaded[name].dtype:
            raise not_ours(paths['replicas'], 'it holds %s, which is no copy of a parameter of '
                                              'this network' % key[:60])
        if int(index) >= len(devices):
            raise CheckpointError('%s holds a copy for device %s, but this run has %d devices; '
                                  'resume with --num-gpus %d' % (paths['replicas'], index,
                                                                 len(devices), int(index) + 1))
        copies.append((params[name], int(index), value))
    for name, value in loaded.items():
        params[name]._load_init(value, devices)
    _updaters(trainer)  # before the copies: a Trainer's first use copies device 0's values
    if trainer._optimizer.lr_scheduler is None:  # a schedule's rate comes of the count below
        trainer.set_learning_rate(record['optimizer']['lr'])
    # The count goes on from the record: each parameter's own count starts at begin_num_update
    # (MXNet's num_update is their maximum), as if the steps before the stop had been taken here.
    optimizer = trainer._optimizer
    optimizer.begin_num_update = optimizer.num_update = record['optimizer']['num_update']
    for param, i, value in copies:
        param.list_data()[i][:] = value


class CheckpointHandler(TrainBegin, EpochEnd, TrainEnd):
    """Continue the run of record ``resume`` (if any) after its epoch; after every epoch save a
    checkpoint with ``info``, the history and ``cwd`` (the working folder, which the relative
    paths of ``info``'s ``argv`` are read from; none if it was deleted) into ``directory``;
    release ``lock`` (``lock_dir``'s, if given) when training ends."""

    priority = PRIORITY['CheckpointHandler']

    def __init__(self, directory, info, resume=None, lock=None):
        self.directory, self.info, self.resume, self.lock = directory, dict(info), resume, lock
        with contextlib.suppress(FileNotFoundError):
            self.info['cwd'] = os.getcwd()

    def train_begin(self, estimator, *args, **kwargs):
        if self.resume is not None:
            estimator.resume(self.resume['epoch'], self.resume['history'])

    def epoch_end(self, estimator, *args, **kwargs):
        if self.directory is not None:
            save_checkpoint(self.directory, estimator.record['epoch'], estimator.net,
                            estimator.trainer, dict(self.info, history=list(estimator.history)))

    def train_end(self, estimator, *args, **kwargs):
        if self.lock is not None:
            self.lock.release()


_RESUMABLE = {}  # each folder resumable() locked in this process: its lock


def resumable(directory, net, trainer, devices, train_iter, settings):
    """``(handlers, history)`` for ``train()`` to keep a run in ``directory`` and go on after its
    latest checkpoint (restored into ``net``, ``trainer`` and ``train_iter``'s seed) once its
    ``settings`` are these (JSON: numbers, strings, lists, dicts); call it after
    ``init_training``. ``history``: the epochs done. ``ValueError`` for settings JSON cannot
    hold or no ``directory``, before anything is written; ``CheckpointError`` while another
    process trains in ``directory`` (its lock, ``lock_dir``, held until ``train`` ends or this
    process calls ``resumable`` for the folder again: a notebook cell executed anew)."""
    if not directory:
        raise ValueError("directory is empty; pass the folder for the run's checkpoints, for "
                         "example 'checkpoints/train-2'")
    try:  # as the checkpoint holds them, so that a resume compares like with like
        settings = json.loads(json.dumps(settings, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError('settings cannot be kept in a checkpoint (%s); pass numbers, strings, '
                         'lists and dicts, for example {"batch_size": 256, "lr": 0.1}'
                         % one_line(e)) from None
    real = os.path.realpath(directory)
    if real in _RESUMABLE:  # this process's earlier run of the folder (a cell executed anew)
        _RESUMABLE.pop(real).release()
    with contextlib.ExitStack() as undo:  # as lock_dir: the lock goes with a refused run
        lock = undo.enter_context(lock_dir(directory, 'directory'))
        record = read_checkpoint(directory) if list_checkpoints(directory) else None
        if record is not None:
            if record.get('settings') != settings:
                raise CheckpointError('%s holds a run with the settings %s, not %s; delete the '
                                      'folder to start again, or use another one' % (
                                          directory, json.dumps(record.get('settings'))[:200],
                                          json.dumps(settings)))
            if not is_whole(record.get('data_seed'), 0):
                raise not_ours(checkpoint_path(directory, record['epoch'], 'json'),
                               'data_seed is not a seed')
            restore(directory, record, net, trainer, devices)
            train_iter.seed = record['data_seed']
        undo.pop_all()
    _RESUMABLE[real] = lock
    info = {'settings': settings, 'data_seed': train_iter.seed, 'devices': list(map(str, devices))}
    handlers = [EpochLine(), LossGuard(), CheckpointHandler(directory, info, record, lock)]
    return handlers, [] if record is None else record['history']
