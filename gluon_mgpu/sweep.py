"""``python -m gluon_mgpu.sweep``: the command line is ``gluon_mgpu/commands/sweep.py``."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import before_mxnet, starting
    with starting('python -m gluon_mgpu.sweep'):  # a signal until main runs: one line
        before_mxnet('python -m gluon_mgpu.sweep')  # threads, checks, then MXNet
        from gluon_mgpu.commands.sweep import main
    sys.exit(main())
