"""Reading and writing files safely: outputs only to new paths or regular files, atomically, with
the OS's reason when a write fails; inputs only from regular files. docs/outputs.md ("How files
are written") explains it.
"""
import contextlib
import errno
import fcntl
import io
import json
import os
import re
import stat
import sys
import tempfile

from .checks import is_digits

__all__ = ['OutputError', 'InputError', 'output_problem', 'atomic_path', 'open_input',
           'input_problem', 'read_json', 'file_kind', 'non_folder_kind', 'write_hint',
           'name_problem', 'mxnet_path_problem', 'temp_name', 'lock_file']

_PROBE_BYTES = 1 << 20
_TEMP_RANDOM = 8  # the characters tempfile.mkstemp adds to a prefix
_TEMP_SUFFIX = '.tmp'
JSON_LIMIT = 64 << 20  # bytes; a checkpoint's history of a thousand epochs is about 200 kB

_HINTS = {
    errno.ENOSPC: 'free some space on that disk or write somewhere else',
    errno.EDQUOT: 'free some space within your quota or write somewhere else',
    errno.EFBIG: 'raise the file size limit (ulimit -f) or write somewhere else',
    errno.EROFS: 'write somewhere else',
    errno.EACCES: 'choose a folder you can write to',
    errno.EPERM: 'choose a folder you can write to',
    errno.EIO: 'check the disk; the earlier files are kept',
    errno.ENAMETOOLONG: 'use a shorter name',
}


class OutputError(OSError):
    """An output file that cannot be written; ``str()`` is one line: the path, why, the fix.

    ``filename`` is the target path, ``errno`` the operating system's code (``errno.ENOSPC``, ...)
    or None when gluon_mgpu refused the target itself (not a regular file).
    """

    def __init__(self, path, message, code=None):
        super().__init__(code, message, path)
        self.message = message

    def __str__(self):
        return self.message


class InputError(OSError):
    """An input that is not a readable regular file; ``reason`` is the phrase after the path
    (``'is a FIFO (named pipe), not a regular file'``), ``str()`` is path and reason."""

    def __init__(self, path, reason):
        super().__init__(None, reason, path)
        self.reason = reason

    def __str__(self):
        return '%s %s' % (self.filename, self.reason)


class _Lock(io.FileIO):
    """A lock file, locked until ``release()`` or a ``with`` ends; deleted then unless ``keep``."""
    keep = True

    def close(self):
        with contextlib.suppress(OSError, ValueError):  # only while it is still this file
            if not self.keep and os.path.samestat(os.stat(self.name), os.fstat(self.fileno())):
                os.remove(self.name)
        super().close()
    release = close


def lock_file(path, owner=None, fix='write elsewhere', keep=False):
    """``flock`` lock file ``path`` (made if missing; it gets this process's pid; without an
    ``owner``, ``path`` is the output it guards and the lock ``.NAME.lock`` beside it) against
    other processes until the process ends, even killed, or ``release()``, which deletes it unless
    ``keep`` (docs/outputs.md). Raises ``OutputError`` while another holds it ('``owner`` is in
    use by another run (pid N); wait for it to end, or ``fix``'), ``ValueError`` for a file that
    is no lock of ours or cannot be opened in a writable folder, ``OSError`` otherwise."""
    if owner is None:
        folder, name = os.path.split(path)
        path, owner = os.path.join(folder, '.%s.lock' % name), path
    try:
        lock = _Lock(path, 'r+', opener=lambda p, _: os.open(  # a FIFO's read would not wait
            p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644))
    except PermissionError as e:
        folder = os.path.dirname(os.path.abspath(path))
        if not (os.path.isfile(path) and os.access(folder, os.W_OK | os.X_OK)):
            raise
        raise ValueError('its lock file %s cannot be opened for writing (%s, mode %04o), though '
                         'the folder is writable; make it writable (chmod u+w %s) or pass another '
                         'folder' % (path, e.strerror, stat.S_IMODE(os.stat(path).st_mode), path)
                         ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st = os.fstat(lock.fileno())
        if not keep and not (os.path.lexists(path) and os.path.samestat(st, os.lstat(path))):
            lock.close()  # its last holder deleted it meanwhile: take the next one
            return lock_file(path, owner, fix, keep)
        held = (lock.read(64) or b'') if stat.S_ISREG(st.st_mode) else None
        if held is None or not re.fullmatch(rb'([0-9]{1,10}\n)?', held):  # ours: a run's pid
            raise ValueError('%s holds %s, which is not the lock file of a gluon_mgpu run (%s) '
                             'and is left as it is; pass another folder' % (
                                 os.path.dirname(path), os.path.basename(path),
                                 'it is %s' % file_kind(st.st_mode) if held is None else
                                 'it starts %s' % json.dumps(held[:20].decode('utf-8', 'replace'))))
        lock.seek(0)
        lock.truncate(0)
        try:
            lock.write(b'%d\n' % os.getpid())
        except OSError as e:  # a full disk: a lock left empty is deleted (close), not left behind
            lock.keep = bool(held)
            raise _os_failure(path, e) from None
        lock.keep = keep
        return lock
    except BlockingIOError:
        pid = (lock.read(32) or b'').decode('ascii', 'replace').strip()
        lock.close()
        raise OutputError(owner, '%s is in use by another run (pid %s); wait for it to end, or %s'
                          % (owner, pid if is_digits(pid) else 'unknown', fix)) from None
    except BaseException:
        lock.close()
        raise


def file_kind(mode):
    """Name the kind of file ``mode`` (from ``os.stat``) describes: ``'a folder'``, ``'a FIFO
    (named pipe)'``, ``'a character device'``, ...; ``'a regular file'`` for a regular file."""
    for test, name in ((stat.S_ISREG, 'a regular file'), (stat.S_ISDIR, 'a folder'),
                       (stat.S_ISLNK, 'a symbolic link'), (stat.S_ISFIFO, 'a FIFO (named pipe)'),
                       (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'),
                       (stat.S_ISSOCK, 'a socket')):
        if test(mode):
            return name
    return 'not a regular file'


def non_folder_kind(path):
    """``file_kind`` of what is at ``path`` when it is there and no folder (a symbolic link to a
    folder is one), else None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # nothing there (or gone since)
        return None
    return None if os.path.isdir(path) else file_kind(mode)


def _link_target(path):
    try:
        return os.readlink(path)
    except OSError:
        return '?'


def _target_problem(path):
    """Why ``path`` may not be replaced by a regular file, or None (absent, or a regular file)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # absent, or not ours to look at: writing will say why
    if stat.S_ISREG(st.st_mode):
        # A rename needs only the folder's permission; cp and > refuse such a file, so do we.
        if not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
            return ('it is write-protected (mode %04o) and is left as it is; make it writable '
                    '(chmod u+w) or name another file' % stat.S_IMODE(st.st_mode))
        return None
    if stat.S_ISDIR(st.st_mode):
        return 'it is a folder; name a file in it'
    if stat.S_ISLNK(st.st_mode):
        return ('it is a symbolic link (to %s), which would be replaced; name the file it points '
                'to, or a new path' % _link_target(path))
    return ('it is %s, not a regular file, and is left as it is; name a regular file or a new '
            'path' % file_kind(st.st_mode))


def output_problem(path):
    """Return why ``path`` cannot be written as a new or replaced regular file, or None.

    Run it on every output before training starts: a device, FIFO, socket, folder or symbolic
    link at ``path``, a missing or unwritable folder, a name with a NUL character. The text
    follows the path in a message: ``--metrics-json /dev/null: it is a character device, ...``.
    """
    path = os.fspath(path)
    if '\0' in path:
        return 'it contains a NUL character; name a file without one'
    problem = _target_problem(path)
    if problem:
        return problem
    if not path or path.endswith(os.sep):
        return 'it names a folder, not a file; name a file in it'
    folder, name = os.path.split(os.path.abspath(path))
    if not os.path.exists(folder):
        return 'folder %s does not exist; create it first' % folder
    if not os.path.isdir(folder):
        return '%s is not a folder; name a file in a folder' % folder
    if not os.access(folder, os.W_OK | os.X_OK):
        return 'folder %s is not writable; choose another folder' % folder
    problem = name_problem(path)
    if problem:
        return problem
    try:  # as atomic_path will: what permission bits do not tell (root in /sys, a read-only mount)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix='.%s.' % name, suffix=_TEMP_SUFFIX)
    except OSError as e:
        return ('no file can be created in folder %s (%s); choose another folder'
                % (folder, e.strerror or e))
    os.close(fd)
    os.remove(tmp)
    return None


def temp_name(path):
    """The longest name ``atomic_path`` gives the temporary file of ``path`` (``.NAME.`` and
    mkstemp's 8 random characters, then ``.tmp``), with ``X`` for the random ones."""
    return '.%s.%s%s' % (os.path.basename(path), 'X' * _TEMP_RANDOM, _TEMP_SUFFIX)


def name_problem(path):
    """Why the file system would refuse the name of ``path`` or of the temporary file written
    beside it first (``temp_name``): longer than the folder's limit (``NAME_MAX``, 255 bytes on
    most file systems) or the whole path longer than ``PATH_MAX``; else None."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        name_max, path_max = (os.pathconf(folder, n) for n in ('PC_NAME_MAX', 'PC_PATH_MAX'))
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    encoded, temp = (len(os.fsencode(n)) for n in (os.path.basename(path), temp_name(path)))
    if temp > name_max:
        return ('its name is %d bytes long, and the temporary file written beside it first (%s) '
                'would be %d, more than the %d its folder allows; use a name of at most %d bytes'
                % (encoded, temp_name('NAME'), temp, name_max, name_max - temp + encoded))
    full = len(os.fsencode(os.path.join(folder, temp_name(path))))
    if full >= path_max:
        return ('the path of the temporary file written beside it first is %d bytes long, more '
                'than the %d the system allows; use a shorter path' % (full, path_max - 1))
    return None


def mxnet_path_problem(path):
    """Why MXNet's own writers (``nd.save``, ``save_parameters``) would not open ``path`` as
    Python does, or None: MXNet encodes a path as UTF-8, Python with the file-system encoding,
    so a name that is not valid UTF-8 (a byte like ``\\xff``), or any non-ASCII name in a
    Latin-1 locale, names another file for MXNet, or none."""
    full = os.path.abspath(path)
    if os.fsencode(full) == full.encode('utf-8', 'surrogatepass'):  # a surrogate: never equal
        return None
    return ('MXNet writes there and encodes a path as UTF-8, but this path is not UTF-8 (file '
            'names are %s here), so MXNet would open another file or none; use a name of ASCII '
            'characters, or a UTF-8 locale (LC_ALL=C.UTF-8) and a UTF-8 name'
            % sys.getfilesystemencoding())


def write_hint(code, default='write somewhere else'):
    """What to do when a write failed with ``errno`` ``code`` (``'free some space on that
    disk or write somewhere else'`` for ``errno.ENOSPC``), or ``default``."""
    return _HINTS.get(code, default)


def _os_failure(path, error):
    """The ``OutputError`` for an OS error met while writing ``path``."""
    code = getattr(error, 'errno', None)
    hint, folder = write_hint(code), os.path.dirname(os.path.abspath(path))
    if code == errno.ENOENT and not os.path.isdir(folder):
        hint = 'its folder %s no longer exists; create it again or write somewhere else' % folder
    return OutputError(path, 'cannot write %s (%s); %s' % (path, error.strerror or error, hint),
                       code)


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; write the whole file to it inside the block.

    On success the file is flushed to disk, given mode ``0666`` less the umask and renamed over
    ``path``; on any error it is removed and ``path`` is untouched. Raises ``OutputError`` when
    ``path`` is there and not a regular file (checked before and right before the rename), or
    the operating system refuses a write (an error in the block that is no OSError passes
    through unless a probe write fails).
    """
    path = os.fspath(path)
    problem = _target_problem(path)
    if problem:
        raise OutputError(path, 'cannot write %s: %s' % (path, problem))
    folder, name = os.path.split(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix='.%s.' % name, suffix=_TEMP_SUFFIX)
    except OSError as e:
        raise _os_failure(path, e) from None
    os.close(fd)
    try:
        try:
            yield tmp
        except OSError:
            raise
        except Exception as e:
            try:  # a writer that failed without the OS's reason: meet it (no space left, ...)
                with open(tmp, 'ab', buffering=0) as f:
                    f.write(b'\0' * _PROBE_BYTES)
                    os.fsync(f.fileno())
            except OSError as failure:
                raise _os_failure(path, failure) from e
            raise
        _fsync(tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600
        problem = _target_problem(path)
        if problem:
            raise OutputError(path, 'cannot write %s: %s' % (path, problem))
        os.replace(tmp, path)
        _fsync(folder)
    except (OutputError, InputError):
        raise
    except OSError as e:
        raise _os_failure(path, e) from e
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def _open_reason(path, error):
    code = error.errno
    if code == errno.ENOENT:
        if os.path.lexists(path):
            return 'is a dangling symbolic link (to %s)' % _link_target(path)
        return 'does not exist'
    if code == errno.ELOOP:
        return 'is a symbolic link loop (it points back to itself)'
    if code in (errno.EACCES, errno.EPERM):
        return 'cannot be read (%s)' % error.strerror
    if code == errno.ENOTDIR:
        return 'does not exist (a part of its path is not a folder)'
    return 'cannot be opened (%s)' % (error.strerror or error)


def open_input(path):
    """Open regular file ``path`` for reading in binary mode; return the file object.

    Anything else is refused without being opened (opening a FIFO would wait for a writer);
    the file is opened without blocking and checked again. Raises ``InputError`` with the
    reason: ``input_problem``'s, or ``cannot be read (Permission denied)``.
    """
    path = os.fspath(path)
    problem = input_problem(path)
    if problem:
        raise InputError(path, problem)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InputError(path, _open_reason(path, e)) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # replaced between the two checks
        os.close(fd)
        raise InputError(path, 'is %s, not a regular file' % file_kind(st.st_mode))
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return os.fdopen(fd, 'rb')


def read_json(path, limit=JSON_LIMIT):
    """The value of JSON file ``path``, read with the standard library only: nothing in it can
    run code, and at most ``limit`` bytes are read.

    Raises
    ------
    InputError
        When ``path`` is not a regular file that can be opened (``open_input``).
    OSError
        When reading it fails.
    ValueError
        When it is larger than ``limit``, not UTF-8 JSON, holds NaN or Infinity, or is nested
        too deeply; the text is the reason (``'it is nested too deeply'``), and ``fix`` the
        edit that mends it when one does (a trailing comma). A UTF-8 byte-order mark is read.
    """
    with open_input(path) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ValueError('it is larger than %d MB' % (limit >> 20))
    try:
        text = raw.decode('utf-8-sig')  # an editor's byte-order mark is no error
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError('it is nested too deeply') from None
    except UnicodeDecodeError as e:
        error = ValueError('it is not UTF-8 (byte 0x%02x at offset %d)' % (raw[e.start], e.start))
        error.fix = 'save it as UTF-8'
    except json.JSONDecodeError as e:
        if e.msg.startswith('Illegal trailing comma'):  # 3.13 points at the comma, 3.9-3.12 after
            e = json.JSONDecodeError(e.msg, text, re.compile(r',\s*').match(text, e.pos).end())
        comma = re.search(r',\s*\Z', text[:e.pos]) and text[e.pos:e.pos + 1] in ('}', ']')
        error = ValueError('it is not valid JSON at line %d column %d: %s' % (
            e.lineno, e.colno, 'a trailing comma before %s' % text[e.pos] if comma else e.msg))
        error.fix = comma and 'remove that comma'
    raise error


def _refuse_constant(name):
    raise ValueError('%s is not a number JSON allows' % name)


def input_problem(path):
    """Return why ``path`` is not a regular file to read (the phrase after the path: ``does
    not exist``, ``is a folder, not a regular file``, ...), or None; ``os.stat`` only, so a
    file that cannot be read is found by ``open_input``."""
    try:
        st = os.stat(path)
    except OSError as e:
        return _open_reason(path, e)
    except ValueError:
        return 'is not a valid path (it contains a NUL character)'
    if not stat.S_ISREG(st.st_mode):
        return 'is %s, not a regular file' % file_kind(st.st_mode)
    return None
