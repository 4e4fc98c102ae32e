"""Checkpoints: save a run at the end of every epoch, and continue it later.

One checkpoint per finished epoch, in one folder::

    epoch-0003.params    the network parameters (``net.save_parameters``: loadable anywhere)
    epoch-0003.replicas  per-device values the .params file cannot hold (see below)
    epoch-0003.states    the Trainer's state (``trainer.save_states``: a pickle)
    epoch-0003.json      epoch, settings, history, data-order seed, sha256 of the three files

Every file is written to a hidden temporary file in the same folder, flushed to disk and then
renamed over its final name, which is atomic. The JSON file is written last: it is the commit
point, so a run killed at any moment leaves every earlier checkpoint complete and the current
one either complete or absent (its leftovers are hidden temporary files, which ``prepare_dir``
deletes).

``save_parameters`` stores the *average* of a parameter's copies on the devices. The copies of a
trained weight are identical (the Trainer updates them all the same way), but each device keeps
its own BatchNorm running statistics. The copies that differ from the stored average are saved
per device in ``.replicas``, so that a resumed run continues with exactly the values the
interrupted one had.

Loading checks each file's size and sha256 against the JSON before reading it: ``.states`` is
a pickle, and unpickling runs code, so only the bytes this run wrote (and recorded) are loaded.
"""
import hashlib
import json
import os
import re
import tempfile

import mxnet as mx
import numpy as np
from mxnet import nd

from .events import EpochEnd, TrainBegin

__all__ = ['CheckpointError', 'FORMAT', 'RUN_SETTINGS', 'KINDS', 'checkpoint_path',
           'list_checkpoints', 'prepare_dir', 'save_checkpoint', 'read_checkpoint',
           'restore', 'resume_settings', 'CheckpointHandler']

FORMAT = 'gluon_mgpu checkpoint 1'
KINDS = ('params', 'replicas', 'states')
# Settings that define a run: continuing with other values would be a different run.
RUN_SETTINGS = ('num_gpus', 'batch_size', 'seed', 'train_limit', 'test_limit')

_NAME = re.compile(r'^epoch-(\d{4,})\.json$')
_TEMP = re.compile(r'^\.epoch-\d{4,}\.\w+\.\d+\.tmp$')


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, damaged, or does not fit this run; the message says which
    file and what to do."""


def checkpoint_path(directory, epoch, kind):
    """Return the path of one file of epoch ``epoch``'s checkpoint (``kind``: params, replicas,
    states or json)."""
    return os.path.join(directory, 'epoch-%04d.%s' % (epoch, kind))


def list_checkpoints(directory):
    """Return the epochs with a committed checkpoint (a JSON file) in ``directory``, sorted.

    A folder that does not exist holds none.
    """
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)


def prepare_dir(directory):
    """Create ``directory`` if needed, check that files can be written there, and delete the
    temporary files a killed run left behind; return their names.

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
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path, write):
    """Call ``write(tmp_path)``, flush the file to disk, rename it to ``path``; return its
    ``{'name', 'bytes', 'sha256'}``."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, '.%s.%d.tmp' % (name, os.getpid()))
    try:
        write(tmp)
        with open(tmp, 'rb') as f:
            os.fsync(f.fileno())
        entry = {'name': name, 'bytes': os.path.getsize(tmp), 'sha256': _sha256(tmp)}
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_dir(directory)
    return entry


def _params_by_name(net):
    # The names a .params file uses ('0.weight', '1.0.conv1.bias', ...); Gluon builds them
    # with this method in save_parameters and load_parameters.
    return net._collect_params_with_prefix()


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


def save_checkpoint(directory, epoch, net, trainer, info):
    """Write the checkpoint of a finished epoch; return the path of its JSON file.

    Parameters
    ----------
    directory : str
        An existing, writable folder (see ``prepare_dir``).
    epoch : int
        The number of finished epochs (from 1).
    net : mxnet.gluon.Block
        Initialized on the devices of the run.
    trainer : mxnet.gluon.Trainer
        The run's Trainer (after at least one ``step``).
    info : dict
        Anything JSON can hold that describes the run: the CLI stores ``args`` (its settings),
        ``history`` (the records of the finished epochs), ``data_seed`` (the seed of the data
        order, which also seeded the initialization), ``network`` and ``devices``. Stored as
        given, next to ``format``, ``epoch`` and ``files`` (name, size and sha256 of the other
        three files).
    """
    files = {}
    files['params'] = _atomic_write(checkpoint_path(directory, epoch, 'params'),
                                    net.save_parameters)
    replicas = _differing_replicas(net, checkpoint_path(directory, epoch, 'params'))
    files['replicas'] = _atomic_write(checkpoint_path(directory, epoch, 'replicas'),
                                      lambda tmp: nd.save(tmp, replicas))
    files['states'] = _atomic_write(checkpoint_path(directory, epoch, 'states'),
                                    trainer.save_states)
    record = dict(info, format=FORMAT, epoch=epoch, files=files)
    text = json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + '\n'

    def write_json(tmp):
        with open(tmp, 'w') as f:
            f.write(text)
    path = checkpoint_path(directory, epoch, 'json')
    _atomic_write(path, write_json)
    return path


def _fix(directory, epoch):
    earlier = [e for e in list_checkpoints(directory) if e < epoch]
    if earlier:
        return ('delete %s to resume from epoch %d instead'
                % (checkpoint_path(directory, epoch, '*'), earlier[-1]))
    return 'start a new run with an empty --checkpoint-dir'


def read_checkpoint(directory, epoch=None):
    """Read and verify a checkpoint's JSON; return it as a dict (see ``save_checkpoint``).

    Parameters
    ----------
    directory : str
    epoch : int, optional
        Default: the latest committed checkpoint.

    Raises
    ------
    CheckpointError
        When there is no checkpoint, the JSON cannot be read, or one of the files it lists is
        missing, has another size (truncated) or another sha256 than recorded. Nothing is
        unpickled before these checks pass.
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
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError('%s cannot be read (%s); %s'
                              % (path, e, _fix(directory, epoch))) from None
    if not isinstance(record, dict) or record.get('format') != FORMAT \
            or record.get('epoch') != epoch or not isinstance(record.get('files'), dict) \
            or set(record['files']) != set(KINDS):
        raise CheckpointError('%s is not a %s file for epoch %d; %s'
                              % (path, FORMAT, epoch, _fix(directory, epoch)))
    for kind in KINDS:
        entry = record['files'][kind]
        if not (isinstance(entry, dict) and isinstance(entry.get('name'), str)
                and isinstance(entry.get('bytes'), int) and isinstance(entry.get('sha256'), str)):
            raise CheckpointError('%s has no valid entry for its .%s file; %s'
                                  % (path, kind, _fix(directory, epoch)))
        file_path = os.path.join(directory, os.path.basename(entry['name']))
        if not os.path.isfile(file_path):
            raise CheckpointError('%s is missing, but %s lists it; %s'
                                  % (file_path, os.path.basename(path),
                                     _fix(directory, epoch)))
        size = os.path.getsize(file_path)
        if size != entry['bytes']:
            raise CheckpointError('%s is %s: %d bytes, but the run wrote %d bytes; %s'
                                  % (file_path, 'truncated' if size < entry['bytes']
                                     else 'changed', size, entry['bytes'],
                                     _fix(directory, epoch)))
        digest = _sha256(file_path)
        if digest != entry['sha256']:
            raise CheckpointError('%s has sha256 %s..., but the run recorded %s...: it was '
                                  'changed after the run wrote it, and only files the run '
                                  'wrote are loaded; %s'
                                  % (file_path, digest[:12], entry['sha256'][:12],
                                     _fix(directory, epoch)))
    return record


def restore(directory, record, net, trainer, devices):
    """Load a verified checkpoint into ``net`` (on ``devices``) and ``trainer``.

    Call it with ``record`` from ``read_checkpoint`` and ``trainer`` made for ``net`` (its
    parameters initialized on ``devices``, as ``training.init_training`` does); the values of
    the checkpoint replace them, including each device's own copies (``.replicas``) and the
    optimizer with its learning rate (``.states``).

    Raises
    ------
    CheckpointError
        When the parameters do not fit ``net`` (another network) or the devices (another count).
    """
    files = {k: os.path.join(directory, os.path.basename(record['files'][k]['name']))
             for k in KINDS}
    try:
        net.load_parameters(files['params'], ctx=devices)
    except (AssertionError, ValueError, mx.base.MXNetError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if len(reason) > 200:  # a missing parameter's message lists all the file holds
            reason = reason[:200] + '...'
        raise CheckpointError('%s does not fit this network (%s): the checkpoint was written '
                              'for another network (%s)'
                              % (files['params'], reason, record.get('network'))) from None
    # First: the Trainer's first use copies device 0's values to all devices (kvstore
    # broadcast), which would undo the per-device copies set below.
    trainer.load_states(files['states'])
    params = _params_by_name(net)
    # nd.load gives [] for a file saved from an empty dict (one device: nothing differs).
    for key, value in (nd.load(files['replicas']) or {}).items():
        name, index = key.rsplit('@', 1)
        copies = params[name].list_data()
        if int(index) >= len(copies):
            raise CheckpointError('%s holds a copy for device %s, but this run has %d devices; '
                                  'resume with --num-gpus %d' % (files['replicas'], index,
                                                                 len(copies), int(index) + 1))
        copies[int(index)][:] = value.as_in_context(copies[int(index)].context)


def resume_settings(record, given):
    """Merge the settings of a checkpointed run with those given for its continuation.

    Parameters
    ----------
    record : dict
        From ``read_checkpoint``; its ``args`` are the settings of the run.
    given : dict
        The settings given explicitly on the command line now (flag name with underscores:
        value).

    Returns
    -------
    dict
        The run's settings, overridden by the given ones.

    Raises
    ------
    ValueError
        When a given value of a setting that defines the run (``RUN_SETTINGS``) differs from
        the recorded one, naming every such flag with both values; or when ``epochs`` leaves
        nothing to do.
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


class CheckpointHandler(TrainBegin, EpochEnd):
    """Event handler: save a checkpoint at the end of every epoch; continue a restored run.

    Parameters
    ----------
    directory : str
        A folder prepared with ``prepare_dir``.
    info : dict
        Stored in every checkpoint's JSON (see ``save_checkpoint``), with ``history`` set to
        the records of all finished epochs.
    resume : dict, optional
        The record (``read_checkpoint``) of a checkpoint already loaded into the network and
        the Trainer with ``restore``: training goes on after its epoch, with its history.
    """

    priority = -100  # first at the end of an epoch: what a later crash must not lose

    def __init__(self, directory, info, resume=None):
        self.directory, self.info, self.resume = directory, dict(info), resume

    def train_begin(self, estimator, *args, **kwargs):
        if self.resume is not None:
            estimator.resume(self.resume['epoch'], self.resume['history'])

    def epoch_end(self, estimator, *args, **kwargs):
        save_checkpoint(self.directory, estimator.record['epoch'], estimator.net,
                        estimator.trainer, dict(self.info, history=list(estimator.history)))
        return False
