"""Host names, addresses and ports from a hostfile, ``--host-ip`` and the ``DMLC_*`` variables,
checked here since ps-lite and ssh do not (docs/distributed.md, "Refused before anything
starts"). No MXNet here: a server's ``import mxnet`` already joins the job.
"""
import ipaddress
import re

from .checks import is_digits

__all__ = ['JOB_VARIABLES', 'ROLES', 'host_problem', 'port_number', 'parse_host_port',
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
