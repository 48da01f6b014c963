"""Where the suite's time goes: seconds per test file and the slowest tests, from the JUnit XML
that `make test` writes (.pytest_cache/junit.xml).

    .venv/bin/python scripts/test_times.py [.pytest_cache/junit.xml] [--top 30]

Prints the files by total seconds (tests, seconds, share), then the `--top` slowest tests, and
last a JSON line {"tests", "test_seconds", "files": {file: seconds}, "slowest": [[test, s]]}.
Under xdist the seconds of tests that ran at once add up: their sum is the work, the wall time
is about that sum over the workers.
"""

from __future__ import annotations

import argparse
import collections
import json
import xml.etree.ElementTree as ET
from pathlib import Path


def times(junit: Path) -> list[tuple[str, str, float]]:
    """(file, test id, seconds) of every test case in `junit`."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname") or "?"
        path = module.replace(".", "/") + ".py"
        out.append((path, f"{path}::{case.get('name')}", float(case.get("time") or 0.0)))
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, nargs="?", default=Path(".pytest_cache/junit.xml"))
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    cases = times(args.junit)
    per_file, count = collections.Counter(), collections.Counter()
    for path, _, s in cases:
        per_file[path] += s
        count[path] += 1
    total = sum(per_file.values())
    print(f"{len(cases)} tests, {total:.0f} test-seconds")
    for path, s in per_file.most_common():
        print(f"{s:8.1f} s {count[path]:5d} tests {s / total:6.1%}  {path}")
    slowest = sorted(cases, key=lambda c: -c[2])[:args.top]
    print(f"\nthe {args.top} slowest tests:")
    for _, test, s in slowest:
        print(f"{s:8.1f} s  {test}")
    report = {"tests": len(cases), "test_seconds": round(total, 1),
              "files": {p: round(s, 1) for p, s in per_file.most_common()},
              "slowest": [[t, round(s, 1)] for _, t, s in slowest]}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
