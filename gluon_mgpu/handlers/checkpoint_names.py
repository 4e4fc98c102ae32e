"""A checkpoint folder's file names and the command line its latest checkpoint records, read
without MXNet: what ``--resume`` needs before MXNet starts (the rest: ``checkpoint.py``)."""
import os
import re

from ..runtime.files import read_json

__all__ = ['EPOCH_FILE', 'checkpoint_path', 'list_checkpoints', 'latest_argv']

EPOCH_FILE = re.compile(r'epoch-(\d{4,})\.(json|params|replicas|states)$')


def checkpoint_path(directory, epoch, kind):
    """The path of one file of epoch ``epoch``'s checkpoint (``kind``: params, replicas, json)."""
    return os.path.join(directory, 'epoch-%04d.%s' % (epoch, kind))


def list_checkpoints(directory):
    """The epochs with a committed checkpoint (a JSON file) in ``directory``, sorted."""
    names = os.listdir(directory) if os.path.isdir(directory) else []  # none yet, or not a folder
    return sorted(int(m[1]) for m in map(EPOCH_FILE.match, names) if m and m[2] == 'json')


def latest_argv(directory):
    """The ``argv`` and ``cwd`` of the latest checkpoint's JSON in ``directory``, unchecked; None
    without one or when it cannot be read (``checkpoint.read_checkpoint`` says why)."""
    try:
        record = read_json(checkpoint_path(directory, list_checkpoints(directory)[-1], 'json'))
    except (OSError, ValueError, IndexError):
        record = None
    return tuple(map(record.get, ('argv', 'cwd'))) if isinstance(record, dict) else (None, None)
