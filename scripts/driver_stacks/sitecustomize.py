"""A diagnostic, not part of warpfleet: with this folder first on PYTHONPATH and WF_STACKS_DIR set,
a `python -m cluster.cli sweep` process writes its main thread's stack every 50 ms, with the time,
to WF_STACKS_DIR/stacks-PID.txt ("M time gap stack"), and every other thread's stack ("O time id
stack") where the sampler itself was held up (another thread held the GIL) or the main thread was
writing Parquet. scripts/bench_time_to_result.py --stacks sets both and sums where the loop's time
went (``driver_time``). Any other process is left alone."""

import atexit
import os
import sys
import threading
import time
import traceback

_DIR = os.environ.get("WF_STACKS_DIR")
if _DIR and "cluster.cli" in getattr(sys, "orig_argv", []) and "sweep" in sys.orig_argv:
    os.makedirs(_DIR, exist_ok=True)
    _MAIN = threading.main_thread().ident
    _OUT = open(os.path.join(_DIR, f"stacks-{os.getpid()}.txt"), "w", buffering=1 << 16)  # noqa: SIM115
    atexit.register(_OUT.flush)

    def _stack(frame, depth: int = 12) -> str:
        return " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}"
                           for f in reversed(traceback.extract_stack(frame)[-depth:]))

    def _sample() -> None:
        last, dumped, me = time.time(), 0.0, threading.get_ident()
        while True:
            time.sleep(0.05)
            now = time.time()
            frames = sys._current_frames()
            gap, last = now - last, now
            main = frames.get(_MAIN)
            stack = _stack(main) if main is not None else "-"
            _OUT.write(f"M {now:.3f} {gap:.3f} {stack}\n")
            if gap > 0.3 or ("write_table" in stack.split(" <- ")[0] and now - dumped > 1.0):
                dumped = now
                for ident, frame in frames.items():
                    if ident not in (me, _MAIN):
                        _OUT.write(f"O {now:.3f} {ident} {_stack(frame, 8)}\n")
            if main is None:
                _OUT.flush()
                return

    threading.Thread(target=_sample, daemon=True, name="wf-stacks").start()
