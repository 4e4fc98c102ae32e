"""What ``--resume`` needs before MXNet starts: checkpoint file names, the latest command line."""
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
    """``(argv, cwd)`` of the latest checkpoint in ``directory``, unchecked, or ``(None, None)``."""
    try:
        record = read_json(checkpoint_path(directory, list_checkpoints(directory)[-1], 'json'))
    except (OSError, ValueError, IndexError):
        record = None
    return tuple(map(record.get, ('argv', 'cwd'))) if isinstance(record, dict) else (None, None)
