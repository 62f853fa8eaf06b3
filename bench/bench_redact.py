"""Secret redaction of tool output: time per MB on hostile and ordinary text.

Each input is 1 MB (by default) of one shape that once made a pattern rescan long runs
(``1.1.1…`` took 22 s for 24 KB before the fix) or that every pattern must walk; the baseline is
1 MB of ordinary prose in the same run. Reported: the median of ``--runs`` timings per input,
in ms per MB, and its ratio to prose. Linear means the figure stays put as ``--mb`` grows.

    python -m bench.bench_redact              # 1 MB inputs, 5 runs each
    python -m bench.bench_redact --mb 4       # check that the time per MB does not grow
"""

from __future__ import annotations

import argparse
import statistics
import time

from cogency._redact import redact

SHAPES = {
    "prose": "The quick brown fox jumps over the lazy dog; tokens are counted. ",
    "dotted digits": "1.1.",
    "one long word": "a",
    "url colons": "://a:",
    "label words": "token ",
    "bearer words": "Bearer ",
    "key headers": "-----BEGIN RSA PRIVATE KEY-----",
    "jwt prefixes": "eyJ",
    "at signs": "@",
    "spaces": " ",
}


def bench(megabytes: float, runs: int) -> dict[str, float]:
    size = int(megabytes * 1_000_000)
    env: dict[str, str] = {}  # the same work whatever this process's environment holds
    per_mb = {}
    for name, unit in SHAPES.items():
        text = (unit * (size // len(unit) + 1))[:size]
        timings = []
        for _ in range(runs):
            started = time.perf_counter()
            redact(text, env)
            timings.append(time.perf_counter() - started)
        per_mb[name] = statistics.median(timings) / megabytes * 1000
    return per_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=1.0, help="size of each input in MB")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    per_mb = bench(args.mb, args.runs)
    base = per_mb["prose"]
    print(f"redaction, {args.mb:g} MB inputs, median of {args.runs} runs")
    print(f"{'input':<16} {'ms per MB':>10} {'x prose':>8}")
    for name, value in per_mb.items():
        print(f"{name:<16} {value:>10.1f} {value / base:>8.2f}")
    print(f"worst: {max(per_mb.values()):.1f} ms per MB")


if __name__ == "__main__":
    main()
