"""A child process for the crash and concurrency tests.

    python -m tests.storage.ingest_worker steps ROOT RUN STEPS ROWS_PER_STEP SHARD_ROWS
        writes `STEPS` steps of synthetic turns, one `write_step` (one commit) each;
    python -m tests.storage.ingest_worker cli ARG...
        imports everything `libra` needs, prints "ready", waits for a line on stdin, then runs
        `libra ARG...` and exits with its status, printing "done SECONDS" when it returns 0
        (so a test can kill it at a chosen time after the command started).
"""

import sys
import time

if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "steps":
        from storage.synthetic import synthetic_turns
        from storage.writer import StoreWriter

        root, run, steps, rows, shard_rows = args[0], args[1], int(args[2]), int(args[3]), int(args[4])
        writer = StoreWriter(root, compression="zstd", fsync=True)
        for step in range(steps):
            writer.write_step("turns", run, step, synthetic_turns(run, step, rows), shard_rows=shard_rows)
        print("done", flush=True)
    elif mode == "cli":
        import cli.main
        import libra.traces  # noqa: F401 - imported before "ready", so the timed part is the command itself
        import storage.ingest  # noqa: F401

        print("ready", flush=True)
        sys.stdin.readline()
        started = time.perf_counter()
        code = cli.main.main(args)
        if code == 0:
            print(f"done {time.perf_counter() - started:.4f}", flush=True)
        sys.exit(code)
    else:
        sys.exit(f"unknown mode {mode!r}")
