"""``python -m hydra_core`` and the ``hydra-lab`` console script.

Start-up (importing torch, timm and the commands) takes seconds; Ctrl-C during it ends quietly
with exit code 130 (SIGTERM: 143), as it does once a command runs (:func:`hydra_core.cli.main`)."""

import os
import signal
import sys


def run() -> None:
    from hydra_core.errors import Terminated, raise_terminated

    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        from hydra_core.hub import early_refusal

        # a hub name offline: refused at once, not after the seconds of importing torch
        if refusal := early_refusal(sys.argv[1:]):
            print(f"error: {refusal}", file=sys.stderr)
            sys.exit(2)
        from hydra_core.cli import main
    except KeyboardInterrupt as stop:
        # nothing was done: leave at once, so that no half-imported module's finaliser (or a
        # second Ctrl-C) turns exit code 130 into death by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("stopped while starting; nothing was done", file=sys.stderr, flush=True)
        os._exit(Terminated.exit_code if isinstance(stop, Terminated) else 130)
    sys.exit(main())


if __name__ == "__main__":
    run()
