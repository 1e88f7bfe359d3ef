"""Check that the Markdown files point only at files that exist in the repository.

    python scripts/check_links.py [FILE.md ...]      # default: every *.md git knows of

Two kinds of reference are checked:

* relative links, ``[text](path)`` and ``![alt](path)``, resolved against the file's folder
  (``#anchors`` and ``?queries`` dropped; ``http:``/``https:``/``mailto:`` and pure
  ``#anchor`` links skipped);
* repository paths quoted as code, such as ``results/h100/probe.json`` or
  ``scripts/remote_gpu/run.sh``, resolved against the repository root (only tokens that start
  with a top-level folder of the repository and contain no wildcard or placeholder).

Prints each broken reference as ``FILE:LINE: target`` and exits 1 if there is any.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"`([^`\s]+)`")
TOP_LEVEL = ("docs/", "results/", "scripts/", "litekiln/", "tests/", ".ci/")
PLACEHOLDER = re.compile(r"[*?<>{}\[\]]|\.\.\.|NAME|MODEL|DIR")


def markdown_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).exists()]


def broken(md: Path) -> list[tuple[int, str]]:
    bad: list[tuple[int, str]] = []
    in_fence = False
    for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^(https?:|mailto:|#)", target):
                continue
            path = target.split("#", 1)[0].split("?", 1)[0]
            if path and not (md.parent / path).exists():
                bad.append((n, target))
        if in_fence:
            continue
        for m in CODE.finditer(line):
            token = m.group(1).rstrip(".,:;")
            if not token.startswith(TOP_LEVEL) or PLACEHOLDER.search(token):
                continue
            path = token.split("::", 1)[0]  # pytest node ids
            if not (ROOT / path).exists():
                bad.append((n, token))
    return bad


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or markdown_files()
    failures = 0
    for md in files:
        for n, target in broken(md):
            print(f"{md.relative_to(ROOT)}:{n}: {target}")
            failures += 1
    print(f"{len(files)} Markdown files, {failures} broken references", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
