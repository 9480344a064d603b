//! What the READMEs tell a user to paste works with this checkout.
//!
//! Every dependency line resolves against it: each ```toml block of README.md and of the member
//! crates' READMEs becomes the `[dependencies]` of a throwaway project, with the workspace's own
//! packages patched to their directories here (so a version a user writes, `idem-agent =
//! "0.1"`, must match the checkout's), and `cargo metadata` resolves it, which needs no
//! compiling. A wrong package name, an unknown feature or a version the workspace does not have
//! fails here, naming the README and the line.
//!
//! A line with a `path` is written for a project beside a clone named `idem`
//! (`path = "../idem"`): the project is made beside a link named `idem` to this checkout, so the
//! line is resolved as written. Crates from crates.io keep their versions, and resolve from what
//! the workspace's build has already downloaded (`--offline`), with the workspace's Cargo.lock as
//! a start; so a README's line for a crate from crates.io asks for features the workspace uses.
//! Resolving reads the manifest of every package in the graph, for every platform, and a build
//! downloads only this one's: where one is missing, it is fetched from the registry once.
//!
//! The README's recipe is `examples/shared_desk.rs` word for word, which the workspace's build
//! compiles (with `--features idem/rmcp,idem/sqlite`, as CI builds it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The READMEs a user reads, relative to the workspace's root.
const READMES: &[&str] = &[
    "README.md",
    "idem-cli/README.md",
    "idem-macros/README.md",
    "idem-postgres/README.md",
    "idem-reqwest/README.md",
    "idem-runtime/README.md",
];

/// The workspace's published packages and their directories, which a README's version line of
/// the package resolves to.
const PACKAGES: &[(&str, &str)] = &[
    ("idem-agent", "."),
    ("idem-agent-runtime", "idem-runtime"),
    ("idem-agent-macros", "idem-macros"),
    ("idem-agent-postgres", "idem-postgres"),
    ("idem-agent-reqwest", "idem-reqwest"),
    ("idem-agent-cli", "idem-cli"),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A ```toml block of a README: where it starts, and its dependency lines.
struct Block {
    readme: &'static str,
    line: usize,
    dependencies: Vec<String>,
}

/// The dependency lines of every ```toml block in `text`: the lines under `[dependencies]`
/// (or any `…dependencies]` table), comments and blank lines left out.
fn blocks(readme: &'static str, text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut current: Option<(Block, bool)> = None;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        match &mut current {
            None if trimmed.starts_with("```toml") => {
                let block = Block { readme, line: number + 1, dependencies: Vec::new() };
                current = Some((block, false));
            }
            None => {}
            Some(_) if trimmed.starts_with("```") => {
                let (block, _) = current.take().expect("in a block");
                blocks.push(block);
            }
            Some((block, in_dependencies)) => {
                let line = trimmed.split(" #").next().unwrap_or_default().trim();
                if line.starts_with('[') {
                    *in_dependencies = line.ends_with("dependencies]");
                } else if *in_dependencies && !line.is_empty() && !line.starts_with('#') {
                    block.dependencies.push(line.to_owned());
                }
            }
        }
    }
    blocks
}

/// A throwaway project beside a link named `idem` to the checkout, depending on `lines`.
fn project(parent: &Path, name: &str, lines: &[String]) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "").unwrap();
    let mut manifest = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [workspace]\n\n[dependencies]\n{}\n\n[patch.crates-io]\n",
        lines.join("\n")
    );
    for (package, dir) in PACKAGES {
        // Through the link, as the README's path lines are: one path for each package.
        let path = parent.join("idem").join(dir);
        manifest.push_str(&format!("{package} = {{ path = {:?} }}\n", path.to_str().unwrap()));
    }
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    dir
}

/// `cargo metadata` on the project: `Err` with cargo's message when it does not resolve. Offline
/// first, from what the workspace's own build fetched; a machine that never fetched a package
/// the README's lines reach (one for another platform, say) fetches it from the registry once.
fn resolve(project: &Path) -> Result<(), String> {
    let offline = metadata(project, true);
    match &offline {
        Err(cargo) if cargo.contains("failed to download") => metadata(project, false),
        _ => offline,
    }
}

fn metadata(project: &Path, offline: bool) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.arg("metadata");
    if offline {
        command.arg("--offline");
    }
    let output = command
        .args(["--format-version", "1", "--manifest-path"])
        .arg(project.join("Cargo.toml"))
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("cargo runs");
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[cfg(unix)]
#[test]
fn every_readme_dependency_line_resolves_against_the_checkout() {
    let parent = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root(), parent.path().join("idem")).unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for readme in READMES {
        let text = std::fs::read_to_string(root().join(readme)).unwrap();
        for (index, block) in blocks(readme, &text).into_iter().enumerate() {
            if block.dependencies.is_empty() {
                continue;
            }
            checked += block.dependencies.len();
            let failed_before = failures.len();
            let name = format!("readme-{}-{index}", readme.replace(['/', '.'], "-").to_lowercase());
            if resolve(&project(parent.path(), &name, &block.dependencies)).is_ok() {
                continue;
            }
            // The block does not resolve: find the lines that do not, each alone.
            for (number, line) in block.dependencies.iter().enumerate() {
                let (alone, lines) = (format!("{name}-{number}"), std::slice::from_ref(line));
                if let Err(cargo) = resolve(&project(parent.path(), &alone, lines)) {
                    failures.push(format!(
                        "{}, the ```toml block at line {}: `{line}` does not resolve:\n{cargo}",
                        block.readme, block.line
                    ));
                }
            }
            if failures.len() == failed_before {
                failures.push(format!(
                    "{}, the ```toml block at line {}: its lines resolve one by one, not \
                     together: {:?}",
                    block.readme, block.line, block.dependencies
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 8, "only {checked} dependency lines found in the READMEs");
}

#[test]
fn no_dependency_line_is_left_in_prose() {
    // A line a user pastes belongs in a ```toml block, where the test above checks it.
    for readme in READMES {
        let text = std::fs::read_to_string(root().join(readme)).unwrap();
        let mut in_block = false;
        for (number, line) in text.lines().enumerate() {
            if line.trim().starts_with("```") {
                in_block = !in_block;
                continue;
            }
            if in_block {
                continue;
            }
            for package in PACKAGES.iter().map(|(package, _)| package) {
                for pasted in [format!("`{package} = "), format!("`{package} ={{")] {
                    assert!(
                        !line.contains(&pasted),
                        "{readme}:{}: a dependency line in prose; put it in a ```toml block",
                        number + 1
                    );
                }
            }
        }
    }
}

/// The heading of the README's recipe, whose first ```rust block is the example.
const RECIPE: &str = "## Recipe: an MCP server that several processes share";

#[test]
fn the_readme_recipe_is_the_shared_desk_example() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let example = std::fs::read_to_string(root().join("examples/shared_desk.rs")).unwrap();
    let (_, recipe) = readme.split_once(RECIPE).expect("the README has the recipe");
    let (_, code) = recipe.split_once("```rust\n").expect("the recipe has a ```rust block");
    let (code, _) = code.split_once("\n```").expect("the block ends");
    // The example below its `//!` header, which says how to run it from the repository.
    let body: Vec<&str> = example.lines().skip_while(|line| line.starts_with("//!")).collect();
    assert_eq!(
        code.trim(),
        body.join("\n").trim(),
        "the README's recipe and examples/shared_desk.rs differ: change both"
    );
}
