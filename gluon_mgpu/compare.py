"""``python -m gluon_mgpu.compare``: the command line is ``gluon_mgpu/commands/compare.py``."""
if __name__ == '__main__':
    from gluon_mgpu.runtime.startup import starting
    with starting('python -m gluon_mgpu.compare'):  # a signal until main handles it: one line
        from gluon_mgpu.commands.compare import main  # its flags come before MXNet
    raise SystemExit(main())
