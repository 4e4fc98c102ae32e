"""A checkpoint folder's file names, and the command line its latest checkpoint records, read
with ``json`` alone: what ``--resume`` needs before MXNet starts (the checkpoints themselves are
``checkpoint.py``'s, docs/checkpoints.md).
"""
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
    """The ``argv`` the latest checkpoint's JSON in ``directory`` holds, unchecked; None when
    there is no checkpoint or its JSON cannot be read (``checkpoint.read_checkpoint`` says why)."""
    try:
        epochs = list_checkpoints(directory)
        record = read_json(checkpoint_path(directory, epochs[-1], 'json')) if epochs else None
    except (OSError, ValueError):
        return None
    return record.get('argv') if isinstance(record, dict) else None
