"""``python -m gluon_mgpu.env``: the command line is ``gluon_mgpu/commands/env.py``."""
import sys

if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import before_mxnet, starting
    with starting('python -m gluon_mgpu.env'):  # a signal until main runs: one line
        before_mxnet('python -m gluon_mgpu.env')  # threads, checks, then MXNet
        from gluon_mgpu.commands.env import main
    sys.exit(main())
