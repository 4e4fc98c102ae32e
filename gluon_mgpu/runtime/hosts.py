"""Host names, addresses and ports from a hostfile, ``--host-ip``, ``--port`` and the ``DMLC_*``
variables, checked here since ps-lite and ssh do not (docs/distributed.md, "Refused before
anything starts"), and the ssh command of a process on a host. No MXNet here: a server's
``import mxnet`` already joins the job.
"""
import contextlib
import errno
import ipaddress
import re
import shlex
import socket
import struct

from . import files
from .checks import is_digits

__all__ = ['JOB_VARIABLES', 'ROLES', 'host_problem', 'port_number', 'parse_host_port',
           'read_hostfile', 'guess_host_ip', 'hold_port', 'remote_script', 'ssh_command',
           'job_problem']

JOB_VARIABLES = ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT', 'DMLC_NUM_SERVER',
                 'DMLC_NUM_WORKER')
ROLES = ('worker', 'server', 'scheduler')

# RFC 1123 labels (letters, digits, inner hyphens; an inner underscore, as /etc/hosts allows).
_LABEL = r'[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?'
_NAME = re.compile(r'%s(?:\.%s)*\.?' % (_LABEL, _LABEL))


def _ip_version(text):  # 4 or 6 for an IP address, else None
    try:
        return ipaddress.ip_address(text).version
    except ValueError:
        return None


def host_problem(host):
    """Why ``host`` is not a host name, an IPv4 or an IPv6 address (the phrase after it: ``is
    not a host name or an IP address``), or None."""
    if not host:
        return 'is empty'
    if _ip_version(host):
        scope = host.partition('%')[2]  # fe80::1%eth0: ipaddress takes any text after the %
        if '%' in host and not re.fullmatch(r'[A-Za-z0-9_.-]{1,15}', scope):
            return ('is an IPv6 address whose scope id %r is not a network interface (a name '
                    'of up to 15 letters, digits, dots, dashes or underscores, or its number)'
                    % scope)
        return None
    if len(host) > 253 or not _NAME.fullmatch(host):
        return 'is not a host name or an IP address'
    if re.fullmatch(r'[0-9.]+', host):  # a top-level name is never all digits
        return 'is not an IPv4 address'
    return None


def port_number(text):
    """``text`` as a TCP port (ASCII digits, 1 to 65535), or None."""
    return int(text) if is_digits(text) and 0 < int(text) < 65536 else None


def parse_host_port(text, default_port):
    """``(host, port)`` from ``host``, ``host:port``, ``[IPv6]``, ``[IPv6]:port`` or a bare IPv6
    address; None when ``text`` is anything else (a blank inside, a leading ``-``, ...)."""
    if text.startswith('['):
        host, bracket, rest = text[1:].partition(']')
        if not bracket or _ip_version(host) != 6 or rest[:1] not in ('', ':'):
            return None
    elif text.count(':') > 1:  # a bare IPv6 address, no port
        host, rest = text, ''
    else:
        host = text.partition(':')[0]
        rest = text[len(host):]
    port = port_number(rest[1:]) if rest else default_port
    if port is None or host_problem(host):
        return None
    return host, port


def read_hostfile(path):
    """Return ``[(host, ssh_port), ...]`` from a hostfile (docs/distributed.md, "Several
    machines").

    Raises
    ------
    files.InputError
        For a path that is not a readable regular file (a FIFO is refused, not waited on).
    ValueError
        Naming the line that is not a host with an optional ``:port``, or not UTF-8 text; for a
        file without hosts.
    """
    with files.open_input(path) as f:
        data = f.read()
    hosts = []
    for number, raw in enumerate(data.split(b'\n'), 1):
        try:
            line = raw.decode('utf-8').split('#', 1)[0].strip(' \t\r')
        except UnicodeDecodeError:
            raise ValueError('line %d is not UTF-8 text; write one host name or address per '
                             'line' % number) from None
        if not line:
            continue
        host = parse_host_port(line, 22)
        if host is None:
            raise ValueError('line %d, %r, is not a host name or address with an optional '
                             ':port; write one per line, for example node1, node1:2222, '
                             '10.0.0.2 or [fe80::1]:22' % (number, line))
        hosts.append(host)
    if not hosts:
        raise ValueError('no hosts in the file; write one host (or host:port) per line')
    return hosts


def guess_host_ip():
    """This machine's address as other hosts would reach it, found as dmlc-core's tracker does."""
    try:
        ip = socket.gethostbyname(socket.getfqdn())
    except socket.gaierror:
        ip = socket.gethostbyname(socket.gethostname())
    if ip.startswith('127.'):
        # A UDP "connection" sends nothing; it only makes the OS choose the outgoing interface.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(('10.255.255.255', 1))
            ip = s.getsockname()[0]
    return ip


def hold_port(port, host='127.0.0.1'):
    """Return ``(hold, problem)``: why the scheduler could not listen on ``host:port`` now
    (``hold`` None), or a socket holding the port for this launcher until it is closed, and None.

    The port is bound for a moment with ``SO_REUSEADDR``, as ZeroMQ does: one in TIME_WAIT is
    free. The hold is an abstract Unix socket named after the port (Linux; elsewhere None):
    another launcher here asking for it at the same moment, whose processes would join this
    job's scheduler and abort it, is refused with this launcher's pid (``SO_PEERCRED``).
    """
    name = '\0gluon_mgpu.launch --port %d' % port
    hold = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        hold.bind(name)
        hold.listen()
    except OSError as e:
        hold.close()
        hold = None  # no abstract sockets here: nothing to hold
        if e.errno == errno.EADDRINUSE:
            holder = ''
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer, \
                    contextlib.suppress(OSError):  # it may have just ended
                peer.connect(name)
                holder = ' (pid %d)' % struct.unpack('3i', peer.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize('3i')))[0]
            return None, 'is taken by the job of another launcher on this machine' + holder
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if hold is not None:
                hold.close()
            return None, 'cannot be used on %s (%s)' % (host or 'this machine',
                                                        e.strerror or e)
    return hold, None


def remote_script(variables, workdir, command):
    """The POSIX shell script one remote process runs: set variables, cd, run the command in
    the background (its code is the script's) while a watcher reads the ssh connection (stdin,
    kept as fd 3) and sends the command SIGTERM when it closes."""
    exports = ' '.join('%s=%s' % (k, shlex.quote(str(v))) for k, v in variables.items())
    return ('export %s; cd %s || exit 1; exec 3<&0; %s & child=$!; '
            '(cat <&3; kill -TERM "$child") >/dev/null 2>&1 & watcher=$!; '
            'wait "$child"; code=$?; kill "$watcher" 2>/dev/null; exit "$code"'
            % (exports, shlex.quote(workdir), ' '.join(shlex.quote(a) for a in command)))


def ssh_command(host, port, variables, workdir, command):
    """The argv that runs ``command`` on ``host`` over ssh (see ``remote_script``); ``--`` ends
    ssh's options, so that no host is ever read as one."""
    return ['ssh', '-o', 'StrictHostKeyChecking=no', '-o', 'BatchMode=yes', '-p', str(port),
            '--', host, 'sh -c %s' % shlex.quote(remote_script(variables, workdir, command))]


def job_problem(environ):
    """Why the ``DMLC_*`` variables in ``environ`` cannot start a job, as one sentence with the
    fix, or None: a missing variable, a role that is not one of ``ROLES``, a root that is not
    a host, a port outside 1 to 65535, a count that is not a whole number from 1."""
    launch = ('start the job with python -m gluon_mgpu.launch -n WORKERS -s SERVERS -- python '
              '-m gluon_mgpu.train ..., which sets them')
    role = environ.get('DMLC_ROLE')
    if role is not None and role not in ROLES:
        return 'DMLC_ROLE=%r is not one of %s; %s' % (role, ', '.join(ROLES), launch)
    missing = [v for v in JOB_VARIABLES if not environ.get(v)]
    if missing:
        return ('a dist kvstore needs the job variables %s, which are not set; %s'
                % (', '.join(missing), launch))
    for name in ('DMLC_NUM_WORKER', 'DMLC_NUM_SERVER'):
        value = environ[name]
        if not is_digits(value) or int(value) < 1:
            return '%s=%r is not a whole number of 1 or more; %s' % (name, value, launch)
    for name in ('DMLC_PS_ROOT_URI', 'DMLC_NODE_HOST'):
        value = environ.get(name)
        problem = value is not None and host_problem(value)
        if problem:
            return '%s=%r %s; %s' % (name, value, problem, launch)
    port = environ['DMLC_PS_ROOT_PORT']
    if port_number(port) is None:
        return ('DMLC_PS_ROOT_PORT=%r is not a TCP port (1 to 65535), and MXNet would wait for '
                'the scheduler on it forever; %s' % (port, launch))
    return None
