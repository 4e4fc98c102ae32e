"""``python -m gluon_mgpu.compare``: the command line is ``gluon_mgpu/commands/compare.py``."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import before_mxnet, starting
    with starting('python -m gluon_mgpu.compare'):  # a signal until main runs: one line
        before_mxnet('python -m gluon_mgpu.compare')  # threads, checks, then MXNet
        from gluon_mgpu.commands.compare import main
    sys.exit(main())
