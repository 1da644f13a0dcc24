#!/usr/bin/env python3
"""Lists the longest functions of the layers above ops/ and checks a limit.

A function is a brace block opened where every enclosing block is a
namespace, class, struct, union or extern "C" block, and whose opening
text (since the previous ';', '{' or '}') has a parameter list: free
functions, member functions defined in a class or out of it, constructors,
and lambdas assigned at namespace scope. Its length is the number of lines
from the line of its name (the start of its opening text) to its closing
brace. Comments, string and character literals are blanked before the
braces are counted, and preprocessor lines are skipped.

Usage: function_lengths.py [--root DIR] [--limit N] [--top K]
  --root DIR   the tree to check (default: this repository)
  --limit N    exit 1 when a function is longer than N lines (default 80)
  --top K      print the K longest functions (default 5)

Prints "LINES FILE:LINE NAME" for the K longest, then every function over
the limit, then a summary line.
"""
import argparse
import os
import re
import sys

# The layers above ops/ (tests/layering/check_layering.py); cuda/ is a back
# end, not orchestration, and engine/ and ops/ hold kernels.
FOLDERS = ["checkpoint", "parallel", "moe", "models", "train", "tokenizer",
           "tools", "api", "python", "examples"]
SOURCE_EXTS = (".h", ".cc", ".cpp")
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b|extern\s*\"C\"")
NAME = re.compile(r"([~\w:<>]+|operator\s*\S+)\s*\(")


def blank_literals(text):
    """Replaces comments and string/char literals by spaces, keeping newlines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            k = text.find("(", i + 2)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            # A digit separator (1'000) is not a literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum() \
                    and (i + 2 >= n or text[i + 2] != "'"):
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """Yields (lines, first_line, name) for each function defined in path."""
    with open(path, encoding="utf-8") as f:
        text = blank_literals(f.read())
    lines = [("" if l.lstrip().startswith("#") else l) for l in text.split("\n")]
    stack = []  # per open brace: ("scope" | "function" | "other", start_line, name)
    head, head_line = "", None
    for lineno, line in enumerate(lines, 1):
        for c in line:
            if c == "{":
                in_scope = all(kind == "scope" for kind, _, _ in stack)
                if in_scope and SCOPE.search(head) and "(" not in head.split("{")[0]:
                    stack.append(("scope", lineno, ""))
                elif in_scope and ")" in head:
                    names = NAME.findall(head.split("=")[0] if "[" not in head.split("=")[0] else head)
                    name = names[0] if names else "<lambda>"
                    if "[" in head and "=" in head:
                        name = head.split("=")[0].split()[-1] if head.split("=")[0].split() else name
                    stack.append(("function", head_line or lineno, name))
                else:
                    stack.append(("other", lineno, ""))
                head, head_line = "", None
            elif c == "}":
                if stack:
                    kind, start, name = stack.pop()
                    if kind == "function":
                        yield lineno - start + 1, start, name
                head, head_line = "", None
            elif c == ";":
                if all(kind == "scope" for kind, _, _ in stack):
                    head, head_line = "", None
            else:
                if not c.isspace() and head_line is None:
                    head_line = lineno
                head += c
        head += " "


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    found = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(args.root, folder)):
            for name in sorted(files):
                if name.endswith(SOURCE_EXTS):
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, args.root)
                    found += [(n, rel, line, fn) for n, line, fn in functions(path)]
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    for n, rel, line, fn in found[:args.top]:
        print(f"{n:5d} {rel}:{line} {fn}")
    over = [f for f in found if f[0] > args.limit]
    for n, rel, line, fn in over:
        print(f"over {args.limit}: {n} lines {rel}:{line} {fn}")
    print(f"{len(found)} functions, {len(over)} over {args.limit} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
