"""Times seed 000's Python SDK against a node: exec of `true`, and a 100 MiB
fs_pull / fs_push. Usage: silkd_bench.py ADDR SANDBOX_ID TOKEN ROUND_TRIPS BULK_PATH

Prints one JSON object: per-call milliseconds for exec (median, p90) and the
seconds of each bulk transfer."""

import io
import json
import sys
import tarfile
import time

from cocoonsandbox import Client


def main() -> None:
    addr, sandbox_id, token, rounds, bulk = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    client = Client(addr, timeout=600.0)
    sb = client.attach(addr, sandbox_id, token)
    sb.exec("true")  # the keep-alive probe and the first dial are not timed
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        sb.exec("true")
        samples.append((time.perf_counter() - started) * 1e3)
    samples.sort()
    started = time.perf_counter()
    archive = sb.pull(bulk)
    pull_s = time.perf_counter() - started
    size = tarfile.open(fileobj=io.BytesIO(archive)).getmembers()[0].size
    started = time.perf_counter()
    sb.push("/tmp/pushed-bulk", archive)
    push_s = time.perf_counter() - started
    print(json.dumps({
        "exec_true_median_ms": samples[len(samples) // 2],
        "exec_true_p90_ms": samples[len(samples) * 9 // 10],
        "pull_s": pull_s,
        "push_s": push_s,
        "bulk_bytes": size,
        "archive_bytes": len(archive),
    }))


if __name__ == "__main__":
    main()
