"""Read a suite timeline (tests/helpers/timeline.py): each xdist worker's busy time, its
xdist groups' time, and the longest phases.

    python tools/timeline.py /tmp/timeline.jsonl [--top 30]
"""

from __future__ import annotations

import argparse
import collections
import json


def group_of(test: str) -> str:
    return test.rsplit("@", 1)[1] if "@" in test else "(none)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    lines = [json.loads(text) for text in open(args.timeline)]
    # Under xdist the controller gets every worker's reports again: keep the workers'.
    if any(line["worker"] != "main" for line in lines):
        lines = [line for line in lines if line["worker"] != "main"]
    begin = min(line["start"] for line in lines)
    end = max(line["stop"] for line in lines)
    print(f"wall {end - begin:.0f} s")
    cpu = sum(line.get("cpu_s", 0) for line in lines)
    print(f"CPU counted {cpu:.0f} s (the workers and what they waited for)")
    workers = collections.defaultdict(float)
    groups = collections.defaultdict(float)
    last = collections.defaultdict(float)
    for line in lines:
        took = line["stop"] - line["start"]
        workers[line["worker"]] += took
        groups[group_of(line["test"])] += took
        last[line["worker"]] = max(last[line["worker"]], line["stop"] - begin)
    for worker, busy in sorted(workers.items()):
        print(f"{worker}: busy {busy:.0f} s, last test ends at {last[worker]:.0f} s")
    for group, took in sorted(groups.items(), key=lambda item: -item[1])[:12]:
        print(f"group {group}: {took:.0f} s")
    lines.sort(key=lambda line: line["start"] - line["stop"])
    for line in lines[:args.top]:
        print(f"{line['stop'] - line['start']:7.1f} s  cpu {line.get('cpu_s', 0):6.1f}  "
              f"{line['start'] - begin:6.0f}  "
              f"{line['worker']:4} {line['phase']:8} {line['test']}")


if __name__ == "__main__":
    main()
