#!/usr/bin/env python3
"""Every relative link in the repository's Markdown files names a file that exists and, with a
#fragment into a Markdown file, a heading there (GitHub's anchor rules: lower case, punctuation
dropped, spaces as '-', '-1', '-2' for repeats). Prints each broken link; exit 1 if any.

    tests/doc_links.py [REPO_ROOT]
"""
import pathlib
import re
import sys

SKIP_DIRS = {".git", "build", "node_modules", "__pycache__"}


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
        for line in text.split("\n"):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
        cache[path] = found
    return cache[path]


def broken_links(root):
    for md in sorted(root.rglob("*.md")):
        if SKIP_DIRS.intersection(md.relative_to(root).parts):
            continue
        text = md.read_text(encoding="utf-8")
        text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code blocks
        text = re.sub(r"`[^`\n]*`", "", text)  # inline code
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = m.group(1)
            if re.match(r"^[a-z]+:", link):  # http:, https:, mailto:
                continue
            path, _, fragment = link.partition("#")
            target = (md.parent / path).resolve() if path else md
            if not target.exists():
                yield f"{md.relative_to(root)}: {link}: no such file"
            elif fragment and target.suffix == ".md" and fragment not in anchors(target):
                yield f"{md.relative_to(root)}: {link}: no heading #{fragment}"


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    bad = list(broken_links(root))
    for line in bad:
        print(line)
    files = sum(1 for md in root.rglob("*.md") if not SKIP_DIRS.intersection(md.relative_to(root).parts))
    print(f"doc_links: {len(bad)} broken links in {files} Markdown files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
