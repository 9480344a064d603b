#!/usr/bin/env python3
"""The reference key derivation, and a check of the key vectors against it.

    python3 vectors/reference.py             checks vectors/keys.jsonl and vectors/flattened.jsonl
    python3 vectors/reference.py FILE        checks every line of FILE
    python3 vectors/reference.py --batch     reads cases from stdin, writes their keys to stdout

A vector is one JSON object per line: tool, scope, args (a JSON object), and the canonical text
and key the reference derives. The check recomputes both and exits 1 on any difference.

A vector of a flattened tool (`#[idem(flatten)]`, such as an rmcp `Parameters<T>`) has
"arguments" (the object a client sends as a tools/call's `arguments`) and "ignore" (the names
given to the tool's `ignore = [...]`) in place of "args": its key is derived over
`arguments_object(arguments, ignore)`, which leaves out every member whose value is null, at
every depth, and the ignored top-level members.

In --batch mode each input line is an object {"tool", "scope", "args"} (and, for a flattened
tool, "flatten": true and "ignore": [...]) where "args" is the arguments' JSON *text*, parsed here by json.loads exactly as a Python service would parse a
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


def without_nulls(value):
    """The value with every object member whose value is null left out, at every depth; array
    items stay where they are, null or not."""
    if isinstance(value, dict):
        return {name: without_nulls(item) for name, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_nulls(item) for item in value]
    return value


def arguments_object(arguments, ignore=()):
    """What the key of a flattened tool is over: its arguments without nulls and ignored fields.

    Pass the arguments as the tool's parameter type would write them back: a field the type does
    not know is dropped by it, an alias is written under the field's own name, a default left out
    is written, and a float field sent as `10` is the float 10.0.
    """
    return {name: item for name, item in without_nulls(arguments).items() if name not in ignore}


def derive(tool, scope, args):
    text = canonical(args)
    material = f"{scope}\0{tool}\0{text}".encode("utf-8")
    return text, hashlib.sha256(material).hexdigest()[:32]


def args_of(vector):
    """The object a vector's key is derived over."""
    if "arguments" in vector:
        return arguments_object(vector["arguments"], vector.get("ignore", ()))
    return vector["args"]


def check(path):
    failures = 0
    count = 0
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            vector = json.loads(line)
            count += 1
            text, key = derive(vector["tool"], vector["scope"], args_of(vector))
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
        args = json.loads(case["args"])
        if case.get("flatten"):
            args = arguments_object(args, case.get("ignore", ()))
        text, key = derive(case["tool"], case["scope"], args)
        out.write(json.dumps({"canonical": text, "key": key}) + "\n")
    return 0


def main(argv):
    if argv[1:] == ["--batch"]:
        return batch()
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    if len(argv) == 2:
        return check(argv[1])
    here = os.path.dirname(os.path.abspath(__file__))
    return max(check(os.path.join(here, name)) for name in ("keys.jsonl", "flattened.jsonl"))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
