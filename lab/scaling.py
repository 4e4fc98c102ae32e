"""How a step's cost grows with devices and with workers. Writes docs/scaling.md.

    .venv/bin/python lab/scaling.py                 # about 8 minutes on 2 quiet cores
    .venv/bin/python lab/scaling.py --part workers  # the dist_sync jobs only (~1 min)
    .venv/bin/python lab/scaling.py --part jobs     # dist_sync and Horovod, interleaved
    .venv/bin/python lab/scaling.py --quick --out /tmp/scaling.md   # a smoke run
    .venv/bin/python lab/scaling.py --report-only   # from docs/records/scaling.json

Two tables. Every row is measured in fresh processes, the rows interleaved and repeated:

- ``devices``: the chapter's ResNet-18, hybridized, data parallel over 1, 2, 4 and 8
  simulated devices (``mx.cpu(0)`` ... ``mx.cpu(7)``) at a fixed global batch of 256, one
  process each (lab/worker.py, kind "phases"). First the images/s of the package's step
  as ``train()`` runs it (``train_epoch``: on CPU devices each device's calls from its own
  thread) without waits; then, in the same process, the step's phases with
  ``nd.waitall()`` after each: the split and the copies (the two halves of
  ``split_and_load``), forward and backward, the gradient sum (``trainer.allreduce_grads``)
  and the update (``trainer.update``): the package's Trainer is made with
  ``update_on_kvstore=False``, so the last two are separate calls.
- ``workers``: a ``dist_sync`` job on loopback (``python -m gluon_mgpu.launch -n W -s 1``:
  a scheduler, one server, W workers with one device each; kind "dist"), W = 1, 2 and 4, the
  book's LeNet, global batch 256: the job's images/s and, per step, forward and backward and
  the push/pull (``trainer.step``: the server adds up the workers' gradients and updates).
- ``horovod``: the same LeNet job under ``horovodrun -np W --gloo`` (``--kvstore horovod``'s
  kvstore, no servers), W = 1, 2 and 4: images/s and ``trainer.step`` (the ring's allreduce
  of the gradients, then every worker's own update).

Each measurement records its CPU time against the wall time and the others' load
(lab/measuring.py; for a job, over the whole job, seen from here: every process of the
job is a child of this one); a disturbed one is measured again (``--retries``) and kept,
marked. The raw records are kept in docs/records/scaling.json; ``--part`` measures one table
again and keeps the other's records.
"""
import argparse
import functools
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (lab/run.py: config, measure, measure_until_quiet, machine)
from measuring import (DISTURBED_CORES, TABLE_LEGEND, Interval, raw_values,  # noqa: E402
                       summarize)

# part -> the counts measured: devices of one process, workers of a dist_sync job.
COUNTS = {'devices': (1, 2, 4, 8), 'workers': (1, 2, 4), 'horovod': (1, 2, 4)}
DEVICE_PHASES = ('split', 'copies', 'forward+backward', 'gradient sum', 'update')
JOB_PHASES = ('forward+backward', 'push/pull')
HOROVOD_PHASES = ('forward+backward', 'allreduce+update')
STEP_PHASES = DEVICE_PHASES + JOB_PHASES + HOROVOD_PHASES[1:]  # "phases added up" is derived
JOB_BATCH = 256
TIMEOUT = {'devices': 600, 'workers': 180, 'horovod': 180}  # seconds: a hang fails the run, named


def device_config(devices, quick=False):
    """The worker's configuration for ResNet-18 on ``devices`` simulated devices."""
    steps = (1, 1, 1) if quick else (2, 3, 3)
    return dict(run.config('ours-hyb-1'), kind='phases', devices=devices,
                **dict(zip(('warmup', 'steps', 'phase_steps'), steps)))


def job_config(quick=False, engine='dist_sync'):
    """The configuration every worker of a LeNet ``dist_sync`` (or Horovod) job gets."""
    steps = (2, 3, 3) if quick else (5, 30, 30)
    return dict(kind='dist', engine=engine, model='lenet', mode='hybrid', loop='ours',
                loader='array', threads='package', batch_size=JOB_BATCH,
                **dict(zip(('warmup', 'steps', 'phase_steps'), steps)))


def job_command(config, workers):
    """The job's argv: our launcher with ``workers`` workers and one server, or horovodrun
    with ``workers`` processes on loopback; every worker runs worker.py."""
    worker = [sys.executable, os.path.join(HERE, 'worker.py'), json.dumps(config)]
    if config.get('engine') == 'horovod':
        horovodrun = os.path.join(os.path.dirname(sys.executable), 'horovodrun')
        return [horovodrun, '-np', str(workers), '-H', 'localhost:%d' % workers, '--gloo', *worker]
    return [sys.executable, '-m', 'gluon_mgpu.launch', '-n', str(workers), '-s', '1', '--', *worker]


def job_record(interval, worker_records):
    """One job's record: ``interval`` (the whole job's, from lab/measuring.py), the
    workers' records, and ``value``, the job's images/s as its slowest worker saw them."""
    workers = sorted(worker_records, key=lambda r: r['rank'])
    return dict(interval, value=min(r['value'] for r in workers), workers=workers)


def worker_results(stdout):
    """The JSON object every worker printed, wherever it is in the job's output: horovodrun puts
    ``[rank]<stdout>:`` before each line, and two processes' lines can run into each other."""
    decoder, found = json.JSONDecoder(), []
    for line in stdout.splitlines():
        at = line.find('{"')
        while at >= 0:
            value, end = decoder.raw_decode(line, at)
            found.append(value)
            at = line.find('{"', end)
    return found


def measure_job(config, workers, timeout=TIMEOUT['workers']):
    """Run one ``dist_sync`` (or Horovod) job on loopback; return ``job_record`` of it."""
    engine = config.get('engine', 'dist_sync')
    meter = Interval().start()
    try:
        out = subprocess.run(job_command(config, workers), capture_output=True, text=True,
                             cwd=run.ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError('the %s job of %d workers did not finish in %d s (a hang?)'
                           % (engine, workers, timeout)) from None
    interval = meter.stop()
    lines = worker_results(out.stdout)
    if out.returncode != 0 or len(lines) != workers:
        raise RuntimeError('the %s job of %d workers failed (exit code %d, %d results):'
                           '\n%s' % (engine, workers, out.returncode, len(lines),
                                     out.stderr[-3000:]))
    return job_record(interval, lines)


def measure_part(part, count, quick, retries):
    """Every record of one row: one measurement, again while disturbed."""
    if part == 'devices':
        return run.measure_until_quiet(device_config(count, quick), retries, functools.partial(
            run.measure, timeout=TIMEOUT['devices']))
    engine = 'horovod' if part == 'horovod' else 'dist_sync'
    return run.measure_until_quiet(job_config(quick, engine), retries,
                                   functools.partial(measure_job, workers=count))


def measure_all(parts, quick=False, repeats=2, retries=1):
    """Measure the rows of ``parts`` interleaved, ``repeats`` times; return every record."""
    records = []
    for r in range(1 if quick else repeats):
        for part in parts:
            for count in COUNTS[part]:
                for record in measure_part(part, count, quick, retries):
                    records.append(dict(record, part=part, count=count, repeat=r + 1))
                    print('%-7s %d, run %d: %8.1f images/s, CPU/wall %.2f, others %.2f%s'
                          % (part, count, r + 1, record['value'], record['cpu_per_wall'],
                             record['others_cores'],
                             ' DISTURBED' if record['disturbed'] else ''), flush=True)
    return records


def step_phases(record):
    """``{phase: [seconds per step]}`` of a record; a job's pools all its workers' steps."""
    if 'workers' not in record:
        return record['phases']
    pooled = {}
    for worker in record['workers']:
        for phase, times in worker['phases'].items():
            pooled.setdefault(phase, []).extend(times)
    return pooled


def phase_ms(record, phase):
    """Median milliseconds of ``phase`` over a record's steps; ``'phases added up'``: of each
    step's phases together."""
    phases = step_phases(record)
    if phase == 'phases added up':
        return 1000 * statistics.median([sum(step) for step in zip(*phases.values())])
    return 1000 * statistics.median(phases[phase])


def phase_summary(records, phase):
    """``summarize`` of ``phase_ms`` over ``records`` (the undisturbed ones if any)."""
    return summarize([dict(r, value=phase_ms(r, phase)) for r in records])


def slope(xs, ys):
    """Least-squares slope of ``ys`` over ``xs``: how much y grows per unit of x."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            / sum((x - mx) ** 2 for x in xs))


def ms(value):
    """Milliseconds for a table: two decimals below 10, one above."""
    return '%.2f' % value if value < 10 else '%.1f' % value


def ms_cell(summary):
    """A table cell: median, and the spread when there are two or more runs."""
    if summary['n'] < 2:
        return ms(summary['median'])
    return '%s (%s-%s)' % (ms(summary['median']), ms(summary['low']), ms(summary['high']))


def rows(by_count, batch, phases):
    """The table of one part: a row per count, its images/s and phase times."""
    base = summarize(by_count[min(by_count)])['median']
    lines = []
    for count, records in sorted(by_count.items()):
        s = summarize(records)
        cells = [str(count), str(batch // count),
                 '%.1f (%.1f-%.1f, %d)%s' % (s['median'], s['low'], s['high'], s['n'],
                                             ' **all disturbed**' if s['all_disturbed'] else ''),
                 '%.2f' % (s['median'] / base), ms(1000.0 * batch / s['median'])]
        cells += [ms_cell(phase_summary(records, p)) for p in phases]
        cells += ['%.2f' % s['cpu_per_wall'], '%.2f' % s['others_cores'], raw_values(records)]
        lines.append('| %s |' % ' | '.join(cells))
    return lines


def header(first, per, phases):
    """The header lines of a part's table."""
    names = [first, 'batch per %s' % per, 'images/s: median (spread, n)', 'x 1 %s' % per,
             'step, ms'] + ['%s, ms' % p for p in phases] + ['CPU/wall', 'others', 'raw images/s']
    return ['| %s |' % ' | '.join(names),
            '| --- |%s --- |' % (' ---: |' * (len(names) - 2))]


def growth(by_count, batch, phases):
    """``[(what, ms at the fewest, ms at the most, ms per extra count)]``: the step (from the
    images/s) and each phase, by median; the last is the least-squares slope over every count."""
    counts = sorted(by_count)
    curves = [('step', [1000.0 * batch / summarize(by_count[c])['median'] for c in counts])] + [
        (what, [phase_summary(by_count[c], what)['median'] for c in counts]) for what in phases]
    return [(what, ys[0], ys[-1], slope(counts, ys)) for what, ys in curves]


def growth_text(by_count, batch, phases, unit):
    """One paragraph: how the step and its phases grow per extra ``unit``, largest first."""
    counts = sorted(by_count)
    (_, first, last, step_slope), *grown = growth(by_count, batch, phases)
    grown.sort(key=lambda g: -g[3])
    return ('From %d to %d %ss the step (from the images/s) goes from %s to %s ms, %+.1f ms '
            'per extra %s (least-squares slope over %s). Per extra %s, with waits: %s.'
            % (counts[0], counts[-1], unit, ms(first), ms(last), step_slope, unit,
               ', '.join(map(str, counts)), unit,
               '; '.join('%s %+.2f ms (%s to %s ms)' % (what, s, ms(a), ms(b))
                         for what, a, b, s in grown)))


def part_lines(part, records):
    """The section of one part: its table and how the cost grows."""
    by_count = {}
    for r in records:
        by_count.setdefault(r['count'], []).append(r)
    if part == 'devices':
        batch, phases, unit = run.GLOBAL_BATCH, DEVICE_PHASES + ('phases added up',), 'device'
    else:
        batch, unit = JOB_BATCH, 'worker'
        phases = HOROVOD_PHASES if part == 'horovod' else JOB_PHASES
    lines = header(unit + 's', unit, phases) + rows(by_count, batch, phases)
    if len(by_count) > 1:
        lines += ['', growth_text(by_count, batch, [p for p in phases if p in STEP_PHASES],
                                  unit)]
    return lines


DEVICES_TEXT = (
    'The chapter\'s ResNet-18, hybridized, data parallel over simulated devices (`mx.cpu(0)` '
    'to `mx.cpu(7)`, all on the same cores), global batch %d, one fresh process per '
    'measurement: %s after %s of the package\'s step '
    'as `train()` runs it (`train_epoch`: each device\'s calls from its own thread, the '
    'epoch\'s loss and accuracy sums included) without waits give the images/s; then, after '
    'one untimed step, '
    '%s timed phase by phase with `nd.waitall()` after each. **The waits remove the '
    'overlap** MXNet\'s engine finds otherwise (one device\'s copies or update with another\'s '
    'compute), so the phases do not add up to the step: compare "phases added up" with '
    '"step". The split and the copies are the two halves of `split_and_load` (`split_data`, '
    'then `as_in_context` per slice; the first device\'s slice stays where it is). The '
    'gradient sum (`trainer.allreduce_grads`: the kvstore adds the devices\' gradients and '
    'hands the sum back to each) and the update (`trainer.update`: every device updates its '
    'own replica) are the two calls of the package\'s Trainer\'s step, made with '
    '`update_on_kvstore=False`. On 1 device there is no kvstore and nothing to sum.%s Phase '
    'times: the median over a run\'s steps, then the median (spread) over runs.')
# Until issue 43 (2026-11-27) the package's Trainer updated inside the kvstore on 2 or more
# devices; records measured before then timed that step.
KVSTORE_UPDATE_UNTIL = '2026-11-27'
KVSTORE_UPDATE_TEXT = (
    ' The records below were measured before %s, when the package\'s Trainer did both inside '
    'the kvstore on 2 or more devices (one update on the summed gradient, then the weights '
    'copied back) and the phases came from a second Trainer made with '
    '`update_on_kvstore=False`: their images/s are of that step, called on its own (not '
    'through `train_epoch`), and today\'s step has not been measured again.'
    % KVSTORE_UPDATE_UNTIL)
WORKERS_TEXT = (
    'A `dist_sync` job on loopback, started as `python -m gluon_mgpu.launch -n W -s 1` (a '
    'scheduler, one server, W workers with one device each, every process on this machine\'s '
    'cores), the book\'s LeNet, global batch %d shared by the workers, one fresh job per '
    'measurement: %s after %s without waits give the job\'s images/s '
    '(the global batch times the steps over the slowest worker\'s time); then %s timed '
    'phase by phase with `nd.waitall()` after each. Push/pull is `trainer.step`: the worker '
    'pushes its gradients, the server adds up all the workers\' and updates, the worker pulls '
    'the new weights; it includes waiting for the slowest worker. Phase times: the median over '
    'the steps of all workers of a job, then over jobs. CPU/wall and others are over the '
    'whole job, start-up included, seen from the process that launched it.')
HOROVOD_TEXT = (
    'The same LeNet job under Horovod: `horovodrun -np W -H localhost:W --gloo`, W processes '
    'with one device each and no servers (the kvstore of `--kvstore horovod`), global batch %d '
    'shared by the workers, one fresh job per measurement: %s after %s without waits give the '
    'job\'s images/s; then %s timed phase by phase. Allreduce+update is `trainer.step`: '
    'Gloo\'s ring sums every worker\'s gradients and hands the sum to all, then each worker '
    'updates its own replica; it includes waiting for the slowest worker. The rows are '
    'measured interleaved with the dist_sync rows above when both parts are measured '
    'together (`--part jobs`).')


def _steps(config):
    """How many steps of each kind ``config`` runs, as words: timed, warm-up, phased."""
    def n(count, kind):
        return '%d %sstep%s' % (count, kind, '' if count == 1 else 's')
    return (n(config['steps'], 'timed '), n(config['warmup'], 'warm-up '),
            n(config['phase_steps'], ''))


def report(raw, raw_name='scaling.json'):
    """The lines of docs/scaling.md, from the raw records (docs/records/scaling.json), linked
    as ``raw_name``."""
    info, every = raw['machine'], raw['records']
    quick = raw.get('quick')
    lines = ['# How cost grows with devices and workers', '',
             'Written by `lab/scaling.py`%s from the raw records in [%s](%s); do not '
             'edit by hand.' % (' --quick (a smoke run, NOT representative)' if quick else '',
                                raw_name, raw_name), '',
             '- when: %s' % '; '.join('%s to %s: %s' % (r['start'], r['end'], r['what'])
                                      for r in raw['runs']),
             '- machine: %(cpu)s, %(cores)d usable cores; Python %(python)s, MXNet %(mxnet)s; '
             '%(platform)s. Load average at the end: %(load)s.' % info,
             '- %d measurements, %d disturbed (the rest of the machine kept more than %.1f cores '
             'busy on average; %s).'
             % (len(every), sum(r['disturbed'] for r in every), DISTURBED_CORES,
                'each was measured again, up to %d more times' % raw['retries']
                if raw['retries'] else 'none was measured again: --retries 0'),
             '', 'Images/s: %s The best run is the top of the spread.' % TABLE_LEGEND]
    configs = raw['configs']
    older = any(r['part'] == 'devices' and r.get('utc', KVSTORE_UPDATE_UNTIL)
                < KVSTORE_UPDATE_UNTIL for r in every)  # a record without a date: a new one
    texts = {'devices': DEVICES_TEXT % ((run.GLOBAL_BATCH,) + _steps(configs['devices'])
                                        + (KVSTORE_UPDATE_TEXT if older else '',)),
             'workers': WORKERS_TEXT % ((JOB_BATCH,) + _steps(configs['workers']))}
    if 'horovod' in configs:
        texts['horovod'] = HOROVOD_TEXT % ((JOB_BATCH,) + _steps(configs['horovod']))
    titles = {'devices': 'ResNet-18 on 1, 2, 4 and 8 simulated devices',
              'workers': 'LeNet in a dist_sync job of 1, 2 and 4 workers',
              'horovod': 'LeNet in a Horovod job of 1, 2 and 4 processes'}
    for part in COUNTS:
        records = [r for r in every if r['part'] == part]
        if records:
            lines += ['', '## %s' % titles[part], '', texts[part], ''] + part_lines(part, records)
    lines += ['', 'Reproduce: `.venv/bin/python lab/scaling.py%s` (one table: `--part '
              'devices`, `--part workers` or `--part horovod`; the two jobs interleaved: `--part '
              'jobs`).' % (' --quick' if quick else '')]
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(prog='scaling.py', description=__doc__.splitlines()[0])
    p.add_argument('--part', choices=['devices', 'workers', 'horovod', 'jobs', 'all'],
                   default='all',
                   help='measure one table only, keep the other\'s records (default: all)')
    p.add_argument('--quick', action='store_true', help='1 timed step each, 1 round (smoke run)')
    p.add_argument('--repeats', type=int, default=2, help='rounds of every row (default: 2)')
    p.add_argument('--retries', type=int, default=1,
                   help='measure a disturbed run again, at most this many times (default: 1)')
    p.add_argument('--report-only', action='store_true',
                   help='measure nothing; rewrite the report from the raw records')
    p.add_argument('--out', default=os.path.join(run.ROOT, 'docs', 'scaling.md'),
                   help='where to write the report (default: docs/scaling.md; the raw records '
                   'go to docs/records/scaling.json, or next to another report, .json)')
    args = p.parse_args(argv)
    if args.repeats < 1 or args.retries < 0:
        p.exit(2, '%s: error: --repeats %d --retries %d: pass --repeats 1 or more and '
               '--retries 0 or more\n' % (p.prog, args.repeats, args.retries))
    raw_path = run.records_of(args.out)
    raw = run.load_raw(p, raw_path, args.report_only or args.part != 'all', args.report_only)
    if not args.report_only:
        parts = {'all': list(COUNTS), 'jobs': ['workers', 'horovod']}.get(args.part, [args.part])
        start = run.utc_now()
        try:
            records = measure_all(parts, args.quick, args.repeats, args.retries)
        except RuntimeError as e:
            p.exit(1, '%s: error: %s\n' % (p.prog, e))
        raw['records'] = [r for r in raw['records'] if r['part'] not in parts] + records
        raw['runs'].append({'start': start, 'end': run.utc_now(), 'what': ', '.join(parts)})
        raw.update(machine=run.machine(), quick=args.quick, retries=args.retries,
                   configs={'devices': device_config(1, args.quick),
                            'workers': job_config(args.quick),
                            'horovod': job_config(args.quick, 'horovod')})
        with open(raw_path, 'w') as f:
            json.dump(raw, f, indent=1)
    lines = report(raw, run.records_link(args.out, raw_path))
    run.write_report(args.out, '\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
