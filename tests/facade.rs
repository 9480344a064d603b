//! The facade's public surface: every path a user can name through `idem::`, listed from the
//! sources, so that the surface stays small (issue 41, and STYLE.md's "A small public surface").
//!
//! The listing starts at `src/lib.rs` and follows each `pub use` and `pub mod` into the crate
//! that defines the item (`idem-runtime`, `idem-macros`), through every re-export on the way,
//! counting each name under each module it can be reached by. An item or module marked
//! `#[doc(hidden)]` is not counted (`idem::__private` is the macros' contract, not an API), nor
//! are methods, fields and variants: they belong to their type. Items behind a feature are
//! counted as if every feature were on, marked with their `cfg`.
//!
//! `cargo test --test facade -- --nocapture` prints the listing.
//!
//! The test fails when
//! - the facade lists more than [`LIMIT`] paths;
//! - one item is public at two paths (a duplicate re-export: each item has one home);
//! - a listed item has no doc comment;
//! - a listed enum, or a struct whose fields are all public (built with a literal), is not
//!   `#[non_exhaustive]`, unless [`CLOSED`] says why it never grows.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// At most this many public paths. Issue 41 asked for "at most about 70": a user who reads the
/// docs' index should see what idem is (the attributes, the call, the key, the error, the
/// stores) and where the rest lives (`idem::admin`, `idem::history`, `idem::mcp`, …), not 129
/// names. What only a store implementor needs is `idem-agent-runtime`'s (`idem_runtime::store`).
/// Raising the limit is a decision about the API, to be argued in the commit that does it.
const LIMIT: usize = 70;

/// Listed types that are exhaustive on purpose: (path, why it never grows).
const CLOSED: &[(&str, &str)] = &[];

/// A crate of the workspace the facade re-exports: its library name and its root file.
const CRATES: &[(&str, &str)] = &[
    ("idem", "src/lib.rs"),
    ("idem_runtime", "idem-runtime/src/lib.rs"),
    ("idem_macros", "idem-macros/src/lib.rs"),
];

#[test]
fn facade_is_small_documented_and_has_one_path_per_item() {
    let surface = Surface::list();
    let mut problems = String::new();
    if surface.paths.len() > LIMIT {
        let _ = writeln!(
            problems,
            "the facade lists {} public paths, more than {LIMIT}: move what only store \
             implementors or operators need into its module, or hide what only the macros need \
             in `__private`",
            surface.paths.len()
        );
    }
    let mut homes: BTreeMap<&Definition, Vec<&str>> = BTreeMap::new();
    for path in &surface.paths {
        homes.entry(&path.definition).or_default().push(&path.path);
    }
    for (definition, paths) in &homes {
        if paths.len() > 1 {
            let _ = writeln!(
                problems,
                "{definition} is public at {} paths ({}): keep one",
                paths.len(),
                paths.join(", ")
            );
        }
    }
    for path in &surface.paths {
        if !path.documented {
            let _ = writeln!(problems, "{} has no doc comment", path.path);
        }
        if path.open && !CLOSED.iter().any(|(closed, _)| *closed == path.path) {
            let _ = writeln!(
                problems,
                "{} can grow but is not #[non_exhaustive]: mark it, or add it to CLOSED with the \
                 reason it never grows",
                path.path
            );
        }
    }
    for (closed, _) in CLOSED {
        if !surface.paths.iter().any(|path| path.path == *closed && path.open) {
            let _ = writeln!(problems, "CLOSED names {closed}, which is not an open public type");
        }
    }
    println!("{}", surface.render());
    assert!(surface.paths.len() > 20, "the listing found only {} paths", surface.paths.len());
    assert!(problems.is_empty(), "{problems}");
}

/// One public path of the facade.
struct PublicPath {
    /// `idem::…`.
    path: String,
    /// `fn`, `struct`, `mod`, `macro`, …
    kind: &'static str,
    /// The `cfg`s on the way, as written.
    cfgs: Vec<String>,
    definition: Definition,
    documented: bool,
    /// An enum, or a struct of public fields only, without `#[non_exhaustive]`.
    open: bool,
}

/// Where an item is defined: its crate, module and name.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Definition {
    krate: String,
    module: Vec<String>,
    name: String,
}

impl std::fmt::Display for Definition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.krate)?;
        for segment in &self.module {
            write!(f, "::{segment}")?;
        }
        if !self.name.is_empty() {
            write!(f, "::{}", self.name)?;
        }
        Ok(())
    }
}

/// A module: its crate, its path from the crate root, its items, and the folder of its
/// `mod name;` files.
#[derive(Clone)]
struct Module {
    krate: String,
    path: Vec<String>,
    items: Vec<syn::Item>,
    /// The module's own doc comment (`//!` in its file, or `///` on its `mod`).
    documented: bool,
    dir: PathBuf,
}

/// What a name resolves to.
enum Target {
    Module(Module),
    Item {
        definition: Definition,
        item: Box<syn::Item>,
    },
    /// A path into a crate outside the workspace (`rusqlite`): one name, not followed.
    External(String),
}

#[derive(Default)]
struct Surface {
    paths: Vec<PublicPath>,
}

impl Surface {
    fn list() -> Surface {
        let mut surface = Surface::default();
        let root = root_module("idem");
        surface.walk(&root, &["idem".to_owned()], &[], 0);
        surface.paths.sort_by(|a, b| a.path.cmp(&b.path));
        surface
    }

    fn render(&self) -> String {
        let mut text = format!("{} public paths:\n", self.paths.len());
        for path in &self.paths {
            let cfg = if path.cfgs.is_empty() {
                String::new()
            } else {
                format!("  #[cfg({})]", path.cfgs.join(", "))
            };
            let _ = writeln!(text, "{:<8}{}{cfg}", path.kind, path.path);
        }
        text
    }

    /// Lists the public items of `module`, reached as `prefix`.
    fn walk(&mut self, module: &Module, prefix: &[String], cfgs: &[String], depth: usize) {
        assert!(depth < 16, "a cycle of public modules through {}", prefix.join("::"));
        for item in &module.items {
            let attrs = attrs(item);
            if hidden(attrs) || cfg_test(attrs) {
                continue;
            }
            let mut cfgs = cfgs.to_vec();
            cfgs.extend(cfg_of(attrs));
            let exported_macro = matches!(item, syn::Item::Macro(m)
                if m.attrs.iter().any(|a| a.path().is_ident("macro_export")));
            if !exported_macro && !public(item) {
                continue;
            }
            match item {
                syn::Item::Use(import) => {
                    let mut leaves = Vec::new();
                    flatten(&import.tree, &mut Vec::new(), &mut leaves);
                    for (name, path) in leaves {
                        let Some(name) = name else {
                            let Target::Module(inner) = resolve(module, &path) else {
                                panic!("a glob over {} is not a module", path.join("::"));
                            };
                            self.walk(&inner, prefix, &cfgs, depth + 1);
                            continue;
                        };
                        let own_doc = documented(attrs);
                        self.add(resolve(module, &path), prefix, &name, &cfgs, own_doc, depth);
                    }
                }
                syn::Item::Mod(declared) => {
                    let name = declared.ident.to_string();
                    let target = Target::Module(child(module, declared));
                    self.add(target, prefix, &name, &cfgs, false, depth);
                }
                other => {
                    let name = defined_name(other).expect("a public item has a name");
                    let definition = Definition {
                        krate: module.krate.clone(),
                        module: module.path.clone(),
                        name: name.clone(),
                    };
                    let target = Target::Item { definition, item: Box::new(other.clone()) };
                    self.add(target, prefix, &name, &cfgs, false, depth);
                }
            }
        }
    }

    fn add(
        &mut self,
        target: Target,
        prefix: &[String],
        name: &str,
        cfgs: &[String],
        own_doc: bool,
        depth: usize,
    ) {
        let mut path = prefix.to_vec();
        path.push(name.to_owned());
        let (kind, definition, documented, open) = match &target {
            Target::Module(module) => {
                let definition = Definition {
                    krate: module.krate.clone(),
                    module: module.path.clone(),
                    name: String::new(),
                };
                ("mod", definition, module.documented, false)
            }
            Target::Item { definition, item } => {
                (kind(item), definition.clone(), documented(attrs(item)), open(item))
            }
            Target::External(external) => {
                let definition =
                    Definition { krate: external.clone(), module: Vec::new(), name: String::new() };
                ("crate", definition, false, false)
            }
        };
        self.paths.push(PublicPath {
            path: path.join("::"),
            kind,
            cfgs: cfgs.to_vec(),
            definition,
            documented: documented || own_doc,
            open,
        });
        if let Target::Module(module) = target {
            self.walk(&module, &path, cfgs, depth + 1);
        }
    }
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn root_module(krate: &str) -> Module {
    let (_, file) = CRATES.iter().find(|(name, _)| *name == krate).unwrap();
    let file = workspace().join(file);
    let syntax = parse(&file);
    Module {
        krate: krate.to_owned(),
        path: Vec::new(),
        documented: documented(&syntax.attrs),
        items: syntax.items,
        dir: file.parent().unwrap().to_owned(),
    }
}

fn parse(file: &Path) -> syn::File {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{file:?}: {e}"))
}

/// The module `declared` declares inside `parent`.
fn child(parent: &Module, declared: &syn::ItemMod) -> Module {
    let name = declared.ident.to_string();
    let mut path = parent.path.clone();
    path.push(name.clone());
    let dir = parent.dir.join(&name);
    match &declared.content {
        Some((_, items)) => Module {
            krate: parent.krate.clone(),
            path,
            items: items.clone(),
            documented: documented(&declared.attrs),
            dir,
        },
        None => {
            let file =
                [parent.dir.join(format!("{name}.rs")), parent.dir.join(&name).join("mod.rs")]
                    .into_iter()
                    .find(|candidate| candidate.exists())
                    .unwrap_or_else(|| panic!("no file for `mod {name};` in {:?}", parent.dir));
            let syntax = parse(&file);
            Module {
                krate: parent.krate.clone(),
                path,
                documented: documented(&syntax.attrs) || documented(&declared.attrs),
                items: syntax.items,
                dir,
            }
        }
    }
}

/// The parent of `module`, found again from its crate's root.
fn parent(module: &Module) -> Module {
    let mut path = module.path.clone();
    path.pop().expect("`super` at a crate root");
    module_at(&module.krate, &path)
}

fn module_at(krate: &str, path: &[String]) -> Module {
    let mut module = root_module(krate);
    for segment in path {
        let declared = module
            .items
            .iter()
            .find_map(|item| match item {
                syn::Item::Mod(declared)
                    if declared.ident == segment && !cfg_test(&declared.attrs) =>
                {
                    Some(declared.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| {
                panic!("no module {segment} in {krate}::{}", module.path.join("::"))
            });
        module = child(&module, &declared);
    }
    module
}

/// Resolves `path`, written in `module`.
fn resolve(module: &Module, path: &[String]) -> Target {
    let (mut current, rest) = match path[0].as_str() {
        "crate" => (root_module(&module.krate), &path[1..]),
        "self" => (module.clone(), &path[1..]),
        "super" => (parent(module), &path[1..]),
        krate if CRATES.iter().any(|(name, _)| *name == krate) => (root_module(krate), &path[1..]),
        _ => (module.clone(), path),
    };
    for (index, segment) in rest.iter().enumerate() {
        let last = index + 1 == rest.len();
        match segment.as_str() {
            "super" => {
                current = parent(&current);
                continue;
            }
            "self" => continue,
            _ => {}
        }
        match lookup(&current, segment, !last) {
            Some(Target::Module(found)) => current = found,
            Some(item) if last => return item,
            Some(Target::Item { definition, .. }) => {
                // An enum's variant or an associated item: not a path the listing follows.
                panic!("{} goes through the item {definition}", path.join("::"))
            }
            Some(Target::External(external)) => {
                return Target::External(format!("{external}::{}", rest[index + 1..].join("::")))
            }
            None if index == 0 && current.path == module.path && current.krate == module.krate => {
                // Not declared here: a crate outside the workspace (`pub use rusqlite;`).
                return Target::External(rest.join("::"));
            }
            None => panic!("cannot resolve {} in {}", path.join("::"), current.krate),
        }
    }
    Target::Module(current)
}

/// The item `name` of `module`, declared there or imported. A name can be a module and an item
/// at once (`mod retry;` beside `pub fn retry`): the public one is the one a path reaches, and a
/// path's inner segment (`in_path`) names a module.
fn lookup(module: &Module, name: &str, in_path: bool) -> Option<Target> {
    if in_path {
        let declared = module.items.iter().find_map(|item| match item {
            syn::Item::Mod(declared) if declared.ident == name && !cfg_test(&declared.attrs) => {
                Some(declared)
            }
            _ => None,
        });
        if let Some(declared) = declared {
            return Some(Target::Module(child(module, declared)));
        }
    }
    let mut found = Vec::new();
    for item in &module.items {
        if cfg_test(attrs(item)) {
            continue;
        }
        let target = match item {
            syn::Item::Mod(declared) if declared.ident == name => {
                Target::Module(child(module, declared))
            }
            syn::Item::Use(import) => {
                let mut leaves = Vec::new();
                flatten(&import.tree, &mut Vec::new(), &mut leaves);
                match leaves.into_iter().find(|(bound, _)| bound.as_deref() == Some(name)) {
                    // `pub use rusqlite;`: the crate of that name, not this import again.
                    Some((_, path)) if path == [name] => Target::External(name.to_owned()),
                    Some((_, path)) => resolve(module, &path),
                    None => continue,
                }
            }
            other if defined_name(other).as_deref() == Some(name) => {
                let definition = Definition {
                    krate: module.krate.clone(),
                    module: module.path.clone(),
                    name: name.to_owned(),
                };
                Target::Item { definition, item: Box::new(other.clone()) }
            }
            _ => continue,
        };
        found.push((public(item), target));
    }
    let index = found.iter().position(|(public, _)| *public).unwrap_or(0);
    (index < found.len()).then(|| found.swap_remove(index).1)
}

/// The leaves of a `use` tree: the name each binds (None for a glob) and its full path.
fn flatten(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    leaves: &mut Vec<(Option<String>, Vec<String>)>,
) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            flatten(&path.tree, prefix, leaves);
            prefix.pop();
        }
        syn::UseTree::Name(name) => {
            let mut path = prefix.clone();
            let bound = if name.ident == "self" {
                prefix.last().cloned().unwrap()
            } else {
                path.push(name.ident.to_string());
                name.ident.to_string()
            };
            leaves.push((Some(bound), path));
        }
        syn::UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            path.push(rename.ident.to_string());
            leaves.push((Some(rename.rename.to_string()), path));
        }
        syn::UseTree::Glob(_) => leaves.push((None, prefix.clone())),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                flatten(tree, prefix, leaves);
            }
        }
    }
}

fn defined_name(item: &syn::Item) -> Option<String> {
    Some(match item {
        syn::Item::Const(item) => item.ident.to_string(),
        syn::Item::Enum(item) => item.ident.to_string(),
        syn::Item::Fn(item) => item.sig.ident.to_string(),
        syn::Item::Macro(item) => item.ident.as_ref()?.to_string(),
        syn::Item::Static(item) => item.ident.to_string(),
        syn::Item::Struct(item) => item.ident.to_string(),
        syn::Item::Trait(item) => item.ident.to_string(),
        syn::Item::Type(item) => item.ident.to_string(),
        syn::Item::Union(item) => item.ident.to_string(),
        _ => return None,
    })
}

fn kind(item: &syn::Item) -> &'static str {
    match item {
        syn::Item::Const(_) => "const",
        syn::Item::Enum(_) => "enum",
        syn::Item::Fn(item) if is_proc_macro(&item.attrs) => "macro",
        syn::Item::Fn(_) => "fn",
        syn::Item::Macro(_) => "macro",
        syn::Item::Static(_) => "static",
        syn::Item::Struct(_) => "struct",
        syn::Item::Trait(_) => "trait",
        syn::Item::Type(_) => "type",
        syn::Item::Union(_) => "union",
        _ => "item",
    }
}

fn is_proc_macro(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        ["proc_macro", "proc_macro_attribute", "proc_macro_derive"]
            .iter()
            .any(|name| a.path().is_ident(name))
    })
}

/// An enum, or a struct whose fields are all public, that is not `#[non_exhaustive]`: a user
/// can match it exhaustively or build it with a literal, so a new variant or field breaks them.
fn open(item: &syn::Item) -> bool {
    let non_exhaustive =
        |attrs: &[syn::Attribute]| attrs.iter().any(|a| a.path().is_ident("non_exhaustive"));
    match item {
        syn::Item::Enum(item) => !non_exhaustive(&item.attrs),
        syn::Item::Struct(item) => {
            !non_exhaustive(&item.attrs)
                && !item.fields.is_empty()
                && item.fields.iter().all(|field| matches!(field.vis, syn::Visibility::Public(_)))
        }
        _ => false,
    }
}

fn attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(item) => &item.attrs,
        syn::Item::Enum(item) => &item.attrs,
        syn::Item::ExternCrate(item) => &item.attrs,
        syn::Item::Fn(item) => &item.attrs,
        syn::Item::ForeignMod(item) => &item.attrs,
        syn::Item::Impl(item) => &item.attrs,
        syn::Item::Macro(item) => &item.attrs,
        syn::Item::Mod(item) => &item.attrs,
        syn::Item::Static(item) => &item.attrs,
        syn::Item::Struct(item) => &item.attrs,
        syn::Item::Trait(item) => &item.attrs,
        syn::Item::TraitAlias(item) => &item.attrs,
        syn::Item::Type(item) => &item.attrs,
        syn::Item::Union(item) => &item.attrs,
        syn::Item::Use(item) => &item.attrs,
        _ => &[],
    }
}

fn public(item: &syn::Item) -> bool {
    let vis = match item {
        syn::Item::Const(item) => &item.vis,
        syn::Item::Enum(item) => &item.vis,
        syn::Item::Fn(item) => &item.vis,
        syn::Item::Mod(item) => &item.vis,
        syn::Item::Static(item) => &item.vis,
        syn::Item::Struct(item) => &item.vis,
        syn::Item::Trait(item) => &item.vis,
        syn::Item::Type(item) => &item.vis,
        syn::Item::Union(item) => &item.vis,
        syn::Item::Use(item) => &item.vis,
        _ => return false,
    };
    matches!(vis, syn::Visibility::Public(_))
}

/// Written with a doc comment (`///`, `//!` or `#[doc = "…"]`), not only `#[doc(hidden)]`.
fn documented(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("doc") && matches!(a.meta, syn::Meta::NameValue(_)))
}

fn hidden(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("doc")
            && a.parse_args::<syn::Ident>().is_ok_and(|ident| ident == "hidden")
    })
}

fn cfg_of(attrs: &[syn::Attribute]) -> Vec<String> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .filter_map(|a| match &a.meta {
            syn::Meta::List(list) => Some(list.tokens.to_string()),
            _ => None,
        })
        .collect()
}

fn cfg_test(attrs: &[syn::Attribute]) -> bool {
    cfg_of(attrs).iter().any(|cfg| cfg == "test")
}
