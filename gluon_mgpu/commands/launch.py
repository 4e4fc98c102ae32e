"""``python -m gluon_mgpu.launch -n 2 -s 1 -- COMMAND`` starts a ``dist_sync`` job's scheduler,
servers and workers, here or over ssh, and stops them all when one dies (docs/distributed.md).
"""
import argparse
import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from .cli import Parser, UsageError, die_with, run_command
from ..runtime import files, startup
from ..runtime.choices import DIST_KVSTORES
from ..runtime.hosts import guess_host_ip, hold_port, host_problem, read_hostfile, ssh_command
from ..runtime.threads import memory_bytes, thread_limit, thread_settings

PROG = 'python -m gluon_mgpu.launch'
# Passed to remote processes when set here (MXNet's ssh launcher passes the first three).
PASS_ENV = ('OMP_NUM_THREADS', 'LD_LIBRARY_PATH', 'DMLC_INTERFACE', 'PYTHONPATH')
STOP_SECONDS = 5.0  # after SIGTERM, before SIGKILL


# What one process of a job takes at the least: MXNet 1.9.1 loaded and one operator run
# (measured: 141 MiB resident and 7 threads).
PROCESS_BYTES, PROCESS_THREADS = 140 << 20, 7
# What this machine holds for one remote process of a --hostfile job: its ssh client (measured:
# 7.6 MiB resident, 1 thread).
SSH_BYTES, SSH_THREADS = 8 << 20, 1


def build_parser():
    p = Parser(prog=PROG, usage='%(prog)s -n WORKERS [-s SERVERS] [--hostfile FILE] '
                '[--port P] [options] -- COMMAND ...',
                description='Start a dist_sync job (scheduler, servers, workers: all run '
                            'COMMAND with the DMLC_* variables set), watch it, and stop it '
                            'all when one process fails.')
    p.add_argument('-n', '--num-workers', type=Parser.whole('--num-workers'), required=True,
                   help='number of worker processes')
    p.add_argument('-s', '--num-servers', type=Parser.whole('--num-servers'),
                   help='number of server processes (default: as many as workers, as '
                        "MXNet's launch.py)")
    p.add_argument('-H', '--hostfile',
                   help='file with one ssh host per line: a host name or address, with an '
                        'optional :port (ssh port, default 22; [IPv6]:port); blank lines and # '
                        'comments are skipped. Servers and workers are spread over the hosts '
                        'round-robin, the scheduler runs here (default: everything here, on '
                        '127.0.0.1)')
    p.add_argument('--port', type=Parser.whole('--port'),
                   help="the scheduler's port (default: a free one)")
    p.add_argument('--host-ip',
                   help="with --hostfile: this machine's address as the other hosts reach it "
                        '(default: guessed as dmlc-core does)')
    p.add_argument('--env', action='append', default=[], metavar='NAME[=VALUE]',
                   help='with --hostfile: also pass this variable (its value here, or VALUE) '
                        'to the remote processes; may be repeated. Passed anyway when set: '
                        + ', '.join(PASS_ENV))
    p.add_argument('--grace', default=30.0,
                   type=Parser.positive_float('--grace', 30, 'a number of seconds above 0'),
                   help='once a process has ended normally, the others must end within this '
                        'many seconds, or they are stopped (default: 30)')
    return p


def parse_args(argv=None):
    """Parse ``OPTIONS -- COMMAND ...``; ``args.command`` is the list after ``--``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if '--' not in argv:
        if {'-h', '--help'} & set(argv):
            build_parser().parse_args(argv)  # prints the help and exits
        raise UsageError('no command: put it after --, for example %s -n 2 -s 1 -- python -m '
                         'gluon_mgpu.train --kvstore dist_sync' % PROG)
    cut = argv.index('--')
    args = build_parser().parse_args(argv[:cut])
    args.command = argv[cut + 1:]
    if not args.command:
        raise UsageError('the command after -- is empty; for example -- python -m '
                         'gluon_mgpu.train --kvstore dist_sync')
    if args.num_servers is None:
        args.num_servers = args.num_workers
    if args.port is not None and not 1024 <= args.port <= 65535:
        raise UsageError('--port %d is not a TCP port; pass one from 1024 to 65535, or leave '
                         'it out for a free one' % args.port)
    for item in args.env:
        name = item.split('=', 1)[0]
        if not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', name):  # what a POSIX shell takes
            raise UsageError('--env %s: %r is not a variable name; for example --env '
                             'MXNET_HOME or --env MXNET_HOME=/data' % (item, name))
    args.hosts = None
    if args.hostfile is not None:
        try:
            args.hosts = read_hostfile(args.hostfile)
        except files.InputError as e:
            raise UsageError('--hostfile %s %s; name a regular file with one host per line'
                             % (args.hostfile, e.reason)) from None
        except ValueError as e:
            raise UsageError('--hostfile %s: %s' % (args.hostfile, e)) from None
    elif args.host_ip is not None or args.env:  # a local job's processes get all of this one's
        flag = '--host-ip' if args.host_ip is not None else '--env'
        raise UsageError('%s is for jobs over several hosts; add --hostfile FILE, or drop %s'
                         % (flag, flag))
    problem = args.host_ip is not None and host_problem(args.host_ip)
    if problem:
        raise UsageError('--host-ip %r %s; give this machine\'s address as the other hosts '
                         'reach it, for example --host-ip 10.0.0.5' % (args.host_ip, problem))
    return args


def command_problem(command):
    """Return why ``command`` (an argv list) cannot be started here (a name without a slash is
    looked up in ``$PATH``), or cannot be a process of a job: a ``python -m gluon_mgpu.<name>``
    that is not a train with a ``DIST_KVSTORES`` kvstore, which every worker would run alone
    (another program is started as it is); or None."""
    name = command[0]
    if not name:
        return 'the command is an empty string'
    if os.sep not in name:
        if not shutil.which(name):
            return '%s is not a program on PATH' % name
    elif not os.path.lexists(name):
        return '%s does not exist' % name
    elif not os.path.exists(name):
        return '%s is a dangling symbolic link' % name
    elif os.path.isdir(name):
        return '%s is a folder' % name
    elif not os.access(name, os.X_OK):
        return '%s is not executable (chmod +x)' % name
    module = next(((a[2:] or b, i + (1 if a[2:] else 2)) for i, (a, b) in
                   enumerate(zip(command, command[1:] + [''])) if a.startswith('-m')), None)
    if module is None or not module[0].startswith('gluon_mgpu'):
        return None
    if module[0] != 'gluon_mgpu.train':
        return ('%s is not a training that joins the job: every worker would run it alone and '
                'write the same outputs' % module[0])
    reader = argparse.ArgumentParser(add_help=False, exit_on_error=False)  # as train reads it
    reader.add_argument('--kvstore')
    try:
        kvstore = reader.parse_known_args(command[module[1]:])[0].kvstore
    except argparse.ArgumentError:  # --kvstore without a value: the train command says so
        return None
    if kvstore in DIST_KVSTORES:
        return None
    return ('gluon_mgpu.train without --kvstore %s trains by itself: every worker would run the '
            'whole training alone and write the same outputs (--kvstore %s)'
            % (' or '.join(DIST_KVSTORES), kvstore or 'device, the default'))


def max_local_processes(each='process loads MXNet', size=(PROCESS_BYTES, PROCESS_THREADS)):
    """``(n, reason)``: the most processes of a job this machine could hold, each taking at
    least ``size`` (bytes, threads: MXNet loaded; an ssh client with ``SSH_BYTES``,
    ``SSH_THREADS``), and why; ``(None, None)`` when nothing is known."""
    memory, (threads, source) = memory_bytes(), thread_limit()
    limits = []
    if memory:
        limits.append((memory // size[0], '%.1f GiB of memory' % (memory / 2 ** 30)))
    if threads:
        limits.append((threads // size[1], '%d threads (%s)' % (threads, source)))
    if not limits:
        return None, None
    most, why = min(limits)
    return most, ('each %s, at least %d MiB and %d thread%s, and this machine has %s'
                  % (each, size[0] >> 20, size[1], 's' if size[1] > 1 else '', why))


def check_job(args):
    """Before starting anything, raise ``UsageError`` if the command cannot run here (where
    the scheduler runs), the job's local processes are more than this machine can hold, or a
    given ``--port`` is taken; return the hold on that port (``hold_port``), or None."""
    problem = command_problem(args.command)
    if problem:
        raise UsageError('cannot run the command after --: %s; for example -- python -m '
                         'gluon_mgpu.train --kvstore dist_sync' % problem)
    counts = (args.num_workers, args.num_servers)
    if args.hosts is None:
        local, (most, why) = 1 + sum(counts), max_local_processes()
        if most is not None and local > most:
            raise UsageError('-n %d -s %d: a job of %d processes on this machine (the scheduler, '
                             'the servers and the workers) is more than it can hold (at most %d: '
                             '%s); pass fewer, or spread the job over machines with --hostfile'
                             % (counts + (local, most, why)))
    else:
        most, why = max_local_processes('ssh client', (SSH_BYTES, SSH_THREADS))
        if most is not None and sum(counts) > most:
            raise UsageError('-n %d -s %d with --hostfile: every server and worker is an ssh '
                             'client on this machine, %d in all, more than it can hold (at most '
                             '%d: %s); pass fewer' % (counts + (sum(counts), most, why)))
    if args.hosts is not None and not shutil.which('ssh'):
        raise UsageError('--hostfile needs ssh to start the remote processes, but ssh is not '
                         'a program on PATH; install an ssh client (Debian: apt-get install '
                         'openssh-client)')
    if args.port is not None:
        hold, problem = hold_port(args.port, '127.0.0.1' if args.hosts is None else '')
        if problem:
            raise UsageError('--port %d %s; pass another port, or leave --port out for a free '
                             'one' % (args.port, problem))
        return hold
    return None


def plan(args, environ=None, workdir=None):
    """Return the job's processes as ``[(name, argv, env, host), ...]``: ``scheduler``, then
    ``server 0``, ..., ``worker 0``, ... (in start order, not rank); ``env`` is the whole
    environment of a local process, None for an ssh process (its variables are in its argv)."""
    environ = dict(os.environ if environ is None else environ)
    nw, ns, local = args.num_workers, args.num_servers, args.hosts is None
    uri = '127.0.0.1' if local else args.host_ip or guess_host_ip()
    port = args.port
    if port is None:  # one free now (the OS picks it)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(('127.0.0.1' if local else '', 0))
            port = s.getsockname()[1]
    # OMP_NUM_THREADS set by gluon_mgpu (not by the user) suits only this machine's cores.
    threads = thread_settings()
    user_threads = threads.get('source') == 'user'

    def job(role):  # the DMLC_* variables of one process
        return {'DMLC_ROLE': role, 'DMLC_PS_ROOT_URI': uri, 'DMLC_PS_ROOT_PORT': str(port),
                'DMLC_NUM_SERVER': str(ns), 'DMLC_NUM_WORKER': str(nw)}

    roles = [('server %d' % i, 'server') for i in range(ns)] + \
            [('worker %d' % i, 'worker') for i in range(nw)]
    if local:
        base = dict(environ, DMLC_NODE_HOST=uri)
        if not user_threads and 'OMP_NUM_THREADS' in environ:  # the workers share the cores
            cores = threads.get('cores') or os.cpu_count() or 1
            base['OMP_NUM_THREADS'] = str(max(1, cores // nw))
        return [(name, list(args.command), dict(base, **job(role)), 'localhost')
                for name, role in [('scheduler', 'scheduler')] + roles]
    passed = {k: environ[k] for k in PASS_ENV
              if k in environ and (user_threads or k != 'OMP_NUM_THREADS')}
    for name, has_value, value in (item.partition('=') for item in args.env):
        if has_value or name in environ:
            passed[name] = value if has_value else environ[name]
    workdir = os.getcwd() if workdir is None else workdir
    processes = [('scheduler', list(args.command), dict(environ, **job('scheduler')),
                  'localhost')]
    for i, (name, role) in enumerate(roles):
        host, ssh_port = args.hosts[i % len(args.hosts)]
        variables = dict(passed, DMLC_NODE_HOST=host, **job(role))
        processes.append((name, ssh_command(host, ssh_port, variables, workdir, args.command),
                          None, host))
    return processes


def _describe_exit(code):
    if code < 0:
        try:
            return 'was killed by %s' % signal.Signals(-code).name
        except ValueError:
            return 'was killed by signal %d' % -code
    return 'exited with code %d' % code


def _stop(running):
    """SIGTERM every process group still running, then SIGKILL what is left after a while."""
    for _, p in running:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    for _, p in running:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_job(processes, grace=30.0, poll=0.1, log=None):
    """Start ``processes`` (from ``plan``), watch them, and return the launcher's exit code: 2
    when one cannot start, else as docs/distributed.md ("If a process dies") says."""
    log = sys.stderr if log is None else log

    def say(text):
        log.write('launch: %s\n' % text)  # one write: the job's processes share this stream
        log.flush()

    started = []
    try:
        for name, argv, env, host in processes:
            # Remote processes (env None: ssh) stop when their connection closes; local ones
            # when the launcher dies.
            try:
                started.append((name, subprocess.Popen(
                    argv, env=env, stdin=subprocess.PIPE if env is None else subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=None if env is None else functools.partial(
                        die_with, os.getpid(), signal.SIGTERM))))
            except OSError as e:
                _stop(started)
                say('error: cannot start %s: %s: %s; stopped the %d processes already started'
                    % (name, argv[0], e.strerror or e, len(started)))
                return 2
        say('started %s' % ', '.join('%s (pid %d)' % (n, p.pid) for n, p in started))
        first_end = None
        while True:
            running = [(n, p) for n, p in started if p.poll() is None]
            ended = [(n, p) for n, p in started if p.returncode is not None]
            failed = [(n, p) for n, p in ended if p.returncode != 0]
            if failed:
                name, p = failed[0]
                _stop(running)
                say('%s (pid %d) %s; stopped the %d other processes of the job'
                    % (name, p.pid, _describe_exit(p.returncode), len(running)))
                return p.returncode if p.returncode > 0 else 1
            if not running:
                return 0
            if ended and first_end is None:
                first_end = time.monotonic()
            if first_end is not None and time.monotonic() - first_end > grace:
                _stop(running)
                names = ', '.join(n for n, _ in running)
                if any(n.startswith('worker') for n, _ in running):
                    say('%s ended normally but %s still ran %g s later; stopped them'
                        % (ended[0][0], names, grace))
                    return 1
                say('the workers finished but %s still ran %g s later; stopped them'
                    % (names, grace))
                return 0
            time.sleep(poll)
    except startup.Interrupted as e:
        _stop(started)  # it signals only what still runs
        say('stopped by %s' % e.signal_name)
        return e.exit_code
    finally:
        for _, p in started:
            if p.stdin is not None:
                p.stdin.close()


def main(argv=None):
    """Entry point of ``python -m gluon_mgpu.launch``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def interrupt(signum, frame):
        raise startup.Interrupted(signum)

    def body():
        args = parse_args(argv)
        startup.before_mxnet(PROG, mxnet=False)  # what its processes would abort on
        hold = check_job(args)  # the --port, until the job has ended
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                signal.signal(signum, interrupt)  # not under nohup: it ignores SIGHUP on purpose
        try:
            return run_job(plan(args), grace=args.grace)
        finally:
            if hold is not None:
                hold.close()

    # --debug after -- belongs to the command, not to the launcher.
    return run_command(PROG, argv[:argv.index('--')] if '--' in argv else argv, body)
