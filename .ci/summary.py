"""The table .ci/run ends with: the tiers that ran and those skipped, each skip with its reason,
then every test the README's test command skipped, grouped by reason.

    python3 .ci/summary.py TIERS.tsv [JUNIT.xml]

TIERS.tsv: one ``tier<TAB>state<TAB>seconds<TAB>reason`` line per tier, in order. JUNIT.xml: pytest's
``--junitxml`` report of ``nox -s tests`` (absent when that tier did not get as far). Standard
library only: it runs on the CI machine's python3, outside any session.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def tiers(path: Path) -> list[tuple[str, str, str, str]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            name, state, seconds, reason = (line.split("\t") + ["", "", ""])[:4]
            rows.append((name, state, seconds, reason))
    return rows


def skipped_tests(path: Path) -> dict[str, list[str]]:
    """Skip reason -> the test ids pytest skipped for it (reasons without pytest's "Skipped: ")."""
    out: dict[str, list[str]] = defaultdict(list)
    for case in ET.parse(path).getroot().iter("testcase"):
        skip = case.find("skipped")
        if skip is None:
            continue
        reason = (skip.get("message") or skip.text or "").strip()
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        out[reason].append(test_id(case.get("classname", ""), case.get("name", "?")))
    return dict(out)


def test_id(classname: str, name: str, root: Path = Path(".")) -> str:
    """pytest's node id from junit's dotted classname (a module, or a module and its classes)."""
    parts = classname.split(".") if classname else []
    for i in range(len(parts), 0, -1):
        module = "/".join(parts[:i]) + ".py"
        if (root / module).is_file():
            return "::".join([module, *parts[i:], name])
    return "::".join([*parts, name]) if parts else name


def render(rows: list[tuple[str, str, str, str]], skips: dict[str, list[str]] | None) -> str:
    width = max([len("tier"), *(len(r[0]) for r in rows)])
    lines = ["", "CI tiers", f"  {'tier':<{width}}  {'state':<8}  {'seconds':>7}  command, or why skipped"]
    for name, state, seconds, reason in rows:
        lines.append(f"  {name:<{width}}  {state:<8}  {seconds:>7}  {reason}".rstrip())
    total = sum(int(r[2]) for r in rows if r[2].isdigit())
    lines.append(f"  {'total':<{width}}  {'':<8}  {total:>7}")
    if skips is not None:
        n = sum(map(len, skips.values()))
        lines += ["", f"tests skipped by nox -s tests: {n}"]
        for reason, ids in sorted(skips.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"  {len(ids):>3}  {reason}")
            lines += [f"         {t}" for t in sorted(ids)]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    junit = Path(argv[1]) if len(argv) == 2 else None
    skips = skipped_tests(junit) if junit is not None and junit.is_file() else None
    print(render(tiers(Path(argv[0])), skips))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
