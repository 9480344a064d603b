//! What the README tells a user to paste works with this checkout: its recipe is
//! `examples/shared_desk.rs` word for word, which the workspace's build compiles (with
//! `--features idem/rmcp,idem/sqlite`, as CI builds it).

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
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
