"""A child process for the crash test: writes `steps` steps of synthetic turns into a store.

Usage: python -m tests.storage.ingest_worker ROOT RUN STEPS ROWS_PER_STEP SHARD_ROWS
"""

import sys

from storage.synthetic import synthetic_turns
from storage.writer import StoreWriter

if __name__ == "__main__":
    root, run, steps, rows, shard_rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    writer = StoreWriter(root, compression="zstd", fsync=True)
    for step in range(steps):
        writer.write_step("turns", run, step, synthetic_turns(run, step, rows), shard_rows=shard_rows)
    print("done", flush=True)
