import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from mxnet import nd

from gluon_mgpu.parallel import dist
from gluon_mgpu.commands import launch
from gluon_mgpu.runtime import hosts

PY = sys.executable
TRAIN = [PY, '-m', 'gluon_mgpu.train', '--model', 'lenet', '--device', 'cpu', '--seed', '0',
         '--test-limit', '16']


def _env():
    # Two cores are shared by every process of a job (and by other tests).
    return dict(os.environ, OMP_NUM_THREADS='1')


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _pids(log):
    return {name: int(pid) for name, pid in
            re.findall(r'(scheduler|server \d+|worker \d+) \(pid (\d+)\)', log)}


# --- command line ------------------------------------------------------------------------

@pytest.mark.parametrize('argv,expected', [
    (['-n', '2'], r'no command: put it after --, for example python -m gluon_mgpu.launch -n 2 '
                  r'-s 1 -- python -m gluon_mgpu.train --kvstore dist_sync'),
    (['-n', '2', '--'], r'the command after -- is empty'),
    (['--', 'python'], r'the following arguments are required: -n/--num-workers'),
    (['-n', '0', '--', 'python'], r'argument -n/--num-workers: --num-workers must be at least '
                                  r'1, got 0'),
    (['-n', 'two', '--', 'python'], r"--num-workers expects a whole number, got 'two'"),
    (['-n', '2', '--host-ip', '10.0.0.1', '--', 'python'],
     r'--host-ip is for jobs over several hosts; add --hostfile FILE, or drop --host-ip'),
    (['-n', '2', '--hostfile', '/nonexistent/hosts', '--', 'python'],
     r"--hostfile /nonexistent/hosts does not exist; name a regular file with one host per "
     r"line$"),
    (['-n', '2', '--hostfile', '/dev/null', '--', 'python'],
     r"--hostfile /dev/null is a character device, not a regular file; name a regular file"),
    (['-n', '2', '--env', 'A-B', '--', 'python'], r"--env A-B: 'A-B' is not a variable name"),
    # Issue 65: a local job's processes inherit every variable; --env VALUE was dropped unsaid.
    (['-n', '2', '--env', 'MXNET_HOME=/data', '--', 'python'],
     r'--env is for jobs over several hosts; add --hostfile FILE, or drop --env$'),
    (['-n', '2', '--port', '70000', '--', 'python'], r'--port 70000 is not a TCP port'),
    # Issue 45: a name the remote shell refuses; a port below 1024, which the help excludes.
    (['-n', '2', '--env', '\u00e9=1', '--', 'python'],
     r"--env \u00e9=1: '\u00e9' is not a variable name; for example --env MXNET_HOME"),
    (['-n', '2', '--port', '80', '--', 'python'], r'^python -m gluon_mgpu.launch: error: --port '
                                                  r'80 is not a TCP port; pass one from 1024 to '
                                                  r'65535, or leave it out for a free one\n$'),
    (['-n', '2', '--grace', '0', '--', 'python'], r'--grace expects a number of seconds above '
                                                  r"0, got '0'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, expected, capsys):
    assert launch.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == '' and len(err.splitlines()) == 1, err
    assert err.startswith('python -m gluon_mgpu.launch: error: ')
    assert re.search(expected, err), err


def test_hostfile_format(tmp_path):
    path = tmp_path / 'hosts'
    path.write_text('# the cluster\nnode1\n\n  10.0.0.2:2222  \nnode3:22 # last one\n')
    assert hosts.read_hostfile(str(path)) == [('node1', 22), ('10.0.0.2', 2222),
                                               ('node3', 22)]
    path.write_text('node1\nnode2:ssh\n')
    with pytest.raises(ValueError, match=r'^line 2, \'node2:ssh\', is not a host name or '
                                         r'address with an optional :port; write one per line, '
                                         r'for example node1, node1:2222, 10.0.0.2 or '
                                         r'\[fe80::1\]:22$'):
        hosts.read_hostfile(str(path))
    path.write_text('node1:\u00b2\n')  # a digit to str.isdigit, not to int()
    with pytest.raises(ValueError, match='line 1, \'node1:\u00b2\', is not a host name'):
        hosts.read_hostfile(str(path))
    path.write_text('# nothing\n\n')
    with pytest.raises(ValueError, match='no hosts in the file'):
        hosts.read_hostfile(str(path))


@pytest.mark.parametrize('line', [
    'a b c', '-oProxyCommand=true', '-p', 'user@node1', 'node1:0', 'node1:65536',
    'node1:22:33', '[10.0.0.1]:22', '[::1', '10.0.0.256', 'n\u00f6de', 'node1\v', 'node1;id',
    # Issue 45: Python's ipaddress takes any scope id; these reached ssh.
    'fe80::1%a;reboot', '::1%$(id)', '[fe80::1%a b]:22',
])
def test_a_hostfile_line_that_is_not_a_host_is_refused_with_file_and_line(line, tmp_path,
                                                                          capsys):
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('node0  # fine\n%s\n' % line)
    assert launch.main(['-n', '1', '-H', str(hostfile), '--', 'python']) == 2
    out, err = capsys.readouterr()
    assert out == ''
    assert err == ('python -m gluon_mgpu.launch: error: --hostfile %s: line 2, %r, is not a host '
                   'name or address with an optional :port; write one per line, for example '
                   'node1, node1:2222, 10.0.0.2 or [fe80::1]:22\n' % (hostfile, line))


def test_hosts_and_addresses_with_ports_are_read(tmp_path):
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('node-1.example.com.\n[fe80::1]:2200\nfe80::2\n10.0.0.2:22\r\n'
                        'fe80::3%eth0\n[fe80::4%2]:22\n')
    assert hosts.read_hostfile(str(hostfile)) == [
        ('node-1.example.com.', 22), ('fe80::1', 2200), ('fe80::2', 22), ('10.0.0.2', 22),
        ('fe80::3%eth0', 22), ('fe80::4%2', 22)]
    hostfile.write_bytes(b'node1\nnode\xff2\n')
    with pytest.raises(ValueError, match=r'^line 2 is not UTF-8 text; write one host name or '
                                         r'address per line$'):
        hosts.read_hostfile(str(hostfile))


def test_ssh_reads_the_host_after_double_dash_never_as_an_option():
    argv = hosts.ssh_command('-oProxyCommand=x', 22, {}, '/', ['true'])
    assert argv[argv.index('--') + 1] == '-oProxyCommand=x'
    # OpenSSH itself (ssh -G prints its configuration and connects nowhere): before --, such
    # a host is an option that runs a command; after it, a host name it refuses.
    if launch.command_problem(['ssh']) is None:
        def config(*argv):
            return subprocess.run(['ssh', '-G', '-p', '2222', *argv], capture_output=True,
                                  text=True, timeout=60)
        assert 'proxycommand touch x' in config('-oProxyCommand=touch x', 'node').stdout
        after = config('--', '-oProxyCommand=touch x', 'true')
        assert 'touch x' not in after.stdout and 'hostname' in after.stderr, after


def test_a_fifo_as_hostfile_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / 'hosts'
    os.mkfifo(fifo)
    start = time.monotonic()
    run = subprocess.run([PY, '-m', 'gluon_mgpu.launch', '-n', '1', '-H', str(fifo), '--',
                          'python'], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout) == (2, '')
    assert run.stderr == ('python -m gluon_mgpu.launch: error: --hostfile %s is a FIFO (named '
                          'pipe), not a regular file; name a regular file with one host per '
                          'line\n' % fifo)
    assert time.monotonic() - start < 100


@pytest.mark.parametrize('host_ip,why', [('-oProxyCommand=x', 'is not a host name or an IP '
                                          'address'), ('10.0.0.999', 'is not an IPv4 address'),
                                         ('', 'is empty')])
def test_host_ip_must_be_a_host(host_ip, why, tmp_path, capsys):
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('node1\n')
    assert launch.main(['-n', '1', '-H', str(hostfile), '--host-ip=%s' % host_ip, '--',
                        'python']) == 2
    assert capsys.readouterr().err == (
        "python -m gluon_mgpu.launch: error: --host-ip %r %s; give this machine's address as "
        "the other hosts reach it, for example --host-ip 10.0.0.5\n" % (host_ip, why))


def test_an_absurd_local_job_is_refused_before_any_process_starts(capsys, tmp_path):
    most, why = launch.max_local_processes()
    n = most // 2 + 1  # with as many servers, one process too many (a regression starts few)
    marker = tmp_path / 'started'
    start = time.time()
    assert launch.main(['-n', str(n), '--', sys.executable, '-c',
                        'open(%r, "w").close()' % str(marker)]) == 2
    assert time.time() - start < 30 and not marker.exists()
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.launch: error: -n %d -s %d: a job of %d processes on this machine '
        '(the scheduler, the servers and the workers) is more than it can hold (at most %d: '
        '%s); pass fewer, or spread the job over machines with --hostfile\n'
        % (n, n, 2 * n + 1, most, why))



def test_servers_and_workers_on_other_hosts_do_not_count_here(monkeypatch):
    import types
    most, _ = launch.max_local_processes()
    monkeypatch.setattr(launch.shutil, 'which', lambda name: '/usr/bin/' + name)
    args = types.SimpleNamespace(command=[sys.executable], hosts=[('node1', 22)], port=None,
                                 num_workers=most, num_servers=most)
    assert launch.check_job(args) is None  # only the scheduler runs on this machine
    args.hosts = None
    with pytest.raises(launch.UsageError, match='is more than it can hold'):
        launch.check_job(args)


def test_a_remote_job_is_bounded_by_its_ssh_clients_here(monkeypatch, tmp_path, capsys):
    # Every remote process has its ssh client on this machine: -n 2147483647 with a hostfile
    # once built a list of 4294967294 processes until memory ran out (here, with 1 GiB, -n 100
    # is already too many).
    monkeypatch.setattr(launch, 'memory_bytes', lambda: 1 << 30)
    monkeypatch.setattr(launch, 'thread_limit', lambda: (4096, 'kernel.pid_max'))
    assert launch.max_local_processes('ssh client', (launch.SSH_BYTES, launch.SSH_THREADS)) == (
        128, 'each ssh client, at least 8 MiB and 1 thread, and this machine has 1.0 GiB of '
             'memory')
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('node1\nnode2\n')
    marker = tmp_path / 'started'
    assert launch.main(['-n', '100', '-H', str(hostfile), '--host-ip', '10.0.0.5', '--',
                        sys.executable, '-c', 'open(%r, "w").close()' % str(marker)]) == 2
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.launch: error: -n 100 -s 100 with --hostfile: every server and '
        'worker is an ssh client on this machine, 200 in all, more than it can hold (at most '
        '128: each ssh client, at least 8 MiB and 1 thread, and this machine has 1.0 GiB of '
        'memory); pass fewer\n')
    assert not marker.exists()
    monkeypatch.setattr(launch.shutil, 'which', lambda name: '/usr/bin/' + name)
    import types
    args = types.SimpleNamespace(command=[sys.executable], hosts=[('node1', 22)], port=None,
                                 num_workers=64, num_servers=64)
    assert launch.check_job(args) is None
    args.num_servers = 65
    with pytest.raises(launch.UsageError, match=' 129 in all, '):
        launch.check_job(args)


def test_the_local_limit_is_the_tighter_of_memory_and_threads(monkeypatch, tmp_path):
    meminfo = tmp_path / 'meminfo'
    meminfo.write_text('MemTotal:        1048576 kB\nMemFree:          524288 kB\n')
    from gluon_mgpu.runtime.threads import memory_bytes
    assert memory_bytes(str(meminfo)) == 1 << 30
    assert memory_bytes(str(tmp_path / 'missing')) is None
    monkeypatch.setattr(launch, 'memory_bytes', lambda: 1 << 30)
    monkeypatch.setattr(launch, 'thread_limit', lambda: (4096, 'kernel.pid_max'))
    assert launch.max_local_processes() == (7, 'each process loads MXNet, at least 140 MiB and '
                                               '7 threads, and this machine has 1.0 GiB of '
                                               'memory')
    monkeypatch.setattr(launch, 'thread_limit', lambda: (35, 'ulimit -u'))
    assert launch.max_local_processes()[0] == 5
    assert launch.max_local_processes()[1].endswith('has 35 threads (ulimit -u)')
    monkeypatch.setattr(launch, 'memory_bytes', lambda: None)
    monkeypatch.setattr(launch, 'thread_limit', lambda: (None, None))
    assert launch.max_local_processes() == (None, None)


def test_ctrl_c_before_the_job_starts_is_one_line(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(launch, 'check_job', interrupted)
    assert launch.main(['-n', '1', '--', 'python']) == 130
    assert capsys.readouterr() == ('', 'python -m gluon_mgpu.launch: interrupted (Ctrl-C)\n')


def test_local_plan_runs_every_role_on_loopback():
    args = launch.parse_args(['-n', '2', '--port', '9123', '--', 'python', 'x.py', '--a b'])
    assert args.num_servers == 2  # default: as many servers as workers, as MXNet's launch.py
    args = launch.parse_args(['-n', '2', '-s', '1', '--port', '9123', '--', 'python', 'x.py'])
    processes = launch.plan(args, environ={'HOME': '/home/me'})
    assert [p[0] for p in processes] == ['scheduler', 'server 0', 'worker 0', 'worker 1']
    for name, argv, env, host in processes:
        assert argv == ['python', 'x.py'] and host == 'localhost'
        assert env['HOME'] == '/home/me'
        assert {k: env[k] for k in dist.JOB_VARIABLES} == {
            'DMLC_ROLE': name.split()[0], 'DMLC_PS_ROOT_URI': '127.0.0.1',
            'DMLC_PS_ROOT_PORT': '9123', 'DMLC_NUM_SERVER': '1', 'DMLC_NUM_WORKER': '2'}
        assert env['DMLC_NODE_HOST'] == '127.0.0.1'
    free = launch.plan(launch.parse_args(['-n', '1', '--', 'python']), environ={})
    ports = {env['DMLC_PS_ROOT_PORT'] for _, _, env, _ in free}
    assert len(ports) == 1 and 1024 <= int(ports.pop()) < 65536


def test_local_plan_shares_the_cores_unless_threads_were_chosen(monkeypatch):
    args = launch.parse_args(['-n', '2', '--', 'python'])
    monkeypatch.setattr(launch, 'thread_settings', lambda: {'source': 'gluon_mgpu', 'cores': 8})
    envs = [env for _, _, env, _ in launch.plan(args, environ={'OMP_NUM_THREADS': '8'})]
    assert {env['OMP_NUM_THREADS'] for env in envs} == {'4'}
    monkeypatch.setattr(launch, 'thread_settings', lambda: {'source': 'user', 'cores': 8})
    envs = [env for _, _, env, _ in launch.plan(args, environ={'OMP_NUM_THREADS': '3'})]
    assert {env['OMP_NUM_THREADS'] for env in envs} == {'3'}


def test_ssh_plan_follows_mxnets_launcher(tmp_path, monkeypatch):
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('alpha\nbeta:2222\n')
    monkeypatch.setattr(launch, 'thread_settings', lambda: {'source': 'gluon_mgpu', 'cores': 2})
    args = launch.parse_args(['-n', '3', '-s', '2', '-H', str(hostfile), '--host-ip',
                              '10.0.0.5', '--port', '9100', '--env', 'MXNET_HOME',
                              '--env', 'EXTRA=a b', '--', 'python', '-m', 'gluon_mgpu.train',
                              '--kvstore', 'dist_sync'])
    environ = {'PYTHONPATH': '/src/my code', 'OMP_NUM_THREADS': '2', 'MXNET_HOME': '/data',
               'SECRET': 'not passed'}
    processes = launch.plan(args, environ=environ, workdir='/work dir')
    # As dmlc-core's ssh.py: process i of servers-then-workers runs on host i % len(hosts).
    assert [(p[0], p[3]) for p in processes] == [
        ('scheduler', 'localhost'), ('server 0', 'alpha'), ('server 1', 'beta'),
        ('worker 0', 'alpha'), ('worker 1', 'beta'), ('worker 2', 'alpha')]
    scheduler = processes[0]
    assert scheduler[1] == args.command and scheduler[2]['DMLC_ROLE'] == 'scheduler'
    assert scheduler[2]['DMLC_PS_ROOT_URI'] == '10.0.0.5'
    name, argv, env, host = processes[2]
    assert env is None
    assert argv[:10] == ['ssh', '-o', 'StrictHostKeyChecking=no', '-o', 'BatchMode=yes',
                         '-p', '2222', '--', 'beta', argv[9]]
    assert len(argv) == 10 and argv[9].startswith('sh -c ')
    script = shlex.split(argv[9])[2]
    assert script == hosts.remote_script(
        {'PYTHONPATH': '/src/my code', 'MXNET_HOME': '/data', 'EXTRA': 'a b',
         'DMLC_NODE_HOST': 'beta', 'DMLC_ROLE': 'server', 'DMLC_PS_ROOT_URI': '10.0.0.5',
         'DMLC_PS_ROOT_PORT': '9100', 'DMLC_NUM_SERVER': '2', 'DMLC_NUM_WORKER': '3'},
        '/work dir', args.command)
    assert script.startswith("export PYTHONPATH='/src/my code' MXNET_HOME=/data EXTRA='a b' "
                             "DMLC_NODE_HOST=beta DMLC_ROLE=server DMLC_PS_ROOT_URI=10.0.0.5 "
                             "DMLC_PS_ROOT_PORT=9100 DMLC_NUM_SERVER=2 DMLC_NUM_WORKER=3; "
                             "cd '/work dir' || exit 1; ")
    assert 'python -m gluon_mgpu.train --kvstore dist_sync &' in script
    # OMP_NUM_THREADS was chosen by gluon_mgpu for this machine's cores: not passed on.
    assert 'OMP_NUM_THREADS' not in script and 'SECRET' not in script


def _remote(tmp_path, code, **variables):
    """Run what ssh would run on the remote host, here: the login shell gets argv[-1]."""
    workdir = tmp_path / 'a dir'
    workdir.mkdir(exist_ok=True)
    argv = hosts.ssh_command('host', 22, variables, str(workdir), [PY, '-c', code])
    return subprocess.Popen(['bash', '-c', argv[-1]], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True), workdir


def test_remote_script_sets_variables_and_directory_and_keeps_the_exit_code(tmp_path):
    proc, workdir = _remote(tmp_path, 'import os, sys; print(os.environ["DMLC_ROLE"], '
                                      'repr(os.environ["ODD"]), os.getcwd()); sys.exit(3)',
                            DMLC_ROLE='worker', ODD="it's $HOME; \"x\"")
    # stdin (the ssh connection) stays open: the command runs to its end.
    assert proc.wait(timeout=60) == 3
    assert proc.stdout.read() == 'worker %r %s\n' % ("it's $HOME; \"x\"", workdir)
    proc.stdin.close()


def test_remote_command_stops_when_the_ssh_connection_closes(tmp_path):
    proc, _ = _remote(tmp_path, 'import os, time; print(os.getpid(), flush=True); '
                                'time.sleep(120)', DMLC_ROLE='worker')
    pid = int(proc.stdout.readline())
    start = time.monotonic()
    proc.stdin.close()  # what the remote side sees when the launcher stops its ssh client
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert time.monotonic() - start < 10
    assert _gone(pid)


# --- watching a job (small stand-in processes) ----------------------------------------------

def _job(*codes):
    names = ['scheduler', 'server 0'] + ['worker %d' % i for i in range(len(codes) - 2)]
    return [(name, [PY, '-c', code], dict(os.environ), 'localhost')
            for name, code in zip(names, codes)]


class _Log:
    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    def flush(self):
        pass

    @property
    def text(self):
        return ''.join(self.lines)


SLEEP = 'import time; time.sleep(120)'


def test_a_job_that_ends_well_exits_0():
    log = _Log()
    assert launch.run_job(_job('pass', 'pass', 'pass', 'pass'), log=log) == 0
    assert re.fullmatch(r'launch: started scheduler \(pid \d+\), server 0 \(pid \d+\), '
                        r'worker 0 \(pid \d+\), worker 1 \(pid \d+\)\n', log.text), log.text


@pytest.mark.parametrize('code,code_seen,how', [
    ('import time, sys; time.sleep(0.5); sys.exit(3)', 3, 'exited with code 3'),
    ('import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)', 1,
     'was killed by SIGKILL'),
])
def test_one_dead_worker_stops_the_whole_job(code, code_seen, how):
    log = _Log()
    start = time.monotonic()
    assert launch.run_job(_job(SLEEP, SLEEP, SLEEP, code), log=log) == code_seen
    assert time.monotonic() - start < 30
    pids = _pids(log.text)
    assert log.text.splitlines()[-1] == ('launch: worker 1 (pid %d) %s; stopped the 3 other '
                                         'processes of the job' % (pids['worker 1'], how))
    assert all(_gone(pid) for pid in pids.values())


def test_servers_left_running_after_the_workers_are_stopped_after_the_grace():
    log = _Log()
    assert launch.run_job(_job(SLEEP, SLEEP, 'pass', 'pass'), grace=1, log=log) == 0
    assert log.text.splitlines()[-1] == ('launch: the workers finished but scheduler, server 0 '
                                         'still ran 1 s later; stopped them')
    assert all(_gone(pid) for pid in _pids(log.text).values())


def test_a_worker_left_running_after_another_ended_fails_the_job():
    log = _Log()
    assert launch.run_job(_job('pass', 'pass', 'pass', SLEEP), grace=1, log=log) == 1
    assert log.text.splitlines()[-1] == ('launch: scheduler ended normally but worker 1 still '
                                         'ran 1 s later; stopped them')


# --- real jobs on loopback --------------------------------------------------------------------

def _launch(*args, timeout=300):
    return subprocess.run([PY, '-m', 'gluon_mgpu.launch', *args], capture_output=True,
                          text=True, timeout=timeout, env=_env())


def _max_diff(a, b):
    assert sorted(a) == sorted(b)
    return max(float(nd.abs(a[k] - b[k]).max().asscalar()) for k in a)


@pytest.mark.slow
def test_two_workers_equal_one_process_on_two_devices(tmp_path):
    """dist_sync with 2 workers x 1 device = one process with 2 devices, same global batch.

    LeNet has no BatchNorm, so the gradient of a batch does not depend on where its examples
    were computed. Worker r gets what device r gets (``ArrayBatches.set_part``), the servers
    sum the two workers' gradients and divide by the global batch of 16: the result must
    equal the single process's within 1e-6 (it is bit-identical here).
    """
    flags = ['--train-limit', '64', '--batch-size', '16', '--epochs', '1']
    start = time.monotonic()
    job = _launch('-n', '2', '-s', '1', '--', *TRAIN, *flags, '--kvstore', 'dist_sync',
                  '--save-params', str(tmp_path / 'dist.params'))
    seconds = time.monotonic() - start
    assert job.returncode == 0, job.stderr
    lines = job.stdout.splitlines()
    # Only rank 0 prints; the default lr counts the devices of all workers: 0.1 * 2.
    assert lines[0] == 'running on: [cpu(0)] (worker 0 of 2, kvstore dist_sync)'
    assert len(lines) == 3 and re.fullmatch(r'epoch 1, training time: \d+\.\d sec, '
                                            r'test_acc (0|1)\.\d\d', lines[1])
    assert re.fullmatch(r'test acc: (0|1)\.\d\d, \d+\.\d sec/epoch on \[cpu\(0\)\]', lines[2])
    assert re.match(r'launch: started scheduler \(pid \d+\), server 0 \(pid \d+\), '
                    r'worker 0 \(pid \d+\), worker 1 \(pid \d+\)', job.stderr)
    rank0 = nd.load(str(tmp_path / 'dist.rank0.params'))
    rank1 = nd.load(str(tmp_path / 'dist.rank1.params'))
    assert len(rank0) == 10 and _max_diff(rank0, rank1) == 0.0

    for name, lr in (('single.params', []), ('double-lr.params', ['--lr', '0.4'])):
        single = subprocess.run(TRAIN + flags + ['--num-gpus', '2', '--save-params',
                                                 str(tmp_path / name)] + lr,
                                capture_output=True, text=True, timeout=300, env=_env())
        assert single.returncode == 0, single.stderr
    assert _max_diff(rank0, nd.load(str(tmp_path / 'single.params'))) <= 1e-6
    # Guard: dividing by each worker's own batch (8) would act like twice the learning rate,
    # and that is far outside the tolerance.
    assert _max_diff(rank0, nd.load(str(tmp_path / 'double-lr.params'))) > 1e-3
    assert seconds < 300


@pytest.mark.slow
def test_dist_device_sync_with_two_devices_per_worker_equals_one_process_on_four(tmp_path):
    """dist_device_sync sums each worker's devices on the devices, then over the servers.

    2 workers x 2 CPU devices with a global batch of 16 must give the parameters of one
    process on 4 devices (LeNet, no BatchNorm; same tolerance as above).
    """
    flags = ['--train-limit', '64', '--batch-size', '16', '--epochs', '1', '--num-gpus', '2']
    job = _launch('-n', '2', '-s', '1', '--', *TRAIN, *flags, '--kvstore', 'dist_device_sync',
                  '--save-params', str(tmp_path / 'dist.params'))
    assert job.returncode == 0, job.stderr
    assert job.stdout.splitlines()[0] == ('running on: [cpu(0), cpu(1)] (worker 0 of 2, '
                                          'kvstore dist_device_sync)')
    rank0 = nd.load(str(tmp_path / 'dist.rank0.params'))
    assert _max_diff(rank0, nd.load(str(tmp_path / 'dist.rank1.params'))) == 0.0
    single = subprocess.run(TRAIN + flags[:-1] + ['4', '--save-params',
                                                  str(tmp_path / 'single.params')],
                            capture_output=True, text=True, timeout=300, env=_env())
    assert single.returncode == 0, single.stderr
    assert _max_diff(rank0, nd.load(str(tmp_path / 'single.params'))) <= 1e-6


def _reader(stream, lines):
    for line in stream:
        lines.put(line)


@pytest.mark.slow
def test_killing_a_worker_ends_the_job_within_the_bound():
    job = subprocess.Popen([PY, '-m', 'gluon_mgpu.launch', '-n', '2', '-s', '1', '--', *TRAIN,
                            '--kvstore', 'dist_sync', '--train-limit', '2000', '--batch-size',
                            '16', '--epochs', '100'],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    out, err = queue.Queue(), queue.Queue()
    for stream, q in ((job.stdout, out), (job.stderr, err)):
        threading.Thread(target=_reader, args=(stream, q), daemon=True).start()
    try:
        started = err.get(timeout=120)
        pids = _pids(started)
        assert sorted(pids) == ['scheduler', 'server 0', 'worker 0', 'worker 1'], started
        while not out.get(timeout=300).startswith('epoch 1,'):
            pass  # training is under way: both workers have joined and stepped together
        os.kill(pids['worker 1'], signal.SIGKILL)
        start = time.monotonic()
        code = job.wait(timeout=120)
        seconds = time.monotonic() - start
    finally:
        if job.poll() is None:
            job.kill()
    assert code == 1
    # The launcher stops the others with SIGTERM, then SIGKILL after 5 s.
    assert seconds < 30
    time.sleep(0.5)
    rest = []
    while not err.empty():
        rest.append(err.get())
    assert 'launch: worker 1 (pid %d) was killed by SIGKILL; stopped the 3 other processes ' \
           'of the job\n' % pids['worker 1'] in rest, rest
    assert all(_gone(pid) for pid in pids.values())


def test_a_worker_refusing_its_arguments_stops_the_job():
    start = time.monotonic()
    job = _launch('-n', '2', '-s', '1', '--', *TRAIN, '--kvstore', 'dist_sync',
                  '--batch-size', '15', timeout=120)
    assert job.returncode == 2
    assert time.monotonic() - start < 120
    assert ('python -m gluon_mgpu.train: error: --batch-size 15 cannot be shared by 2 workers '
            'with 1 device(s) each (every worker takes an equal share, at least one example '
            'per device); pass --batch-size 14\n') in job.stderr
    assert re.search(r'launch: worker [01] \(pid \d+\) exited with code 2; stopped the [23] '
                     r'other processes of the job', job.stderr), job.stderr


def test_a_workers_save_params_path_is_checked_before_training(tmp_path):
    # Dist jobs keep no checkpoints: a worker's .rank<r> file found unwritable only after the
    # last epoch would lose the whole run.
    (tmp_path / 'dist.rank1.params').mkdir()
    job = _launch('-n', '2', '-s', '1', '--', *TRAIN, '--kvstore', 'dist_sync', '--epochs',
                  '50', '--save-params', str(tmp_path / 'dist.params'), timeout=120)
    assert job.returncode == 2, job.stderr
    assert ('python -m gluon_mgpu.train: error: --save-params %s: worker 1 saves to %s: it is a '
            'folder; name a file in it\n' % (tmp_path / 'dist.params',
                                              tmp_path / 'dist.rank1.params')) in job.stderr
    assert 'epoch 1,' not in job.stdout
    assert sorted(os.listdir(tmp_path)) == ['dist.rank1.params']


FAIL_ON_RANK_1 = '''
import sys
from gluon_mgpu.assembly import runs
from gluon_mgpu.commands import train
from gluon_mgpu.runtime import files
joined = runs._data_parallel


def data_parallel(args, rank, *rest):
    if rank == 1:  # after the job was joined, before the first step
        raise files.OutputError('here', 'cannot write here (No space left on device)', 28)
    return joined(args, rank, *rest)


runs._data_parallel = data_parallel
sys.exit(train.main(sys.argv[1:]))
'''


def test_a_worker_failing_after_it_joined_ends_the_job_at_once(tmp_path):
    # Freeing the failed worker's kvstore would wait at MXNet's barrier for the other worker,
    # itself waiting for this one's first step: the job hung until the launcher was killed.
    script = tmp_path / 'fail_on_rank_1.py'
    script.write_text(FAIL_ON_RANK_1)
    start = time.monotonic()
    job = _launch('-n', '2', '-s', '1', '--', PY, str(script), *TRAIN[3:], '--kvstore',
                  'dist_sync', '--train-limit', '2048', '--batch-size', '16', '--epochs', '50',
                  timeout=120)
    assert job.returncode == 1, job.stderr
    assert time.monotonic() - start < 60
    assert ('python -m gluon_mgpu.train: error: cannot write here (No space left on device); '
            'nothing was saved (pass --checkpoint-dir DIR to keep every finished epoch)\n'
            in job.stderr), job.stderr
    assert re.search(r'launch: worker [01] \(pid \d+\) exited with code 1; stopped the 3 '
                     r'other processes of the job', job.stderr), job.stderr


SHARD_CHECK = '''
import json
import os
import numpy as np
import mxnet as mx
from gluon_mgpu import data
from gluon_mgpu.parallel import dist
kv = mx.kv.create("dist_sync")
seed = dist.shared_run(kv, {})
batches = data.ArrayBatches(np.zeros((70, 28, 28), np.uint8), np.arange(70), 16, shuffle=True,
                            seed=seed, num_parts=kv.num_workers, part_index=kv.rank)
line = json.dumps({"rank": kv.rank, "seed": seed, "order": batches.order(0).tolist(),
                   "whole": data.ArrayBatches(np.zeros((70, 28, 28), np.uint8), np.arange(70),
                                              16, shuffle=True, seed=seed).order(0).tolist()})
# Both workers share the launcher's stdout: one write per line (atomic on a pipe below 4 KiB),
# not print's two (text, then newline, when PYTHONUNBUFFERED is set), so lines never interleave.
os.write(1, (line + "\\n").encode())
'''


def test_workers_agree_on_a_seed_and_take_disjoint_shards():
    """Without --seed each worker draws its own; rank 0's wins, so the shards fit together."""
    job = _launch('-n', '2', '-s', '1', '--', PY, '-c', SHARD_CHECK, timeout=120)
    assert job.returncode == 0, job.stderr
    found = sorted((json.loads(line) for line in job.stdout.splitlines()),
                   key=lambda f: f['rank'])
    assert [f['rank'] for f in found] == [0, 1]
    assert found[0]['seed'] == found[1]['seed'] and found[0]['whole'] == found[1]['whole']
    orders = [f['order'] for f in found]
    assert len(orders[0]) == len(orders[1]) == 32 and not set(orders[0]) & set(orders[1])
    assert sorted(orders[0] + orders[1]) == sorted(found[0]['whole'][:64])


def _alive(pid):
    try:
        with open('/proc/%d/status' % pid) as f:
            return 'State:\tZ' not in f.read()  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_launcher_killed_with_sigkill_takes_its_local_processes_along():
    job = subprocess.Popen([PY, '-m', 'gluon_mgpu.launch', '-n', '2', '-s', '1', '--', PY,
                            '-c', 'import time; time.sleep(120)'],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    first = job.stderr.readline()
    pids = [int(p) for p in re.findall(r'\(pid (\d+)\)', first)]
    assert len(pids) == 4, first  # scheduler, server, 2 workers
    assert all(_alive(p) for p in pids)
    job.kill()  # SIGKILL: the launcher cannot stop anything itself
    job.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []


# --- issue 53, family 2: two launchers on one --port at the same moment ------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_a_scheduler_whose_port_is_taken_names_the_port_not_the_installation():
    # What the loser of a race saw: its scheduler's bind failed inside `import mxnet`, and the
    # line blamed the installation.
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(_env(), DMLC_ROLE='scheduler', DMLC_PS_ROOT_URI='127.0.0.1',
                   DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER='1', DMLC_NUM_WORKER='2')
        done = subprocess.run(TRAIN + ['--kvstore', 'dist_sync'], capture_output=True,
                              text=True, timeout=120, env=env)
    assert done.returncode == 2 and done.stdout == ''
    assert done.stderr == (
        'python -m gluon_mgpu.train: error: the scheduler of the dist job cannot listen on '
        '127.0.0.1:%d (DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT): the port is in use, by another '
        'job started at the same moment or another program; pass the launcher another --port, '
        'or leave --port out for a free one\n' % port)


def test_a_second_launcher_on_a_port_another_launcher_holds_is_refused():
    # Stand-in processes never listen, so the port looks free: only the first launcher's hold
    # on it tells the second that its processes would join the first one's job.
    port = _free_port()
    first = subprocess.Popen([PY, '-m', 'gluon_mgpu.launch', '-n', '1', '-s', '1', '--port',
                              str(port), '--', PY, '-c', SLEEP],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_env())
    try:
        assert first.stderr.readline().startswith('launch: started scheduler')
        second = _launch('-n', '1', '-s', '1', '--port', str(port), '--', PY, '-c', 'pass',
                         timeout=60)
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(60)
    assert second.returncode == 2 and second.stdout == ''
    assert second.stderr == (
        'python -m gluon_mgpu.launch: error: --port %d is taken by the job of another launcher '
        'on this machine (pid %d); pass another port, or leave --port out for a free one\n'
        % (port, first.pid))


@pytest.mark.slow
def test_two_launchers_started_at_once_on_one_port_leave_the_first_job_alone(tmp_path):
    """Issue 53: started together, the loser's processes joined the winner's scheduler, which
    aborted (SIGABRT), and the loser's line blamed the MXNet installation."""
    port = _free_port()
    jobs = [subprocess.Popen([PY, '-m', 'gluon_mgpu.launch', '-n', '2', '-s', '1', '--port',
                              str(port), '--', *TRAIN, '--kvstore', 'dist_sync', '--train-limit',
                              '64', '--batch-size', '16', '--epochs', '1', '--save-params',
                              str(tmp_path / ('%d.params' % i))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_env()) for i in range(2)]
    ended = [job.communicate(timeout=300) + (job.returncode,) for job in jobs]
    assert sorted(code for _, _, code in ended) == [0, 2], ended
    _, err, _ = next(e for e in ended if e[2] == 2)
    assert err == ('python -m gluon_mgpu.launch: error: --port %d is taken by the job of '
                   'another launcher on this machine (pid %d); pass another port, or leave '
                   '--port out for a free one\n'
                   % (port, next(job.pid for job, e in zip(jobs, ended) if e[2] == 0)))


# --- issue 53, family 1: a train command that would not join the job ---------------------------

ALONE = ('gluon_mgpu.train without --kvstore dist_sync or dist_device_sync trains by itself: '
         'every worker would run the whole training alone and write the same outputs')


@pytest.mark.parametrize('command,why', [
    (['-m', 'gluon_mgpu.train', '--model', 'lenet'], ALONE + ' (--kvstore device, the default)'),
    (['-m', 'gluon_mgpu.train', '--kvstore', 'device'], ALONE + ' (--kvstore device)'),
    (['-u', '-mgluon_mgpu.train', '--kvstore=local'], ALONE + ' (--kvstore local)'),
    # The last one wins, as in the train command; an abbreviation is read as it reads it.
    (['-m', 'gluon_mgpu.train', '--kvstore', 'dist_sync', '--kvs', 'horovod'],
     ALONE + ' (--kvstore horovod)'),
    (['-m', 'gluon_mgpu.sweep', '--num-gpus', '1'],
     'gluon_mgpu.sweep is not a training that joins the job: every worker would run it alone '
     'and write the same outputs'),
])
def test_a_gluon_mgpu_command_that_would_not_join_the_job_is_refused(command, why):
    args = launch.parse_args(['-n', '2', '-s', '1', '--', PY, *command])
    with pytest.raises(launch.UsageError) as e:
        launch.check_job(args)
    assert str(e.value) == ('cannot run the command after --: %s; for example -- python -m '
                            'gluon_mgpu.train --kvstore dist_sync' % why)


@pytest.mark.parametrize('command', [
    ['-m', 'gluon_mgpu.train', '--kvstore', 'dist_sync'],
    ['-m', 'gluon_mgpu.train', '--kvstore=dist_device_sync', '--num-gpus', '2'],
    ['-m', 'gluon_mgpu.train', '--kvst', 'dist_sync'],
    ['-c', 'import mxnet'],  # not ours: what it does is its own business
])
def test_a_dist_train_or_another_program_is_started(command):
    assert launch.check_job(launch.parse_args(['-n', '2', '-s', '1', '--', PY, *command])) \
        is None


def test_the_issue_53_command_without_dist_sync_is_one_line_and_exit_2(capsys):
    assert launch.main(['-n', '2', '-s', '1', '--', 'python', '-m', 'gluon_mgpu.train',
                        '--num-gpus', '1', '--model', 'lenet']) == 2
    out, err = capsys.readouterr()
    assert out == '' and err == ('python -m gluon_mgpu.launch: error: cannot run the command '
                                 'after --: %s (--kvstore device, the default); for example -- '
                                 'python -m gluon_mgpu.train --kvstore dist_sync\n' % ALONE)


# --- issue 53, family 1: workers started for different runs --------------------------------

# The first worker to start takes the extra flags (as when one machine's script was edited) and
# writes its pid; which rank it gets is the scheduler's choice, so the tests take either.
ONE_DIFFERS = '''
import os
import sys
from gluon_mgpu.commands import train
marker, extra = sys.argv.pop(1), sys.argv.pop(1).split()
try:
    if os.environ['DMLC_ROLE'] == 'worker':
        with open(marker, 'x') as f:
            f.write(str(os.getpid()))
        sys.argv += extra
except FileExistsError:
    pass
sys.exit(train.main())
'''


@pytest.mark.parametrize('extra,flag,mine,other', [
    # unfixed: after the shorter worker's last step every process slept forever (also with
    # another --epochs or --train-limit)
    ('--batch-size 32', '--batch-size', '32', '64'),
    # the other flags the same way, in make test-slow
    pytest.param('--lr 0.2', '--lr', '0.2', '0.1', marks=pytest.mark.slow),  # unfixed: exit 0,
    # trained at two rates
    pytest.param('--seed 1', '--seed', '1', '0', marks=pytest.mark.slow),  # unfixed: exit 0,
    # another run
    pytest.param('--model resnet18', '--model', 'resnet18', 'lenet',
                 marks=pytest.mark.slow),  # unfixed: SIGABRT, no cause given
])
def test_a_worker_started_for_another_run_ends_the_job_naming_the_flag(tmp_path, extra, flag,
                                                                       mine, other):
    job = _launch('-n', '2', '-s', '1', '--', PY, '-c', ONE_DIFFERS, str(tmp_path / 'first'),
                  extra, *TRAIN[3:], '--kvstore', 'dist_sync', '--num-gpus', '1',
                  '--train-limit', '256', '--batch-size', '64', '--lr', '0.1', '--epochs', '2',
                  timeout=120)  # unfixed, a hang: TimeoutExpired
    assert job.returncode == 2, job.stderr
    pids = _pids(job.stderr)
    differs = int((tmp_path / 'first').read_text())
    same = next(pids[w] for w in ('worker 0', 'worker 1') if pids[w] != differs)
    # A worker compares its settings with rank 0's: the one that differs, or the other one.
    said = {'a worker (pid %d on %s) trains with %s %s, rank 0 of the job (pid %d on %s) with '
            '%s %s' % (p, socket.gethostname(), flag, a, q, socket.gethostname(), flag, b): p
            for p, a, q, b in ((differs, mine, same, other), (same, other, differs, mine))}
    errors = [line for line in job.stderr.splitlines() if ': error: ' in line]
    assert len(errors) == 1, job.stderr
    line = errors[0].split(': every worker')[0]
    assert line in ['python -m gluon_mgpu.train: error: ' + k for k in said], job.stderr
    assert errors[0].endswith(': every worker of a job must train the same run; start them all '
                              'with the same flags')
    assert re.search(r'launch: worker [01] \(pid %d\) exited with code 2; stopped the 3 other '
                     r'processes of the job\n\Z' % said[line[len('python -m gluon_mgpu.train: '
                                                               'error: '):]], job.stderr)
    assert 'epoch 1,' not in job.stdout
