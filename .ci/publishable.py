"""Reads `cargo metadata --no-deps` on stdin and prints one line per publishable workspace
member (`publish` not false): its name, version and rust-version. Exits 1, naming the crate and
the field, when a publishable member lacks what crates.io and docs.rs show a user."""

import json
import sys

REQUIRED = ["description", "license", "repository", "documentation", "readme", "rust_version"]
LISTS = ["keywords", "categories"]

metadata = json.load(sys.stdin)
members = set(metadata["workspace_members"])
missing = []
placeholders = []
for package in metadata["packages"]:
    if package["id"] not in members or package["publish"] == []:
        continue
    name = package["name"]
    for field in REQUIRED:
        if not package.get(field):
            missing.append(f"{name}: no `{field.replace('_', '-')}` in its Cargo.toml")
    for field in LISTS:
        if not package.get(field):
            missing.append(f"{name}: no `{field}` in its Cargo.toml (at least one)")
    if "example.invalid" in (package.get("repository") or ""):
        placeholders.append(name)
    print(name, package["version"], package.get("rust_version") or "")
if placeholders:
    print(f"note: the repository of {', '.join(placeholders)} is still a placeholder on "
          "example.invalid; the owners set the real one in the root Cargo.toml before "
          "publishing", file=sys.stderr)
if missing:
    print("a publishable crate (one without `publish = false`) needs:", file=sys.stderr)
    for line in missing:
        print(f"  {line}", file=sys.stderr)
    sys.exit(1)
