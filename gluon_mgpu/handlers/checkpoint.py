"""Checkpoints: save a run at the end of every epoch, and continue it later, bit-equal.

docs/checkpoints.md describes the four files of a checkpoint, their commit order (each file
through ``files.atomic_path``, the JSON last), the folder's lock, and what the sha256 sums and the
absence of pickles protect against and what they do not.
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

from .. import training
from .events import PRIORITY, EpochEnd, TrainBegin
from .checkpoint_names import (_TEMP, KINDS, LOCK_NAME, checkpoint_path, is_checkpoint_file,
                               list_checkpoints)
from ..runtime.files import InputError, atomic_path, open_input
from ..runtime.threads import is_digits
from ..runtime.updates import one_line

__all__ = ['CheckpointError', 'FORMAT', 'RUN_SETTINGS', 'KINDS', 'checkpoint_path',
           'list_checkpoints', 'is_checkpoint_file', 'lock_dir', 'DirectoryLock', 'prepare_dir',
           'save_checkpoint', 'read_checkpoint', 'validate_record', 'restore', 'resume_settings',
           'Resume', 'CheckpointHandler']

FORMAT = 'gluon_mgpu checkpoint 3'
# Older formats, with the last commit that resumes them: format 1 kept the optimizer as a pickle
# (Trainer.save_states); format 2 was trained with the old step, which divided an epoch's short
# last batch by its own size (training.OLD_STEP).
_OLDER = {'gluon_mgpu checkpoint 1': ('84e04e4', 'format 1, whose optimizer state is a pickle'),
          'gluon_mgpu checkpoint 2': ('03b47ec', 'format 2, trained with the old step %s, '
                                      'which divides a short last batch by its own size'
                                      % training.OLD_STEP)}
# Settings that define a run: continuing with other values would be a different run.
RUN_SETTINGS = ('num_gpus', 'batch_size', 'seed', 'train_limit', 'test_limit', 'dtype',
                'warmup_steps')
JSON_LIMIT = 64 << 20  # bytes; a record with a thousand epochs is about 200 kB


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged or does not fit this run, or a folder in use; the
    message is one line naming the file and what to do."""


class DirectoryLock:
    """The lock of a checkpoint folder held by this process (see ``lock_dir``); ``release()``
    (or leaving the ``with`` block) gives it up and deletes the lock file."""

    def __init__(self, path, fd):
        self.path, self._fd = path, fd

    def release(self):
        if self._fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                os.remove(self.path)  # still locked: whoever opens it next sees it is stale
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release()
        return False


def _holder(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 32).decode('ascii', 'replace').strip()
    return 'pid %s' % text if is_digits(text) else 'pid unknown'


def lock_dir(directory):
    """Take the lock of checkpoint folder ``directory`` (created if needed); return it.

    Take it before reading or writing the folder (``prepare_dir`` deletes temporary files a
    running writer still needs). It is ``flock`` on the file ``.lock``, which holds the owner's
    pid; the operating system releases it when the process ends, even by SIGKILL.

    Returns
    -------
    DirectoryLock

    Raises
    ------
    CheckpointError
        When another process holds it (naming its pid and the fix).
    ValueError
        When the folder cannot be created or written (naming it and the reason).
    """
    path = os.path.join(directory, LOCK_NAME)
    while True:
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            what = ('%s is a symbolic link' % path if os.path.islink(path)
                    else e.strerror or str(e))
            raise ValueError('cannot write checkpoints to %s (%s); pass a folder you can write '
                             'to' % (directory, what)) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError('cannot write checkpoints to %s (%s is not a regular file); pass '
                             'another folder' % (directory, path))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise CheckpointError('%s is in use by another run (%s); wait for it to end, or '
                                  'pass another --checkpoint-dir' % (directory, holder)) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder deleted the file while releasing: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, b'%d\n' % os.getpid())
    return DirectoryLock(path, fd)


def prepare_dir(directory):
    """Create ``directory`` if needed, check that it is writable, and delete the temporary files
    a killed run left there (hold its lock first); return their names.

    Raises
    ------
    ValueError
        Naming the folder and the operating system's reason.
    """
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
        stale = sorted(n for n in os.listdir(directory) if _TEMP.match(n))
        for name in stale:
            os.remove(os.path.join(directory, name))
    except OSError as e:
        raise ValueError('cannot write checkpoints to %s (%s); pass a folder you can write to'
                         % (directory, e.strerror or e)) from None
    return stale


def _sha256(path):
    h = hashlib.sha256()
    with open_input(path) as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def _write(path, write):
    """Call ``write(tmp_path)``, put the file in place atomically; return its files entry."""
    with atomic_path(path) as tmp:
        write(tmp)
        return {'name': os.path.basename(path), 'bytes': os.path.getsize(tmp),
                'sha256': _sha256(tmp)}


def _params_by_name(net):
    return net._collect_params_with_prefix()  # the names of a .params file ('1.0.conv1.bias')


def _differing_replicas(net, params_file):
    """The per-device copies of the parameters whose copies differ from ``params_file``."""
    saved = nd.load(params_file)
    replicas = {}
    for name, param in _params_by_name(net).items():
        copies = param.list_data()
        stored = saved[name].asnumpy()
        if len(copies) > 1 and any(not np.array_equal(c.asnumpy(), stored) for c in copies):
            for i, c in enumerate(copies):
                replicas['%s@%d' % (name, i)] = c.copyto(mx.cpu())
    return replicas


def _updaters(trainer):
    """Initialize ``trainer`` as ``save_states``/``load_states`` do; return the updaters that
    hold its optimizer states (MXNet 1.9.1)."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return [trainer._kvstore._updater] if trainer._update_on_kvstore else trainer._updaters


def _state_form(state, key, arrays):
    """The JSON form of one optimizer state (None, "array" or a list of these), its arrays put
    into ``arrays`` under ``key``, ``key.0``, ``key.1``, ..."""
    if state is None:
        return None
    if isinstance(state, nd.NDArray):
        arrays[key] = state.as_in_context(mx.cpu())
        return 'array'
    if isinstance(state, (tuple, list)):
        return [_state_form(s, '%s.%d' % (key, i), arrays) for i, s in enumerate(state)]
    raise TypeError('the optimizer state %s is a %s; a checkpoint holds only NDArrays, tuples '
                    'of them and None' % (key, type(state).__name__))


def _save_states(trainer, path):
    """``trainer.save_states(path)`` without a pickle: the state arrays go to ``path``
    (``nd.save``); return the rest as the JSON's ``optimizer`` (its class, ``lr``, update
    counters, the device whose counts are current, and the form of each parameter's state)."""
    states = _updaters(trainer)[0].states
    optimizer, arrays = trainer._optimizer, {}
    counts = optimizer._all_index_update_counts
    form = {str(i): _state_form(states[i], str(i), arrays) for i in sorted(states)}
    nd.save(path, arrays)
    return {'type': type(optimizer).__name__, 'lr': optimizer.lr,
            'num_update': optimizer.num_update, 'begin_num_update': optimizer.begin_num_update,
            'update_counts': {str(d): {str(i): n for i, n in sorted(c.items())}
                              for d, c in sorted(counts.items())},
            'device': [d for d, c in counts.items() if c is optimizer._index_update_count][0],
            'states': form}


def save_checkpoint(directory, epoch, net, trainer, info):
    """Write the checkpoint of finished epoch ``epoch`` (from 1); return its JSON file's path.

    Parameters
    ----------
    directory : str
        A folder prepared with ``prepare_dir`` whose lock this process holds.
    epoch : int
    net : mxnet.gluon.Block
        Initialized on the run's devices.
    trainer : mxnet.gluon.Trainer
        The run's Trainer.
    info : dict
        Stored as given in the JSON, beside ``format``, ``epoch``, ``optimizer`` and ``files``;
        the CLI stores ``args``, ``history``, ``data_seed``, ``network`` and ``devices``.

    Raises
    ------
    files.OutputError
        When a file cannot be written (naming it and the reason); this checkpoint is then not
        committed and the earlier ones are untouched.
    """
    files, optimizer = {}, {}
    params_path = checkpoint_path(directory, epoch, 'params')
    files['params'] = _write(params_path, net.save_parameters)
    replicas = _differing_replicas(net, params_path)
    files['replicas'] = _write(checkpoint_path(directory, epoch, 'replicas'),
                               lambda tmp: nd.save(tmp, replicas))
    files['states'] = _write(checkpoint_path(directory, epoch, 'states'),
                             lambda tmp: optimizer.update(_save_states(trainer, tmp)))
    record = dict(info, format=FORMAT, step=training.STEP, epoch=epoch, optimizer=optimizer,
                  files=files)
    text = json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + '\n'

    def write_json(tmp):
        with open(tmp, 'w') as f:
            f.write(text)
    path = checkpoint_path(directory, epoch, 'json')
    _write(path, write_json)
    return path


def _fix(directory, epoch):
    earlier = [e for e in list_checkpoints(directory) if e < epoch]
    if earlier:
        return ('delete %s to resume from epoch %d instead'
                % (checkpoint_path(directory, epoch, '*'), earlier[-1]))
    return 'start a new run with an empty --checkpoint-dir'


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
    """Read a checkpoint's JSON and verify the files it lists; return it as a dict.

    Parameters
    ----------
    directory : str
    epoch : int, optional
        Default: the latest committed checkpoint.

    Raises
    ------
    CheckpointError
        When there is no checkpoint, the JSON cannot be read, or a file it lists is missing, not
        a regular file, or has another size or sha256 than recorded. ``validate_record`` checks
        the values the CLI stores.
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
            or record.get('step') != training.STEP or record.get('epoch') != epoch \
            or not isinstance(record.get('files'), dict) or set(record['files']) != set(KINDS):
        raise CheckpointError('%s is not a %s file for epoch %d; %s'
                              % (path, FORMAT, epoch, _fix(directory, epoch)))
    for kind in KINDS:
        _verified(directory, record, kind)
    return record


def _verified(directory, record, kind):
    """Read one file of a checkpoint; return its bytes once their size and sha256 are those
    the JSON records."""
    epoch, entry = record['epoch'], record['files'][kind]
    json_path, fix = checkpoint_path(directory, epoch, 'json'), _fix(directory, epoch)
    if not (isinstance(entry, dict)
            and entry.get('name') == os.path.basename(checkpoint_path(directory, epoch, kind))
            and _is_int(entry.get('bytes')) and entry['bytes'] >= 0
            and isinstance(entry.get('sha256'), str)
            and re.fullmatch(r'[0-9a-f]{64}', entry['sha256'])):
        raise CheckpointError('%s has no valid entry for its .%s file; %s' % (json_path, kind, fix))
    path = os.path.join(directory, entry['name'])
    try:
        with open_input(path) as f:
            data = f.read(entry['bytes'] + 1)
            size = max(len(data), os.fstat(f.fileno()).st_size)  # the whole size, if larger
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


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


# validate_record's checks of what the CLI records and its parser does not read.
_HISTORY_CHECKS = {
    'epoch': lambda v: None if _is_int(v) and v >= 1 else 'a whole number >= 1',
    'seconds': lambda v: None if _is_number(v) and v > 0 else 'a number above 0',
    'images_per_sec': lambda v: None if _is_number(v) and v > 0 else 'a number above 0',
    'train_loss': lambda v: None if _is_number(v) and v >= 0 else 'a number >= 0',
    'train_acc': lambda v: None if _is_number(v) and 0 <= v <= 1 else 'a number from 0 to 1',
    'test_acc': lambda v: None if _is_number(v) and 0 <= v <= 1 else 'a number from 0 to 1',
}
_DEVICE = re.compile(r'(cpu|gpu)\((\d+)\)')


def _network_of(args):
    return training.network_name(args.get('model', 'resnet18'),
                                 args['num_gpus'] if args.get('sync_bn') else None)


def _short(value):
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + '...'


def _not_ours(path, what, writer='gluon_mgpu.train'):
    return CheckpointError('%s: %s; the file was not written by this version of %s or was '
                           'changed: start a new run in an empty --checkpoint-dir'
                           % (path, what, writer))


def validate_record(record, path, check_args=None):
    """Check the values the CLI stores in a checkpoint's JSON file; return ``record``.

    ``args`` must be an object that ``check_args`` accepts, ``history`` one record per finished
    epoch with its fields in range. With ``check_args``, also: ``args.epochs`` at least the
    finished epochs, and ``network``, ``data_seed`` and ``devices`` those of ``args``.

    Parameters
    ----------
    record : dict
        From ``read_checkpoint``.
    path : str
        The JSON file's path, for the message.
    check_args : callable, optional
        ``check_args(args)`` raises ``ValueError`` (one line) unless the CLI would take ``args``.

    Raises
    ------
    CheckpointError
        One line: ``runs/a/epoch-0002.json: history[0].test_acc is 1.5, expected a number from
        0 to 1; the file was not written by ... start a new run in an empty --checkpoint-dir``.
    """
    def refuse(what):
        raise _not_ours(path, what)

    def expect(ok, name, shown, expected):
        if not ok:
            refuse('%s is %s, expected %s' % (name, shown, expected))

    def top(value):
        return 'missing' if value is None else _short(value)

    args, epoch, history = record.get('args'), record['epoch'], record.get('history')
    expect(isinstance(args, dict), 'args', top(args), 'the settings of the run (an object)')
    if check_args is not None:
        try:
            check_args(args)
        except ValueError as e:
            refuse(str(e))
    expect(isinstance(history, list) and len(history) == epoch, 'history', top(history),
           'a list of %d epoch records' % epoch)
    for i, entry in enumerate(history):
        expect(isinstance(entry, dict), 'history[%d]' % i, _short(entry), 'an epoch record')
        for field, test in _HISTORY_CHECKS.items():
            if field not in entry:
                refuse('history[%d] lacks %s' % (i, field))
            problem = test(entry[field])
            expect(problem is None, 'history[%d].%s' % (i, field), _short(entry[field]), problem)
        expect(entry['epoch'] == i + 1, 'history[%d].epoch' % i, entry['epoch'], i + 1)
    if check_args is None:
        return record
    if args['epochs'] < epoch:
        refuse('args.epochs is %d, fewer than the %d epochs finished' % (args['epochs'], epoch))
    network = record.get('network')
    if network != _network_of(args):
        known = [training.network_name('resnet18'), training.network_name('lenet'),
                 training.network_name('resnet18', args['num_gpus'])]  # what the CLI trains
        refuse('network is %s, expected %s for these settings'
               % (_short(network), json.dumps(_network_of(args))) if network in known else
               'network is %s, which is none of the networks gluon_mgpu trains (%s)'
               % (_short(network), ', '.join(known)))
    seed = record.get('data_seed')
    expect(seed == args['seed'] and _is_int(seed), 'data_seed', _short(seed), args['seed'])
    devices = record.get('devices')
    expect(isinstance(devices, list) and len(devices) == args['num_gpus']
           and all(isinstance(d, str) and _DEVICE.fullmatch(d) for d in devices), 'devices',
           _short(devices), '%d names such as "cpu(0)" or "gpu(0)"' % args['num_gpus'])
    return record


# Loading: every file is checked against the network, the devices and the Trainer first.

def _index(key, limit=None):
    """``key`` as an int when ``str`` wrote it (``'0'``, ``'12'``) and it is below ``limit``."""
    if isinstance(key, str) and re.fullmatch(r'0|[1-9][0-9]{0,8}', key) and \
            (limit is None or int(key) < limit):
        return int(key)
    return None


_OPTIMIZER_KEYS = ('type', 'lr', 'num_update', 'begin_num_update', 'update_counts', 'device',
                   'states')


def _not_this_run(path, what):
    return CheckpointError('%s %s; it does not belong to this run: start a new run in an empty '
                           '--checkpoint-dir' % (path, what))


def _load_states(trainer, state, data, path, json_path, shapes):
    """Check ``state`` (``_save_states``'s dict) and ``data``, the bytes of its arrays file
    ``path``, against ``trainer``; return the optimizer states, parameter index: state.
    ``shapes`` maps a Parameter whose shape is not inferred yet to its shape."""
    def refuse(what):
        raise _not_ours(json_path, 'optimizer' + what, 'gluon_mgpu')

    def expect(ok, what):
        if not ok:
            refuse(what)
    expect(isinstance(state, dict) and set(state) == set(_OPTIMIZER_KEYS),
           ' is %s, expected the state of an optimizer (an object with %s)'
           % (_short(state), ', '.join(_OPTIMIZER_KEYS)))
    name = type(trainer._optimizer).__name__
    expect(state['type'] == name,
           '.type is %s, but the Trainer\'s optimizer is %s' % (_short(state['type']), name))
    expect(state['lr'] is None or _is_number(state['lr']) and state['lr'] > 0,
           '.lr is %s, expected a number above 0' % _short(state['lr']))
    for key in ('num_update', 'begin_num_update'):
        expect(_is_int(state[key]) and state[key] >= 0,
               '.%s is %s, expected a whole number >= 0' % (key, _short(state[key])))
    params, counts, forms = trainer._params, state['update_counts'], state['states']
    expect(isinstance(counts, dict) and all(
        _index(d) is not None and isinstance(c, dict) and all(
            _index(i, len(params)) is not None and _is_int(n) and n >= 0 for i, n in c.items())
        for d, c in counts.items()),
        '.update_counts is %s, expected {"<device id>": {"<parameter index>": <count>}} for '
        'the Trainer\'s %d parameters' % (_short(counts), len(params)))
    expect(_is_int(state['device']) and str(state['device']) in counts,
           '.device is %s, expected a device of update_counts' % _short(state['device']))
    expect(isinstance(forms, dict) and all(_index(i, len(params)) is not None for i in forms),
           '.states is %s, expected {"<parameter index>": <state>} for the Trainer\'s %d '
           'parameters' % (_short(forms), len(params)))
    arrays, used = _load_arrays(data, path, 'arrays'), set()
    json_name = os.path.basename(json_path)

    def build(form, key, param, depth):
        if form is None:
            return None
        if form == 'array':
            if key not in arrays:
                raise _not_this_run(path, 'lacks the array %s, which %s names' % (key, json_name))
            shape = shapes.get(param, param.shape)
            if not _shape_fits(arrays[key].shape, shape):
                raise _not_this_run(path, 'holds %s with shape %s, but parameter %s (%s) is %s' % (
                    key, arrays[key].shape, key.split('.')[0], param.name, shape))
            used.add(key)
            return arrays[key]
        expect(isinstance(form, list) and form and depth < 3,
               '.states.%s is %s, expected null, "array" or a list of these' % (key, _short(form)))
        return tuple(build(f, '%s.%d' % (key, i), param, depth + 1) for i, f in enumerate(form))
    states = {int(i): build(form, i, params[int(i)], 0) for i, form in forms.items()}
    if set(arrays) - used:
        raise _not_this_run(path, 'holds %s, which %s does not name'
                            % (_brief(set(arrays) - used), json_name))
    return states


def _install(trainer, state, states):
    """What ``Trainer.load_states`` does after unpickling (MXNet 1.9.1), from checked values."""
    optimizer = trainer._optimizer
    optimizer.lr = state['lr']
    optimizer.num_update = state['num_update']
    optimizer.begin_num_update = state['begin_num_update']
    optimizer._all_index_update_counts = {
        int(d): {int(i): n for i, n in c.items()} for d, c in state['update_counts'].items()}
    optimizer._index_update_count = optimizer._all_index_update_counts[state['device']]
    for updater in _updaters(trainer):
        # Each updater its own dict: it moves the states to its device on first use.
        updater.states = dict(states)
        updater.states_synced = dict.fromkeys(states, False)
        updater.optimizer = optimizer


def _shape_fits(saved, expected):
    # A shape still to be inferred has 0 for the unknown sizes, as MXNet's loading code allows.
    return len(saved) == len(expected) and all(e in (0, s) for s, e in zip(saved, expected))


def _load_arrays(data, path, what):
    try:
        loaded = nd.load_frombuffer(data)
    except Exception as e:
        raise CheckpointError('%s is not an MXNet %s file (%s); it was damaged or replaced: '
                              'start a new run in an empty --checkpoint-dir'
                              % (path, what, one_line(e, 200))) from None
    if isinstance(loaded, list) and not loaded:
        return {}  # nd.save of an empty dict
    if not isinstance(loaded, dict) or not all(
            type(v) is nd.NDArray and v.stype == 'default' for v in loaded.values()):
        raise CheckpointError('%s does not hold named dense arrays, as an MXNet %s file does; '
                              'start a new run in an empty --checkpoint-dir' % (path, what))
    return loaded


def _brief(names):
    names = sorted(names)
    return ', '.join(names[:3]) + (', ... (%d in all)' % len(names) if len(names) > 3 else '')


def _check_params(loaded, params, path, network):
    def refuse(what):
        raise CheckpointError('%s does not fit this network (%s): the checkpoint was written '
                              'for another network (%s)' % (path, what, network))
    # A parameter shared by two blocks has two names but is saved once (MXNet >= 1.6).
    names_of = {}
    for name, param in params.items():
        names_of.setdefault(param, []).append(name)
    missing = [n for n, p in params.items() if not any(m in loaded for m in names_of[p])]
    if missing:
        refuse('it lacks %s' % _brief(missing))
    extra = [n for n in loaded if n not in params]
    if extra:
        refuse('it holds %s, which the network has not' % _brief(extra))
    for name, value in loaded.items():
        param = params[name]
        if not _shape_fits(value.shape, param.shape):
            refuse('%s has shape %s in the file but %s in the network'
                   % (name, value.shape, param.shape))
        if np.dtype(param.dtype) != np.dtype(value.dtype):
            refuse('%s is %s in the file but %s in the network'
                   % (name, np.dtype(value.dtype), np.dtype(param.dtype)))


def _check_replicas(loaded, params, shapes, path, num_devices):
    seen = {}
    for key, value in loaded.items():
        name, at, index = key.rpartition('@')
        if not at or not is_digits(index) or str(int(index)) != index \
                or name not in params:
            raise _not_this_run(path, 'holds %s, which is not "<parameter>@<device>" for a '
                                'parameter of this network' % _short(key))
        if int(index) >= num_devices:
            raise CheckpointError('%s holds a copy for device %s, but this run has %d devices; '
                                  'resume with --num-gpus %d'
                                  % (path, index, num_devices, int(index) + 1))
        param = params[name]
        shape = shapes.get(param, param.shape)
        if value.shape != shape or np.dtype(param.dtype) != np.dtype(value.dtype):
            raise _not_this_run(path, 'holds %s with shape %s (%s), but the parameter is %s (%s)'
                                % (key, value.shape, np.dtype(value.dtype), shape,
                                   np.dtype(param.dtype)))
        seen.setdefault(name, set()).add(int(index))
    for name, indices in seen.items():
        if indices != set(range(num_devices)):
            raise _not_this_run(path, 'holds copies of %s for devices %s only, not for all %d'
                                % (name, sorted(indices), num_devices))


def restore(directory, record, net, trainer, devices):
    """Load a checkpoint (``record`` from ``read_checkpoint``) into ``net`` and ``trainer``.

    ``net``'s parameters must be initialized on ``devices`` and ``trainer`` made for them (as
    ``training.init_training`` does). Each file is read once, checked against the JSON's size
    and sha256, parsed from those bytes and checked against ``net``, ``devices`` and
    ``trainer`` before anything is loaded: the parameters, each device's own copies and the
    optimizer's learning rate, counters and states.

    Raises
    ------
    CheckpointError
        One line: a file changed since ``read_checkpoint``, is not an MXNet file, or does not
        fit ``net`` (another network), ``devices`` (another count) or ``trainer``.
    """
    paths = {k: os.path.join(directory, record['files'][k]['name']) for k in KINDS}
    data = {k: _verified(directory, record, k) for k in KINDS}
    params = _params_by_name(net)
    loaded = _load_arrays(data['params'], paths['params'], 'parameters')
    _check_params(loaded, params, paths['params'], record.get('network'))
    # The shapes the .params file gives (a network not run yet has 0 for inferred sizes).
    shapes = {param: loaded[name].shape for name, param in params.items() if name in loaded}
    replicas = _load_arrays(data['replicas'], paths['replicas'], 'arrays')
    _check_replicas(replicas, params, shapes, paths['replicas'], len(devices))
    states = _load_states(trainer, record.get('optimizer'), data['states'], paths['states'],
                          checkpoint_path(directory, record['epoch'], 'json'), shapes)
    for name, value in loaded.items():
        params[name]._load_init(value, devices)
    # Before the replicas: the Trainer's first use copies device 0's values to all devices
    # (kvstore broadcast), which would undo the per-device copies set below.
    _install(trainer, record['optimizer'], states)
    for key, value in replicas.items():
        name, index = key.rsplit('@', 1)
        copy = params[name].list_data()[int(index)]
        copy[:] = value.as_in_context(copy.context)


def resume_settings(record, given):
    """Return the settings of a checkpointed run (``record['args']``) overridden by ``given``,
    the settings given on the command line now (flag name with underscores: value).

    Raises
    ------
    ValueError
        When ``given`` changes a setting of ``RUN_SETTINGS`` (naming every such flag with both
        values), or its ``epochs`` leaves nothing to do.
    """
    recorded = record['args']
    differences = ['--%s %s (the run used %s)' % (k.replace('_', '-'), given[k], recorded.get(k))
                   for k in RUN_SETTINGS if k in given and given[k] != recorded.get(k)]
    if differences:
        raise ValueError('cannot continue the run with other settings: %s; leave these flags '
                         'out (the run\'s values are used) or start a new run in another '
                         '--checkpoint-dir' % ', '.join(differences))
    settings = dict(recorded, **given)
    done = record['epoch']
    if settings['epochs'] < done:
        raise ValueError('--epochs %d is fewer than the %d epochs the run already finished; '
                         'pass --epochs %d or more to train it further'
                         % (settings['epochs'], done, done + 1))
    if settings['epochs'] == done:
        raise ValueError('the run already finished all its %d epochs; pass --epochs %d or more '
                         'to train it further' % (done, done + 1))
    return settings


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
    """Event handler: save a checkpoint at the end of every epoch; continue a restored run.

    Parameters
    ----------
    directory : str
        A folder prepared with ``prepare_dir``.
    info : dict
        Stored in every checkpoint's JSON (``save_checkpoint``), with ``history`` set to the
        records of all finished epochs.
    resume : dict, optional
        The record of a checkpoint loaded with ``restore``: training goes on after its epoch.
    """

    def __init__(self, directory, info, resume=None):
        super().__init__(resume)
        self.directory, self.info = directory, dict(info)

    def epoch_end(self, estimator, *args, **kwargs):
        save_checkpoint(self.directory, estimator.record['epoch'], estimator.net,
                        estimator.trainer, dict(self.info, history=list(estimator.history)))
        return False
