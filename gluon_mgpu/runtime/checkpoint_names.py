"""The file names of a checkpoint folder (``gluon_mgpu.handlers.checkpoint`` writes them).

Apart from the rest of the checkpoint code because it does not need MXNet: the thread settings
read a resumed run's device count from the folder before MXNet starts
(``gluon_mgpu.runtime.threads``).
"""
import os
import re

__all__ = ['KINDS', 'LOCK_NAME', 'checkpoint_path', 'is_checkpoint_file', 'list_checkpoints']

KINDS = ('params', 'replicas')
LOCK_NAME = '.lock'

_NAME = re.compile(r'^epoch-(\d{4,})\.json$')
# Temporary files: '.epoch-0003.params.' + mkstemp's random part + '.tmp'.
_TEMP = re.compile(r'^\.epoch-\d{4,}\.\w+\.\w+\.tmp$')


def checkpoint_path(directory, epoch, kind):
    """Return the path of one file of epoch ``epoch``'s checkpoint (``kind``: params, replicas
    or json)."""
    return os.path.join(directory, 'epoch-%04d.%s' % (epoch, kind))


def is_checkpoint_file(name):
    """Whether a file named ``name`` in a checkpoint folder is the folder's own (a checkpoint
    file, its temporary file, or the lock)."""
    return bool(re.match(r'^epoch-\d{4,}\.(params|replicas|states|json)$', name)
                or _TEMP.match(name)) or name == LOCK_NAME


def list_checkpoints(directory):
    """Return the epochs with a committed checkpoint (a JSON file) in ``directory``, sorted.

    A folder that does not exist holds none.
    """
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)
