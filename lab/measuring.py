"""What a benchmark measurement knows about its own interval: wall time, its CPU time, the rest
of the machine's load, and whether that load disturbed it. Shared by every benchmark here.

The machine may be shared, and a measurement can lose one of its cores at any moment. So every
timed interval records, next to its wall-clock time, the CPU time of this process and of its
children (the DataLoader's workers, torch.compile's) and the CPU time the rest of the machine
used over the same interval, from /proc/stat (including the time the hypervisor gave to other
machines, "steal"). An interval in which the others kept more than ``DISTURBED_CORES`` cores
busy on average is *disturbed*: the benchmarks repeat it or mark it.
"""
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

# Others' average load, in cores, above which a measurement counts as disturbed. Quiet, this
# machine shows 0.00 to 0.05 (the shell, the tools); a second job shows as 0.5 to 1.
DISTURBED_CORES = 0.2


def machine_busy():
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat.

    Busy is everything but idle and iowait, steal included (another virtual machine ran on
    our core). Guest time is left out: the kernel already counts it as user time.
    """
    with open('/proc/stat') as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    tick = os.sysconf('SC_CLK_TCK')
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


def _descendants_cpu():
    """CPU seconds of this process's live descendants (from /proc/<pid>/stat)."""
    parents, times = {}, {}
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % name) as f:
                rest = f.read().rsplit(')', 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        # After the name: state, ppid, ... utime and stime are fields 14 and 15 of the line.
        parents[int(name)] = int(rest[1])
        times[int(name)] = int(rest[11]) + int(rest[12])
    mine, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - mine
        mine |= frontier
    return sum(times[p] for p in mine) / os.sysconf('SC_CLK_TCK')


def own_cpu():
    """CPU seconds of this process, its finished children and its live ones."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total + _descendants_cpu()


class Interval:
    """One timed interval: ``start()``, the work, ``stop()``; then ``record`` says how it went.

    ``record``: ``wall`` (s), ``cpu`` (s, this process and its children), ``cpu_per_wall``
    (cores this process used on average), ``others_cores`` (cores the rest of the machine kept
    busy on average) and ``disturbed`` (``others_cores > DISTURBED_CORES``).
    """

    def __init__(self):
        self.record = None
        self._start = None

    def start(self):
        self._start = (machine_busy()[0], own_cpu(), time.perf_counter())
        return self

    def stop(self):
        if self._start is None:
            raise RuntimeError('Interval.stop() before start()')
        wall = time.perf_counter() - self._start[2]
        cpu = own_cpu() - self._start[1]
        busy = machine_busy()[0] - self._start[0]
        # /proc/stat counts in ticks (10 ms): over an interval under a second or so the
        # others' share is coarse, so it is kept within what the machine can hold.
        others = min(max(0.0, busy - cpu) / wall, float(os.cpu_count()))
        self.record = {'wall': wall, 'cpu': cpu, 'cpu_per_wall': cpu / wall,
                       'others_cores': others, 'disturbed': others > DISTURBED_CORES}
        return self.record


def summarize(records, key='value'):
    """Median, spread and best of ``records``' ``key``, over the undisturbed ones if any.

    Returns a dict: ``median``, ``low``, ``high``, ``best`` (= ``high``: a faster run is never
    an accident of load), ``n`` (records used), ``disturbed`` (records marked), ``all_disturbed``
    (no quiet record: the figures come from disturbed ones), and the medians of ``cpu_per_wall``
    and ``others_cores`` over the same records.
    """
    quiet = [r for r in records if not r.get('disturbed')]
    used = quiet or list(records)
    values = [r[key] for r in used]

    def med(name):
        known = [r[name] for r in used if name in r]
        return statistics.median(known) if known else float('nan')
    return {'median': statistics.median(values), 'low': min(values), 'high': max(values),
            'best': max(values), 'n': len(used), 'disturbed': len(records) - len(quiet),
            'all_disturbed': not quiet, 'cpu_per_wall': med('cpu_per_wall'),
            'others_cores': med('others_cores')}


TABLE_HEADER = ['| setting | median | spread (n) | best | %s | CPU/wall | others | raw |',
                '| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |']
TABLE_LEGEND = (
    '"median" and its spread (lowest to highest) are over the undisturbed runs (over all runs, '
    'and the row says so, when none was undisturbed); "best" is the highest of them. CPU/wall: '
    'the cores the measured process (with its children) used on average, median; others: the '
    'cores the rest of the machine kept busy meanwhile, median. Raw: every run, its others\' '
    'load in parentheses, * = disturbed (others above %.1f cores).' % DISTURBED_CORES)


def raw_values(records, scale=1.0):
    """Every run's value with the others' load in parentheses; * marks a disturbed one."""
    return ', '.join('%.1f%s (%.2f)' % (r['value'] / scale, '*' if r['disturbed'] else '',
                                        r['others_cores']) for r in records)


def table_row(label, records, base=None):
    """One markdown row under ``TABLE_HEADER``: ``records``' summary; ratio of medians to
    ``base`` (a median) when given."""
    s = summarize(records)
    return '| %s%s | %.1f | %.1f-%.1f (%d) | %.1f | %s | %.2f | %.2f | %s |' % (
        label, ' (**all disturbed**)' if s['all_disturbed'] else '', s['median'], s['low'],
        s['high'], s['n'], s['best'], '%.2f' % (s['median'] / base) if base else '',
        s['cpu_per_wall'], s['others_cores'], raw_values(records))


def _cpuinfo(name):
    """The value of the field ``name`` in ``/proc/cpuinfo`` (its first processor's), or None
    where the file holds no such field or cannot be read."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model():
    """The processor's name (``/proc/cpuinfo``'s model name), or ``platform.processor()``."""
    name = _cpuinfo('model name')
    return (platform.processor() or 'unknown') if name is None else name


# The CPU features oneDNN picks its float32 and bfloat16 kernels by, oldest first.
KERNEL_FLAGS = ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16')


def kernel_setting(environ=None):
    """What, beyond the code and the seed, a float32 result on this CPU depends on
    (docs/book-comparison.md measured both): the instructions oneDNN may use and its threads.

    Returns ``{'cpu_flags': [...], 'dnnl_max_cpu_isa': str or None, 'threads': int or None}``:
    which of ``KERNEL_FLAGS`` ``/proc/cpuinfo`` lists (``[]`` where it cannot be read), and from
    ``environ`` (default ``os.environ``), which a child process inherits, the cap
    ``DNNL_MAX_CPU_ISA`` (MXNet 1.9.1's oneDNN obeys it) and ``OMP_NUM_THREADS`` (the package
    sets it on import).
    """
    environ = os.environ if environ is None else environ
    flags = set((_cpuinfo('flags') or '').split())
    try:
        threads = int(environ.get('OMP_NUM_THREADS', ''))
    except ValueError:  # unset or not a number ('²' is a digit to str.isdigit, not to int)
        threads = None
    return {'cpu_flags': [flag for flag in KERNEL_FLAGS if flag in flags],
            'dnnl_max_cpu_isa': environ.get('DNNL_MAX_CPU_ISA') or None, 'threads': threads}


def cpu_id():
    """'cpu family F, model M, stepping S' from /proc/cpuinfo (AMD family 25 model 17: Zen 4)."""
    found = [(key, _cpuinfo(key)) for key in ('cpu family', 'model', 'stepping')]
    return ', '.join('%s %s' % (key, value) for key, value in found if value is not None)


# cpu_id's family and model -> the core generation, for the processors these pages were
# measured on (a virtual machine's model name is often only "AMD EPYC").
CPU_GENERATIONS = {'cpu family 25, model 1': 'AMD Zen 3 (EPYC 7003, Milan)',
                   'cpu family 25, model 17': 'AMD Zen 4 (EPYC 9004, Genoa)'}


def cpu_generation(ident):
    """The generation ``CPU_GENERATIONS`` names for a ``cpu_id()`` string, or None."""
    return CPU_GENERATIONS.get(ident.rsplit(', stepping', 1)[0])


# cpu_id's family (and model) -> float32 FLOP per cycle and core: two fused multiply-add pipes
# of 8 lanes (Zen 3, and Zen 4, which runs an AVX-512 instruction as two 256-bit halves) or of
# 16 (Zen 5), 2 FLOP each (AMD's Software Optimization Guides for families 19h and 1Ah).
FP32_FLOP_PER_CYCLE = {'cpu family 25, model 1': 32, 'cpu family 25, model 17': 32,
                       'cpu family 26': 64}
# One core's clock while it works: 200 dependent additions per pass, one per cycle.
CLOCK_C = r'''#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
                          return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) { unsigned long x = 0; double start = now();
  for (long i = 0; i < 20000000; i++) __asm__ volatile(ADDS : "+r"(x));
  printf("%.4f\n", 20000000 * 200.0 / (now() - start) / 1e9); return (int)(x & 1); }
'''.replace('ADDS', '"' + 'add $1, %0\\n\\t' * 200 + '"')


def core_clock(repeats=9):
    """The highest GHz of ``repeats`` runs of ``CLOCK_C`` (compiled with cc, timed by the
    thread's CPU time; time a hypervisor takes from the core only lowers a run's figure, and the
    clock moves by some percent from run to run), or None without cc."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        binary = os.path.join(folder, 'clock')
        try:
            subprocess.run(['cc', '-O1', '-x', 'c', '-o', binary, '-'], input=CLOCK_C, text=True,
                           check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        return max(float(subprocess.run([binary], capture_output=True, text=True,
                                        timeout=60).stdout) for _ in range(repeats))


ISA_PROBE = r'''
import gluon_mgpu, mxnet as mx
x = mx.nd.ones((1, 3, 8, 8)); w = mx.nd.ones((4, 3, 3, 3))
mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=4, no_bias=True).wait_to_read()
'''


def onednn_isa(env, cwd):
    """The instruction set MXNet's oneDNN says it uses (its verbose 'isa' line) in a process
    with environment ``env`` (where ``DNNL_MAX_CPU_ISA`` caps it), run in ``cwd``; or None."""
    env = dict(env, DNNL_VERBOSE='1')
    out = subprocess.run([sys.executable, '-c', ISA_PROBE], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=300).stdout
    found = re.search(r'isa:([^\n]*)', out)
    return found.group(1).strip() if found else None
