"""``python -m gluon_mgpu.sweep``: the command line is ``gluon_mgpu/commands/sweep.py``."""
if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import starting
    with starting('python -m gluon_mgpu.sweep'):  # a signal until main handles it: one line
        from gluon_mgpu.commands.sweep import main  # its flags come before MXNet
    raise SystemExit(main())
