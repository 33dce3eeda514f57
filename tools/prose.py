"""How much of a tree is prose, and whether it tells how it was made: `python -m tools.prose [DIR ...]`.

Prose is the characters of docstrings and comments, counted without whitespace; the share is of all non-blank
characters of the .py files under each DIR (default kernels/). Also lists files over MAX_LINES lines and lines
that speak of the project's history (HISTORY). Exit status 1 when DIR's prose is at or over MAX_SHARE, a file is
too long, or a history marker is found."""
import argparse
import ast
import io
import pathlib
import re
import sys
import tokenize

MAX_SHARE = 0.25
MAX_LINES = 600
HISTORY = re.compile(r"\bsessions?\b|\btried\b.*\bnot kept\b|\bnot kept\b", re.IGNORECASE)


def _chars(text: str) -> int:
    return sum(not c.isspace() for c in text)


def prose_chars(source: str) -> int:
    """Non-blank characters of the docstrings (module, class, function) and comments of one file."""
    total = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            total += _chars(tok.string)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                total += _chars(ast.get_source_segment(source, body[0]) or "")
    return total


def measure(root: pathlib.Path) -> dict:
    """{'prose', 'total', 'long': [(file, lines)], 'history': [(file, line number, text)]} over root's .py files."""
    out = dict(prose=0, total=0, long=[], history=[])
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        out["prose"] += prose_chars(source)
        out["total"] += _chars(source)
        lines = source.splitlines()
        if len(lines) > MAX_LINES:
            out["long"].append((str(path), len(lines)))
        out["history"] += [(str(path), i, line.strip()) for i, line in enumerate(lines, 1) if HISTORY.search(line)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", default=["kernels"])
    args = ap.parse_args(argv)
    bad = False
    for d in args.dirs:
        m = measure(pathlib.Path(d))
        share = m["prose"] / max(m["total"], 1)
        print(f"{d}: prose {m['prose']:,} of {m['total']:,} non-blank characters ({share:.1%}, limit {MAX_SHARE:.0%})")
        for f, n in m["long"]:
            print(f"  {f}: {n} lines (limit {MAX_LINES})")
        for f, i, text in m["history"]:
            print(f"  {f}:{i}: history: {text[:100]}")
        bad |= share >= MAX_SHARE or bool(m["long"]) or bool(m["history"])
    return int(bad)


if __name__ == "__main__":
    sys.exit(main())
