#!/usr/bin/env python3
"""No function over 120 lines in coordinator/, worker/, client/ and common/ (issue 42).

  scripts/function_length.py                 check the tracked *.cc / *.h files of those folders
  scripts/function_length.py FILE...         check these files
  scripts/function_length.py --list [N]      print every function longer than N (default 60)
  scripts/function_length.py --self-test     the scanner finds a 121-line function and passes a
                                             120-line one (what ctest lint_function_length runs
                                             first)

A function's length is its lines from the first line of its signature to its closing brace,
lambdas and local classes inside it included. The scanner works on the text with comments,
string and character literals (raw strings too) blanked, and tracks braces: a '{' at namespace
or class scope whose declaration has a parameter list (and is not an initializer) opens a
function body. The exceptions are in scripts/function_length_allow.txt, one per line
("path function-name  # why"); an entry that no longer matches a long function is an error too,
so the list cannot go stale. Exit 0 when clean, 1 when a function is too long (each named with
path:line, its length and the fix), 2 on bad use, 77 (ctest: skipped) outside a git checkout.
"""
import os
import re
import subprocess
import sys
import tempfile

LIMIT = 120
FOLDERS = ("coordinator", "worker", "client", "common")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOW = os.path.join(ROOT, "scripts", "function_length_allow.txt")


def blank(text):
    """The text with comments and literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    keep = lambda s: "".join(c if c == "\n" else " " for c in s)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(keep(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(keep(text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(keep(text[i:j]))
            i = j
        elif c in "\"'":
            # A digit separator (1'000'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(keep(text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


SCOPE_WORDS = re.compile(r"\b(namespace|class|struct|union|enum)\b")


def functions(text):
    """(name, first line, last line) of each function defined at namespace or class scope."""
    code = blank(text)
    found = []
    stack = []  # 'scope' (namespace, class, extern "C") or 'other'
    decl_start = 0  # where the current declaration began (after the last ; { or })
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "#" and (i == 0 or code[i - 1] == "\n"):  # a preprocessor line
            j = i
            while True:
                j = code.find("\n", j)
                if j < 0 or code[j - 1] != "\\":
                    break
                j += 1
            i = n if j < 0 else j
            decl_start = i
            continue
        if c == ";" and (not stack or stack[-1] == "scope"):
            decl_start = i + 1
        elif c == "}" and (not stack or stack[-1] == "scope"):
            if stack:
                stack.pop()
            decl_start = i + 1
        elif c == "{" and (not stack or stack[-1] == "scope"):
            decl = code[decl_start:i]
            head = decl.split("(")[0]
            if SCOPE_WORDS.search(head) or re.search(r'\bextern\s*$', head) or "(" not in decl:
                stack.append("scope")
                decl_start = i + 1
            elif re.search(r"=\s*$", decl) or re.search(r"\)\s*=", decl.split("(")[0] + ")"):
                stack.append("scope")  # an initializer at scope level: no function
                decl_start = i + 1
            else:
                # A function body: skip to its matching brace.
                depth, j = 0, i
                while j < n:
                    if code[j] == "{":
                        depth += 1
                    elif code[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                start = decl_start + (len(decl) - len(decl.lstrip()))
                first = code.count("\n", 0, start) + 1
                last = code.count("\n", 0, j) + 1
                sig = " ".join(decl.split())
                name = re.findall(r"([~\w:]+(?:operator\S*)?)\s*\(", sig)
                found.append((name[0] if name else sig[:40], first, last))
                i = j + 1
                decl_start = i
                continue
        i += 1
    return found


def load_allow():
    allow = {}
    if not os.path.exists(ALLOW):
        return allow
    for lineno, line in enumerate(open(ALLOW, encoding="utf-8"), 1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        parts = body.split()
        if len(parts) != 2 or "#" not in line:
            sys.exit(f"{ALLOW}:{lineno}: want 'path function-name  # why', got {line.strip()!r}")
        allow[(parts[0], parts[1])] = lineno
    return allow


def long_functions(paths, limit):
    out = []
    for path in paths:
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name, first, last in functions(text):
            length = last - first + 1
            if length > limit:
                out.append((path, name, first, length))
    return out


def tracked():
    try:
        files = subprocess.run(["git", "ls-files", "--"] + [f + "/*.cc" for f in FOLDERS] +
                               [f + "/*.h" for f in FOLDERS], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        print("function_length: not a git checkout (the files checked are git's tracked "
              "files); skipped")
        sys.exit(77)
    return [f for f in files if os.path.exists(os.path.join(ROOT, f))]


def self_test():
    body = lambda k: "int F%d(int x) {\n" % k + "  x += 1;\n" * (k - 2) + "}\n"
    text = ('// a comment { with a brace\nnamespace a {\nconst char* s = "}{";\n'
            'struct S {\n  int M(int y) const {\n    return y;\n  }\n};\n' + body(121) + body(120) +
            'int Lambdas(int z) {\n  auto f = [](int q) { return q; };\n  return f(z);\n}\n'
            'std::string R() { return R"x(})x"; }\n}  // namespace a\n')
    with tempfile.NamedTemporaryFile("w", suffix=".cc", dir=ROOT, delete=False) as f:
        f.write(text)
    try:
        rel = os.path.relpath(f.name, ROOT)
        found = {name: (first, last) for name, first, last in functions(text)}
        want = {"M", "F121", "F120", "Lambdas", "R"}
        if set(found) != want:
            print(f"function_length self-test: found {sorted(found)}, want {sorted(want)}")
            return False
        too_long = long_functions([rel], LIMIT)
        if [(n, l) for _, n, _, l in too_long] != [("F121", 121)]:
            print(f"function_length self-test: over {LIMIT}: {too_long}, want only F121 (121)")
            return False
    finally:
        os.unlink(f.name)
    print("function_length self-test: a 121-line function is found, a 120-line one passes")
    return True


def main(argv):
    if argv[:1] == ["--self-test"]:
        return 0 if self_test() else 1
    if argv[:1] == ["--list"]:
        limit = int(argv[1]) if len(argv) > 1 else 60
        for path, name, first, length in sorted(long_functions(tracked(), limit),
                                                key=lambda r: -r[3]):
            print(f"{length:5d}  {path}:{first}  {name}")
        return 0
    if any(a.startswith("-") for a in argv):
        print(__doc__)
        return 2
    paths = argv or tracked()
    allow = load_allow()
    status = 0
    used = set()
    for path, name, first, length in long_functions(paths, LIMIT):
        short = name.split("::")[-1]
        key = next((k for k in ((path, name), (path, short)) if k in allow), None)
        if key is not None:
            used.add(key)
            continue
        print(f"{path}:{first}: {name} is {length} lines, over {LIMIT}: split it into steps "
              f"(or, for a table that reads as one, add it with the reason to "
              f"scripts/function_length_allow.txt)")
        status = 1
    if not argv:
        for key, lineno in sorted(allow.items(), key=lambda kv: kv[1]):
            if key not in used:
                print(f"scripts/function_length_allow.txt:{lineno}: {key[0]} {key[1]} is no longer "
                      f"over {LIMIT} lines (or is gone): remove the entry")
                status = 1
    if status == 0:
        print(f"function_length: no function over {LIMIT} lines in {len(paths)} files "
              f"({len(used)} allowed: scripts/function_length_allow.txt)")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
