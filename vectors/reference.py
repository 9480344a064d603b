#!/usr/bin/env python3
"""The reference key derivation, and a check of the key vectors against it.

    python3 vectors/reference.py             checks every line of vectors/keys.jsonl
    python3 vectors/reference.py FILE        checks every line of FILE
    python3 vectors/reference.py --batch     reads cases from stdin, writes their keys to stdout

A vector is one JSON object per line: tool, scope, args (a JSON object), and the canonical text
and key the reference derives. The check recomputes both and exits 1 on any difference.

In --batch mode each input line is an object {"tool", "scope", "args"} where "args" is the
arguments' JSON *text*, parsed here by json.loads exactly as a Python service would parse a
model's tool call; each output line is {"canonical", "key"}. The differential test of idem-cli
feeds it thousands of random cases in one run.

Standard library only, so that it runs wherever python3 does.
"""

import hashlib
import json
import os
import sys


def canonical(args):
    return json.dumps(args, sort_keys=True, separators=(",", ":"))


def derive(tool, scope, args):
    text = canonical(args)
    material = f"{scope}\0{tool}\0{text}".encode("utf-8")
    return text, hashlib.sha256(material).hexdigest()[:32]


def check(path):
    failures = 0
    count = 0
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            vector = json.loads(line)
            count += 1
            text, key = derive(vector["tool"], vector["scope"], vector["args"])
            for field, want in (("canonical", text), ("key", key)):
                if vector[field] != want:
                    failures += 1
                    print(
                        f"{path}:{number}: {field} is {vector[field]!r}, "
                        f"the reference derives {want!r}",
                        file=sys.stderr,
                    )
    if count == 0:
        print(f"{path} holds no vectors", file=sys.stderr)
        return 1
    if failures:
        print(f"{failures} difference(s) in {count} vectors of {path}", file=sys.stderr)
        return 1
    print(f"{count} vectors of {path} match the reference derivation")
    return 0


def batch():
    out = sys.stdout
    # Bytes decoded here, not by the locale's encoding: the cases hold any Unicode text.
    for raw in sys.stdin.buffer:
        line = raw.decode("utf-8")
        if not line.strip():
            continue
        case = json.loads(line)
        text, key = derive(case["tool"], case["scope"], json.loads(case["args"]))
        out.write(json.dumps({"canonical": text, "key": key}) + "\n")
    return 0


def main(argv):
    if argv[1:] == ["--batch"]:
        return batch()
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    default = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keys.jsonl")
    return check(argv[1] if len(argv) == 2 else default)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
