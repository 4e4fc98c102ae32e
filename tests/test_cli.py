import os
import re
import subprocess
import sys

import mxnet as mx
import pytest

import gluon_mgpu
from gluon_mgpu import data, devices
from gluon_mgpu.assembly import runs
from gluon_mgpu.commands.train import main, resolve


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, '-m', 'gluon_mgpu.train', *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def test_cli_trains_on_simulated_devices_and_prints_the_books_lines(data_dir):
    result = run_cli('--num-gpus', '2', '--epochs', '2', '--batch-size', '8',
                     '--train-limit', '24', '--test-limit', '20', '--seed', '0',
                     '--data-dir', data_dir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == 'running on: [cpu(0), cpu(1)]'
    assert len(lines) == 4
    for i, line in enumerate(lines[1:3], 1):
        assert re.fullmatch(r'epoch %d, training time: \d+\.\d sec, test_acc (0|1)\.\d\d' % i,
                            line), line
    assert re.fullmatch(r'test acc: (0|1)\.\d\d, \d+\.\d sec/epoch on \[cpu\(0\), cpu\(1\)\]',
                        lines[3]), lines[3]
    assert result.stderr.splitlines() == [
        "warning: no GPU found, so [cpu(0), cpu(1)] are simulated devices sharing this "
        "machine's CPU: the data parallelism is real, a speed-up is not expected"]


def test_cli_bad_input_is_one_line_and_exit_2():
    result = run_cli('--num-gpus', 'two')
    assert result.returncode == 2
    assert result.stdout == ''
    assert result.stderr.splitlines() == [
        "python -m gluon_mgpu.train: error: argument --num-gpus: --num-gpus expects a whole "
        "number, got 'two'; for example --num-gpus 2 (see --help)"]


def test_defaults_follow_the_book_per_device():
    one, two = resolve([]), resolve(['--num-gpus', '2'])
    assert (one.num_gpus, one.batch_size, one.lr, one.epochs, one.device) == (1, 256, 0.1, 4,
                                                                              'auto')
    assert (two.batch_size, two.lr) == (512, 0.2)
    explicit = resolve(['--num-gpus', '2', '--batch-size', '32', '--lr', '0.05'])
    assert (explicit.batch_size, explicit.lr) == (32, 0.05)


def test_fewer_gpus_than_asked_names_both_numbers(monkeypatch, capsys):
    monkeypatch.setattr(devices, 'num_gpus', lambda: 1)
    assert main(['--num-gpus', '3']) == 2
    assert capsys.readouterr().err == (
        "python -m gluon_mgpu.train: error: --num-gpus 3 --device auto: asked for 3 GPUs but "
        "1 GPU found; pass --num-gpus 1 (num_gpus=1), or use CPU contexts with --device cpu "
        "(device='cpu')\n")


def test_missing_data_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv('MXNET_HOME', str(tmp_path))
    monkeypatch.setattr(data, 'SYSTEM_DIR', str(tmp_path / 'none'))
    assert main(['--device', 'cpu']) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert 'Fashion-MNIST not found: searched' in err
    assert 'apt-get install dataset-fashion-mnist' in err


def test_broken_data_file_is_named(capsys, tmp_path, data_dir):
    for name in data.FILES['train'] + data.FILES['test']:
        os.symlink(os.path.join(data_dir, name), tmp_path / name)
    os.remove(tmp_path / 'train-images-idx3-ubyte.gz')
    (tmp_path / 'train-images-idx3-ubyte.gz').write_bytes(b'broken')
    assert main(['--device', 'cpu', '--data-dir', str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == ('python -m gluon_mgpu.train: error: --data-dir %s: %s is not a complete gzip '
                   "file (Not a gzipped file (b'br')); replace it with a fresh copy\n"
                   % (tmp_path, tmp_path / 'train-images-idx3-ubyte.gz'))


def test_package_train_stays_the_function_after_importing_the_cli():
    # The command's code lives in gluon_mgpu.commands.train; the entry file gluon_mgpu/train.py
    # is only run by python -m, so nothing imports it and the function keeps its name.
    from gluon_mgpu import training
    from gluon_mgpu.commands import train as command
    assert gluon_mgpu.train is training.train and command.main is main
    assert 'gluon_mgpu.train' not in sys.modules


JOB = {'DMLC_ROLE': 'worker', 'DMLC_PS_ROOT_URI': '127.0.0.1', 'DMLC_PS_ROOT_PORT': '9',
       'DMLC_NUM_SERVER': '1', 'DMLC_NUM_WORKER': '2'}


def test_dist_defaults_count_the_devices_of_all_workers(monkeypatch):
    for name, value in JOB.items():
        monkeypatch.setenv(name, value)
    args = resolve(['--kvstore', 'dist_sync', '--num-gpus', '2'])
    assert (args.num_workers, args.batch_size, args.lr) == (2, 1024, pytest.approx(0.4))
    assert resolve([]).kvstore == 'device'


@pytest.mark.parametrize('argv,expected', [
    (['--batch-size', '15'], r'--batch-size 15 cannot be shared by 2 workers with 1 device\(s\) '
                             r'each .*; pass --batch-size 14$'),
    (['--batch-size', '2', '--num-gpus', '2'], r'--batch-size 2 cannot be shared by 2 workers '
                                               r'with 2 device\(s\) each .*; pass --batch-size 4$'),
    (['--batch-size', '16', '--train-limit', '8'],
     r'--kvstore dist_sync: 8 examples are fewer than one global batch of 16; use more examples '
     r'or a smaller batch size \(--train-limit 8, --batch-size 16\)$'),
])
def test_dist_worker_checks_before_joining(argv, expected, monkeypatch, capsys, data_dir):
    # Refused before mx.kv.create: nothing here would answer a real join.
    for name, value in JOB.items():
        monkeypatch.setenv(name, value)
    assert main(['--kvstore', 'dist_sync', '--device', 'cpu', '--data-dir', data_dir] + argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and re.search(expected, err.strip()), err


def test_device_weights_line_and_saved_parameters(tmp_path, data_dir):
    result = run_cli('--num-gpus', '2', '--device', 'cpu', '--model', 'lenet', '--epochs', '1',
                     '--batch-size', '16', '--train-limit', '32', '--test-limit', '8',
                     '--seed', '0', '--device-weights', '3,1', '--save-params',
                     str(tmp_path / 'net.params'), '--data-dir', data_dir,
                     env={'OMP_NUM_THREADS': '1'})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ['running on: [cpu(0), cpu(1)]',
                         'device weights: cpu(0) 3, cpu(1) 1 -> slices of 12, 4 per batch of 16']
    assert len(lines) == 4 and lines[2].startswith('epoch 1, training time: ')
    assert lines[3].startswith('test acc: ')
    saved = mx.nd.load(str(tmp_path / 'net.params'))
    assert len(saved) == 10 and saved['6.bias'].shape == (10,)
    gluon_mgpu.model.lenet().load_parameters(str(tmp_path / 'net.params'))


def test_balance_auto_measures_and_prints_the_split(capsys, data_dir):
    assert main(['--num-gpus', '2', '--device', 'cpu', '--model', 'lenet', '--epochs', '1',
                 '--batch-size', '16', '--train-limit', '16', '--test-limit', '8',
                 '--balance', 'auto', '--data-dir', data_dir]) == 0
    lines = capsys.readouterr().out.splitlines()
    match = re.fullmatch(r'device weights: cpu\(0\) (\d+\.\d), cpu\(1\) (\d+\.\d) images/s '
                         r'\(measured\) -> slices of (\d+), (\d+) per batch of 16', lines[1])
    assert match, lines
    speeds = [float(match.group(1)), float(match.group(2))]
    assert [int(match.group(3)), int(match.group(4))] == \
        gluon_mgpu.parallel.weighted.slice_sizes(16, speeds)


# Output that cannot be written (hostile input, round four): cli.run_command.

class _Unwritable:
    """A stdout whose writes fail as a closed pipe's or a full disk's do, once buffered."""

    def __init__(self, code):
        self.code, self.buffered = code, ''

    def write(self, text):
        self.buffered += text
        if len(self.buffered) > 64:
            self.flush()
        return len(text)

    def flush(self):
        if self.buffered:
            raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize('body', [
    lambda: print('epoch 1'),                                  # failing at the final flush
    lambda: [print('x' * 10) for _ in range(20)],              # failing within the body
    lambda: (print('usage: ...'), sys.exit(0)),                # argparse's --help
])
def test_a_closed_pipe_on_stdout_ends_quietly_with_141(body, monkeypatch, capsys):
    import errno
    from gluon_mgpu.commands import cli
    monkeypatch.setattr(sys, 'stdout', _Unwritable(errno.EPIPE))
    assert cli.run_command('python -m gluon_mgpu.x', [], body) == 141
    assert capsys.readouterr().err == ''


def test_a_full_disk_on_stdout_is_one_line_naming_stdout(monkeypatch, capsys):
    import errno
    from gluon_mgpu.commands import cli
    monkeypatch.setattr(sys, 'stdout', _Unwritable(errno.ENOSPC))
    assert cli.run_command('python -m gluon_mgpu.x', [], lambda: print('line')) == 1
    assert capsys.readouterr().err == (
        'python -m gluon_mgpu.x: error: cannot write to stdout (No space left on device); free '
        'some space on that disk or write somewhere else\n')


def test_what_a_failure_prints_on_a_closed_stdout_ends_quietly_too(monkeypatch, capsys):
    import errno
    from gluon_mgpu.commands import cli
    monkeypatch.setattr(sys, 'stdout', _Unwritable(errno.EPIPE))

    def body():
        raise cli.UsageError('bad')

    def story(e):
        def saved(e, why):
            print('the finished rows')  # as the sweep's story does
            return ''
        return {'saved': saved}
    assert cli.run_command('python -m gluon_mgpu.x', [], body, story) == 141
    assert capsys.readouterr().err == ''


def test_a_broken_pipe_elsewhere_is_still_an_unexpected_error(capsys):
    from gluon_mgpu.commands import cli

    def body():
        raise BrokenPipeError(32, 'Broken pipe')  # a socket of its own, not stdout
    assert cli.run_command('python -m gluon_mgpu.x', [], body) == 1
    assert capsys.readouterr().err.startswith(
        'python -m gluon_mgpu.x: error: unexpected BrokenPipeError: [Errno 32] Broken pipe')


def test_each_list_of_choices_is_defined_once_for_the_parsers_and_the_library():
    # The entry files parse their flags before MXNet is imported: runtime/choices.py, which
    # imports nothing, holds each list; the parsers offer it and the library takes it from there.
    import ast
    import glob
    import os
    from gluon_mgpu import training
    from gluon_mgpu.commands import cli, sweep, train
    from gluon_mgpu.handlers import plotting
    from gluon_mgpu.parallel import dist, options
    from gluon_mgpu.runtime import choices, precision
    source = open(choices.__file__).read()
    assert not [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import,
                                                                         ast.ImportFrom))]
    offered = {a.dest: tuple(a.choices) for a in train.build_parser()._actions if a.choices}
    assert {k: offered[k] for k in ('model', 'kvstore', 'loader', 'parallel', 'device',
                                    'dtype')} == {
        'model': choices.MODELS, 'kvstore': choices.KVSTORES, 'loader': choices.LOADERS,
        'parallel': choices.METHODS, 'device': choices.DEVICES, 'dtype': choices.DTYPES}
    offered = {a.dest: tuple(a.choices) for a in sweep.build_parser()._actions if a.choices}
    assert offered['device'] == choices.DEVICES and offered['dtype'] == choices.DTYPES
    assert training.MODELS is choices.MODELS and options.METHODS is choices.METHODS
    assert dist.DIST_KVSTORES is choices.DIST_KVSTORES and precision.DTYPES is choices.DTYPES
    assert devices.DEVICE_CHOICES is choices.DEVICES
    assert tuple(data.LOADERS) == choices.LOADERS
    # No second spelling of a list anywhere in the package: no tuple, list or set of the same
    # names in any order (a JSON schema's enum included), outside runtime/choices.py.
    package = os.path.dirname(gluon_mgpu.__file__)
    lists = {frozenset(v) for v in (choices.MODELS, choices.DTYPES, choices.DEVICES,
                                    choices.LOADERS, choices.METHODS, choices.DIST_KVSTORES,
                                    choices.KVSTORES)}
    spelled = []
    for path in glob.glob(os.path.join(package, '**', '*.py'), recursive=True):
        for n in ast.walk(ast.parse(open(path).read())):
            if isinstance(n, (ast.Tuple, ast.List, ast.Set)) and len(n.elts) > 1 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts):
                if frozenset(e.value for e in n.elts) in lists:
                    spelled.append((os.path.relpath(path, package), n.lineno))
    assert spelled == [('runtime/choices.py', n) for n in (8, 9, 10, 11, 12, 13)], spelled
    assert train.PLOT_SUFFIXES == plotting.PLOT_SUFFIXES
    assert cli.BOOK_PER_DEVICE == (training.BATCH_SIZE_PER_DEVICE, training.LR_PER_DEVICE)


def test_the_command_line_pages_synopsis_lists_every_flag_of_the_train_command():
    from gluon_mgpu.commands import train
    page = open(os.path.join(os.path.dirname(__file__), '..', 'docs', 'command-line.md')).read()
    block = page.split('```', 2)[1]
    synopsis = block.split('python -m gluon_mgpu.sweep', 1)[0]
    shown = set(re.findall(r'(--[a-z][a-z0-9-]*)', synopsis))
    flags = {o for a in train.build_parser()._actions for o in a.option_strings
             if o.startswith('--')} - {'--help'}
    assert shown == flags, (sorted(flags - shown), sorted(shown - flags))


def test_replica_bytes_are_the_networks_parameters_and_gradients():
    from gluon_mgpu import training
    for model in ('resnet18', 'lenet'):
        net = training.new_network(model, hybridize=False)
        net.initialize(ctx=mx.cpu())
        net(mx.nd.zeros((1, 1, 28, 28)))
        params = list(net.collect_params().values())
        count = sum(p.data().size for p in params) + sum(
            p.data().size for p in params if p.grad_req != 'null')
        assert runs.REPLICA_BYTES[model] == 4 * count, model


def test_replicas_that_do_not_fit_in_memory_are_refused(monkeypatch):
    from gluon_mgpu.commands import cli
    from gluon_mgpu.runtime import threads
    monkeypatch.setattr(threads, 'memory_bytes', lambda: 1 << 30)  # 1 GiB: 12 replicas
    cpus = [mx.cpu(i) for i in range(13)]
    with pytest.raises(cli.UsageError) as e:
        runs.check_memory(cpus, 'resnet18', '--num-gpus 13 --device cpu')
    assert str(e.value) == ("--num-gpus 13 --device cpu: 13 simulated devices would each hold a "
                            "replica of resnet18 with its gradients (85.3 MiB), 1.1 GiB in all, "
                            "more than this machine's 1.0 GiB of memory; pass --num-gpus 12 or "
                            "fewer")
    assert runs.check_memory(cpus[:12], 'resnet18', '') is None
    assert runs.check_memory(cpus, 'lenet', '') is None
    assert runs.check_memory(cpus, None, '') is None  # a split network holds no replicas
    assert runs.check_memory([mx.gpu(i) for i in range(13)], 'resnet18', '') is None
    monkeypatch.setattr(threads, 'memory_bytes', lambda: None)
    assert runs.check_memory(cpus, 'resnet18', '') is None


def test_one_table_words_every_commands_failures_and_the_command_adds_what_it_kept():
    from gluon_mgpu.commands import cli
    from gluon_mgpu.runtime.startup import Interrupted
    kept = []

    def saved(e, why):
        kept.append(why)
        return '' if why is None else '; kept after %s' % why
    story = {'saved': saved, 'where': ' in the 2-device setting', 'lr': ('--lr', 0.2),
             'batch': ('--batch-size', 512), 'devices': (2, 2)}
    assert cli.failure('p', cli.UsageError('--x 1: bad'), **story) == (2, 'p: error: --x 1: bad')
    assert cli.failure('p', Interrupted(15), **story) == (
        143, 'p: terminated (SIGTERM) in the 2-device setting; kept after terminated (SIGTERM)')
    assert cli.failure('p', MemoryError(), **story) == (1, (
        'p: error: out of memory (MemoryError) in the 2-device setting with --batch-size 512 '
        'over 2 device(s); each simulated device holds a replica of the network: pass fewer '
        'devices, for example --num-gpus 1, or a smaller --batch-size, for example '
        '--batch-size 256; kept after out of memory'))
    code, line = cli.failure('p', ValueError('odd'), **story)
    assert (code, line.partition('; rerun')[0]) == (
        1, 'p: error: unexpected ValueError: odd (in the 2-device setting); kept after '
           'unexpected ValueError')
    assert kept == [None, 'terminated (SIGTERM)', 'out of memory', 'unexpected ValueError']
    # Without a story: the defaults every command had.
    assert cli.failure('p', KeyboardInterrupt()) == (130, 'p: interrupted (Ctrl-C)')


def test_a_resolved_run_is_read_only():
    args = resolve(['--num-gpus', '2'])
    with pytest.raises(AttributeError, match=r'^Run\.seed: a run is resolved once \(resolve\) and '
                                             r'read-only$'):
        args.seed = 1
    with pytest.raises(AttributeError, match=r'^Run\.lr: '):
        del args.lr
    assert (args.seed, args.lr, args.batch_size) == (None, 0.2, 512)


def test_parsing_writes_nothing_the_resolved_outputs_are_checked_once(monkeypatch, tmp_path):
    # The parser's types are pure: whether an output can be written (files.output_problem
    # makes and removes a file to find out) is checked once the run is resolved.
    from gluon_mgpu.commands import train
    from gluon_mgpu.runtime import files
    checked = []
    monkeypatch.setattr(files, 'output_problem', lambda path: checked.append(path))
    argv = ['--metrics-json', str(tmp_path / 'm.json'), '--plot', str(tmp_path / 'c.svg'),
            '--save-params', str(tmp_path / 'n.params')]
    train.build_parser().parse_args(argv)
    assert checked == []
    resolve(argv)
    assert checked == [str(tmp_path / n) for n in ('m.json', 'c.svg', 'c.png', 'n.params')]


def test_a_failure_a_command_words_itself_is_its_line_and_exit_1(capsys):
    # A script beside the package (lab/, tools/) raises CommandError for what only it knows
    # how to word; the one table prints it and exits 1, with the story's clause after it.
    from gluon_mgpu import CommandError, run_command

    def body():
        raise CommandError('the kernel died (it was killed)')
    story = {'saved': lambda e, why: '; 2 epochs are saved' if why == 'an error' else ''}
    assert run_command('tools/x.py', [], body, lambda e: story) == 1
    assert capsys.readouterr().err == (
        'tools/x.py: error: the kernel died (it was killed); 2 epochs are saved\n')
