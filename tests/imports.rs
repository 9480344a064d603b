//! No import cycles in the workspace, between files or between folders (DESIGN.md,
//! "Architecture").
//!
//! Every crate's `src/` tree is parsed with syn, from its `lib.rs` or `main.rs` through its `mod`
//! declarations. Each path that names something of the crate (`use crate::…`, `use super::…`,
//! `self::…`, a path through a module or an import in scope, in a `use` line, in code, or in a
//! macro's tokens) is resolved to the file of the module that defines what it names, through any
//! re-export on the way; that is an import from the file it is written in to that file. What a
//! parent module's file takes from its own submodules (its `mod` declarations, its re-exports,
//! its calls into them) is not counted: the parent is the face of its folder. What a submodule
//! takes from its parent is.
//!
//! The test fails on
//! - a path through a re-export of the crate root or of another folder (`crate::Key`,
//!   `crate::store::Change`, where `Change` is the lifecycle's): inside a crate, an import names
//!   the module that defines what it imports, or the folder that holds that module
//!   (`crate::lifecycle::Record`), so that a reader sees where the edge goes;
//! - a cycle of imports between files;
//! - a cycle between folders (a crate's top-level modules: `store/` with `store.rs` or
//!   `store/mod.rs`, and a top-level file such as `history.rs`), except through the imports of
//!   [`ALLOWED`], which may only shrink: one that no longer closes a cycle fails the test too;
//! - a path that starts at `crate`, `super` or `self` and that the test cannot resolve, so that
//!   nothing it cannot see passes unseen.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// Imports that close a cycle between folders: (from file, to file, why). Paths are relative to
/// the workspace. None is left: a store no longer starts what runs beside it (the engine's
/// opener does), and the list may only stay empty.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// A module of a crate: a file, or a `mod name { … }` written inside one.
struct Module {
    /// The file it is written in, relative to the workspace.
    file: String,
    /// Its path from the crate root (empty for the root).
    path: Vec<String>,
    parent: Option<usize>,
    /// The module of the file it is written in (itself, unless it is written inline).
    file_module: usize,
    children: BTreeMap<String, usize>,
    /// The names it defines: types, traits, functions, constants, statics, macros.
    items: BTreeSet<String>,
    /// Its `use` bindings: name (None for a glob) and path.
    imports: Vec<(Option<String>, Vec<String>, usize)>,
}

/// A path written in a module, to be resolved once every module is known.
struct Reference {
    module: usize,
    path: Vec<String>,
    line: usize,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// In a `use` item; `public` when it re-exports (any visibility but private).
    Use { public: bool, glob: bool },
    /// In code, or in a macro's tokens.
    Code,
}

/// What a path names: a module, an item defined in a module, or something of another crate
/// that a module re-exports (`crate::loom::Arc`).
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Module(usize),
    Item(usize),
    External,
}

struct Crate {
    modules: Vec<Module>,
    references: Vec<Reference>,
    /// `#[macro_export]` macros, which are named at the crate root: name → defining module.
    exported_macros: BTreeMap<String, usize>,
}

/// The imports found in the workspace, from file to file.
#[derive(Default)]
struct Graph {
    /// (from file, to file) → the lines that import, each with the path written.
    edges: BTreeMap<(String, String), Vec<(usize, String)>>,
    /// File → its folder.
    folders: BTreeMap<String, String>,
    /// Everything the checker refuses that is not a cycle.
    errors: Vec<String>,
}

#[test]
fn no_import_cycles_between_files_or_folders() {
    let graph = workspace_graph();
    let mut report = graph.errors.clone();

    let files = adjacency(graph.edges.keys().map(|(a, b)| (a.as_str(), b.as_str())));
    for component in strongly_connected(&files) {
        let cycle = shortest_cycle(&files, &component);
        let mut text = format!("files that import each other: {}\n", cycle.join(" → "));
        let on_cycle = |a: &str, b: &str| cycle.windows(2).any(|pair| pair == [a, b]);
        describe(&mut text, &graph, on_cycle);
        report.push(text);
    }

    let allowed: BTreeSet<(&str, &str)> = ALLOWED.iter().map(|&(a, b, _)| (a, b)).collect();
    let folder_edge = |(a, b): (&String, &String)| {
        let (fa, fb) = (&graph.folders[a], &graph.folders[b]);
        (fa != fb).then_some((fa.as_str(), fb.as_str()))
    };
    let all_folders = adjacency(graph.edges.keys().filter_map(|(a, b)| folder_edge((a, b))));
    let kept = adjacency(
        graph
            .edges
            .keys()
            .filter(|(a, b)| !allowed.contains(&(a.as_str(), b.as_str())))
            .filter_map(|(a, b)| folder_edge((a, b))),
    );
    for component in strongly_connected(&kept) {
        let cycle = shortest_cycle(&kept, &component);
        let mut text = format!("folders that import each other: {}\n", cycle.join(" → "));
        describe(&mut text, &graph, |a, b| {
            let (fa, fb) = (graph.folders[a].as_str(), graph.folders[b].as_str());
            cycle.windows(2).any(|pair| pair == [fa, fb]) && !allowed.contains(&(a, b))
        });
        report.push(text);
    }
    for &(from, to, _) in ALLOWED {
        let closes = graph.edges.contains_key(&(from.to_owned(), to.to_owned()))
            && graph
                .folders
                .get(from)
                .zip(graph.folders.get(to))
                .is_some_and(|(a, b)| a != b && reaches(&all_folders, b, a));
        if !closes {
            report.push(format!(
                "ALLOWED lists {from} → {to}, which no longer closes a cycle: remove it"
            ));
        }
    }

    assert!(report.is_empty(), "\n{}", report.join("\n"));
}

/// Every file import of the workspace's crates.
fn workspace_graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut graph = Graph::default();
    for dir in std::iter::once(".".to_owned()).chain(members(root)) {
        for main in ["src/lib.rs", "src/main.rs"] {
            let file = Path::new(&dir).join(main);
            if root.join(&file).exists() {
                let krate = Crate::load(root, &file);
                krate.add_to(&mut graph);
            }
        }
    }
    assert!(graph.folders.len() > 100, "the test found only {} files", graph.folders.len());
    graph
}

/// The workspace's members, from the root manifest's `members = [...]`.
fn members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("the root Cargo.toml lists the workspace members")
        .0;
    list.split(',')
        .map(|member| member.trim().trim_matches('"').to_owned())
        .filter(|member| !member.is_empty())
        .collect()
}

impl Crate {
    /// Parses the crate whose root file is `main` (relative to the workspace `root`).
    fn load(root: &Path, main: &Path) -> Crate {
        let mut krate =
            Crate { modules: Vec::new(), references: Vec::new(), exported_macros: BTreeMap::new() };
        let syntax = parse(root, main);
        let dir = main.parent().unwrap().to_owned();
        krate.add_module(root, None, None, main, dir, &syntax.items);
        krate
    }

    /// Adds the module written as `items` in `file`, whose `mod name;` files are in `dir`.
    fn add_module(
        &mut self,
        root: &Path,
        parent: Option<usize>,
        name: Option<&str>,
        file: &Path,
        dir: PathBuf,
        items: &[syn::Item],
    ) -> usize {
        let id = self.modules.len();
        let mut path = parent.map_or_else(Vec::new, |p| self.modules[p].path.clone());
        path.extend(name.map(str::to_owned));
        let file_name = file.to_string_lossy().trim_start_matches("./").to_owned();
        let file_module = match parent {
            Some(p) if self.modules[p].file == file_name => self.modules[p].file_module,
            _ => id,
        };
        self.modules.push(Module {
            file: file_name,
            path,
            parent,
            file_module,
            children: BTreeMap::new(),
            items: BTreeSet::new(),
            imports: Vec::new(),
        });
        for item in items {
            match item {
                syn::Item::Mod(module) => {
                    let name = module.ident.to_string();
                    let child = match &module.content {
                        Some((_, inner)) => self.add_module(
                            root,
                            Some(id),
                            Some(&name),
                            file,
                            dir.join(&name),
                            inner,
                        ),
                        None => {
                            let (child_file, syntax) =
                                [dir.join(format!("{name}.rs")), dir.join(&name).join("mod.rs")]
                                    .into_iter()
                                    .find(|candidate| root.join(candidate).exists())
                                    .map(|found| {
                                        let syntax = parse(root, &found);
                                        (found, syntax)
                                    })
                                    .unwrap_or_else(|| {
                                        panic!("no file for `mod {name};` in {file:?}")
                                    });
                            let child_dir = dir.join(&name);
                            self.add_module(
                                root,
                                Some(id),
                                Some(&name),
                                &child_file,
                                child_dir,
                                &syntax.items,
                            )
                        }
                    };
                    self.modules[id].children.insert(name, child);
                }
                syn::Item::Use(import) => {
                    let public = !matches!(import.vis, syn::Visibility::Inherited);
                    let mut leaves = Vec::new();
                    flatten(&import.tree, &mut Vec::new(), &mut leaves);
                    for (name, path, line) in leaves {
                        let glob = name.is_none();
                        if name.as_deref() != Some("_") {
                            self.modules[id].imports.push((name, path.clone(), line));
                        }
                        self.references.push(Reference {
                            module: id,
                            path,
                            line,
                            kind: Kind::Use { public, glob },
                        });
                    }
                }
                other => {
                    if let Some(name) = defined_name(other) {
                        if let syn::Item::Macro(mac) = other {
                            if mac.attrs.iter().any(|a| a.path().is_ident("macro_export")) {
                                self.exported_macros.insert(name.clone(), id);
                            }
                        }
                        self.modules[id].items.insert(name);
                    }
                    let mut paths = Paths { module: id, found: &mut self.references };
                    paths.visit_item(other);
                }
            }
        }
        id
    }

    /// Resolves every reference into `graph`.
    fn add_to(&self, graph: &mut Graph) {
        for module in &self.modules {
            let file_module = &self.modules[module.file_module];
            let folder = match file_module.path.first() {
                Some(top) => {
                    format!("{}/src/{top}", file_module.file.split("/src/").next().unwrap())
                }
                None => module.file.clone(),
            };
            graph.folders.insert(module.file.clone(), folder);
        }
        for reference in &self.references {
            let written = reference.path.join("::");
            let from = &self.modules[reference.module];
            let at = format!("{}:{}", from.file, reference.line);
            let Some((target, through)) = self.resolve(reference.module, &reference.path, 0) else {
                if matches!(reference.path[0].as_str(), "crate" | "super" | "self") {
                    graph.errors.push(format!("{at}: cannot resolve `{written}`"));
                }
                continue;
            };
            let definer = match target {
                Target::Module(m) | Target::Item(m) => m,
                Target::External => continue,
            };
            // A path that starts at one of the writer's imports is checked at that import.
            let first = reference.path[0].as_str();
            let starts_at_import = !matches!(first, "crate" | "super" | "self")
                && !from.children.contains_key(first)
                && !from.items.contains(first);
            for (module, name) in through.iter().filter(|_| !starts_at_import) {
                let re_exporter = &self.modules[*module];
                // The writer's own imports are checked where they are written; a folder may
                // gather its own files' items (`crate::lifecycle::Record`), but not another
                // folder's, and the crate root's re-exports are for its users.
                if re_exporter.file == from.file
                    || (!re_exporter.path.is_empty() && self.is_ancestor(*module, definer))
                {
                    continue;
                }
                let defined = &self.modules[definer];
                graph.errors.push(format!(
                    "{at}: `{written}` reaches `{name}` through the re-export in {}; name \
                     `crate::{}`, which defines it ({})",
                    re_exporter.file,
                    defined.path.join("::"),
                    defined.file
                ));
            }
            // Naming a module is not yet an import of what it holds (the paths through it are),
            // unless it is re-exported or imported whole with a glob.
            let whole_module = matches!(reference.kind, Kind::Use { public: true, .. })
                || matches!(reference.kind, Kind::Use { glob: true, .. });
            if matches!(target, Target::Module(_)) && !whole_module {
                continue;
            }
            let to = &self.modules[definer];
            // The parent's file is the face of its folder: what it takes from its own
            // submodules is not counted, what they take from it is.
            if to.file == from.file || self.is_ancestor(from.file_module, to.file_module) {
                continue;
            }
            graph
                .edges
                .entry((from.file.clone(), to.file.clone()))
                .or_default()
                .push((reference.line, written));
        }
    }

    fn is_ancestor(&self, ancestor: usize, mut module: usize) -> bool {
        while let Some(parent) = self.modules[module].parent {
            if parent == ancestor {
                return true;
            }
            module = parent;
        }
        false
    }

    /// What `path`, written in `module`, names, and the re-exports it goes through (module,
    /// name).
    fn resolve(
        &self,
        module: usize,
        path: &[String],
        depth: usize,
    ) -> Option<(Target, Vec<(usize, String)>)> {
        if depth > 16 {
            return None;
        }
        let mut through = Vec::new();
        let mut at = module;
        let mut rest = path;
        match path.first()?.as_str() {
            "crate" => {
                at = self.root_of(module);
                rest = &path[1..];
            }
            "super" | "self" => {
                while let Some(segment) = rest.first() {
                    match segment.as_str() {
                        "super" => at = self.modules[at].parent?,
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            "Self" => return None,
            _ => {}
        }
        let mut target = Target::Module(at);
        for segment in rest {
            let Target::Module(current) = target else { break };
            target = self.lookup(current, segment, &mut through, depth)?;
        }
        Some((target, through))
    }

    /// The name `name` in module `module`: a submodule, an item, or an import.
    fn lookup(
        &self,
        module: usize,
        name: &str,
        through: &mut Vec<(usize, String)>,
        depth: usize,
    ) -> Option<Target> {
        let here = &self.modules[module];
        if let Some(&child) = here.children.get(name) {
            return Some(Target::Module(child));
        }
        if here.items.contains(name) {
            return Some(Target::Item(module));
        }
        if let (None, Some(&definer)) = (here.parent, self.exported_macros.get(name)) {
            return Some(Target::Item(definer));
        }
        for (bound, path, _) in &here.imports {
            if bound.as_deref() == Some(name) {
                through.push((module, name.to_owned()));
                return match self.resolve(module, path, depth + 1) {
                    Some((target, inner)) => {
                        through.extend(inner);
                        Some(target)
                    }
                    None => Some(Target::External),
                };
            }
        }
        for (bound, path, _) in &here.imports {
            if bound.is_none() {
                if let Some((Target::Module(glob), inner)) = self.resolve(module, path, depth + 1) {
                    let mut deeper = Vec::new();
                    if let Some(target) = self.lookup(glob, name, &mut deeper, depth + 1) {
                        through.push((module, name.to_owned()));
                        through.extend(inner);
                        through.extend(deeper);
                        return Some(target);
                    }
                }
            }
        }
        None
    }

    fn root_of(&self, mut module: usize) -> usize {
        while let Some(parent) = self.modules[module].parent {
            module = parent;
        }
        module
    }
}

fn parse(root: &Path, file: &Path) -> syn::File {
    let text = std::fs::read_to_string(root.join(file)).unwrap();
    syn::parse_file(&text).unwrap_or_else(|error| panic!("{file:?} does not parse: {error}"))
}

/// The name an item defines in its module's namespace, if any.
fn defined_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(item) => &item.ident,
        syn::Item::Enum(item) => &item.ident,
        syn::Item::Fn(item) => &item.sig.ident,
        syn::Item::Macro(item) => item.ident.as_ref()?,
        syn::Item::Static(item) => &item.ident,
        syn::Item::Struct(item) => &item.ident,
        syn::Item::Trait(item) => &item.ident,
        syn::Item::TraitAlias(item) => &item.ident,
        syn::Item::Type(item) => &item.ident,
        syn::Item::Union(item) => &item.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The leaves of a `use` tree: the name each binds (None for a glob), its path, its line.
fn flatten(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Option<String>, Vec<String>, usize)>,
) {
    let line = |ident: &syn::Ident| ident.span().start().line;
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            flatten(&path.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(name) => {
            let (bound, path) = if name.ident == "self" {
                (prefix.last().cloned(), prefix.clone())
            } else {
                let mut path = prefix.clone();
                path.push(name.ident.to_string());
                (Some(name.ident.to_string()), path)
            };
            out.push((bound, path, line(&name.ident)));
        }
        syn::UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            if rename.ident != "self" {
                path.push(rename.ident.to_string());
            }
            out.push((Some(rename.rename.to_string()), path, line(&rename.ident)));
        }
        syn::UseTree::Glob(glob) => {
            out.push((None, prefix.clone(), glob.star_token.span.start().line));
        }
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                flatten(tree, prefix, out);
            }
        }
    }
}

/// Collects the paths of an item's code (signatures, bodies, macro tokens) that have more than
/// one segment: a single name is an item of the module or one of its imports, found there.
struct Paths<'a> {
    module: usize,
    found: &'a mut Vec<Reference>,
}

impl Paths<'_> {
    fn push(&mut self, path: Vec<String>, line: usize, kind: Kind) {
        if path.len() > 1 {
            self.found.push(Reference { module: self.module, path, line, kind });
        }
    }

    /// The paths in a macro's tokens: `a::b::c` runs, `$crate` read as `crate`.
    fn scan(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let is_colon = |token: Option<&TokenTree>, spacing: Spacing| matches!(token, Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == spacing);
        let mut index = 0;
        while index < tokens.len() {
            match &tokens[index] {
                TokenTree::Group(group) => {
                    self.scan(group.stream());
                    index += 1;
                }
                TokenTree::Ident(first) => {
                    let extern_path = index >= 2
                        && is_colon(tokens.get(index - 2), Spacing::Joint)
                        && is_colon(tokens.get(index - 1), Spacing::Alone);
                    let mut path = vec![first.to_string()];
                    let mut next = index + 1;
                    while is_colon(tokens.get(next), Spacing::Joint)
                        && is_colon(tokens.get(next + 1), Spacing::Alone)
                    {
                        let Some(TokenTree::Ident(segment)) = tokens.get(next + 2) else { break };
                        path.push(segment.to_string());
                        next += 3;
                    }
                    if !extern_path {
                        self.push(path, first.span().start().line, Kind::Code);
                    }
                    index = next;
                }
                TokenTree::Punct(_) | TokenTree::Literal(_) => index += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.push(segments, path.segments[0].ident.span().start().line, Kind::Code);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item_use(&mut self, import: &'ast syn::ItemUse) {
        let mut leaves = Vec::new();
        flatten(&import.tree, &mut Vec::new(), &mut leaves);
        for (name, path, line) in leaves {
            self.found.push(Reference {
                module: self.module,
                path,
                line,
                kind: Kind::Use { public: false, glob: name.is_none() },
            });
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let name = mac.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        // Generated code: its paths are the user's, not this crate's.
        if !matches!(
            name.as_str(),
            "quote" | "quote_spanned" | "parse_quote" | "parse_quote_spanned"
        ) {
            let tokens = mac.tokens.clone().into_iter().map(|token| match token {
                TokenTree::Punct(p) if p.as_char() == '$' => None,
                other => Some(other),
            });
            self.scan(tokens.flatten().collect());
        }
        syn::visit::visit_macro(self, mac);
    }
}

/// A directed graph as adjacency sets.
fn adjacency<'a>(
    edges: impl Iterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<&'a str, BTreeSet<&'a str>> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(from).or_default().insert(to);
        graph.entry(to).or_default();
    }
    graph
}

fn reaches(graph: &BTreeMap<&str, BTreeSet<&str>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from];
    while let Some(node) = stack.pop() {
        if node == to {
            return true;
        }
        if seen.insert(node) {
            stack.extend(graph.get(node).into_iter().flatten().copied());
        }
    }
    false
}

/// The graph's cycles: each set of two or more nodes that all reach one another.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<BTreeSet<&'a str>> {
    let mut done = BTreeSet::new();
    let mut cycles = Vec::new();
    for &node in graph.keys() {
        if done.contains(node) {
            continue;
        }
        let component: BTreeSet<&str> = graph
            .keys()
            .copied()
            .filter(|&other| reaches(graph, node, other) && reaches(graph, other, node))
            .collect();
        done.extend(component.iter().copied());
        if component.len() > 1 {
            cycles.push(component);
        }
    }
    cycles
}

/// A shortest cycle through the nodes of `component`, as the nodes it passes, the first again at
/// the end.
fn shortest_cycle<'a>(
    graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    component: &BTreeSet<&'a str>,
) -> Vec<&'a str> {
    let mut best: Vec<&str> = Vec::new();
    for &start in component {
        // Breadth first from `start`, inside the component, until it comes back.
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        'search: while let Some(node) = queue.pop_front() {
            for &next in &graph[node] {
                if !component.contains(next) {
                    continue;
                }
                if next == start {
                    let mut cycle = vec![start, node];
                    while let Some(&before) = came_from.get(cycle[cycle.len() - 1]) {
                        cycle.push(before);
                    }
                    if node == start {
                        cycle.pop();
                    }
                    cycle.reverse();
                    if best.is_empty() || cycle.len() < best.len() {
                        best = cycle;
                    }
                    break 'search;
                }
                if next != start && !came_from.contains_key(next) {
                    came_from.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
    }
    best
}

/// Lists the imports between files for which `keep(from, to)` holds, each with the first lines
/// that import and the first path written on each.
fn describe(text: &mut String, graph: &Graph, keep: impl Fn(&str, &str) -> bool) {
    for ((from, to), lines) in &graph.edges {
        if keep(from, to) {
            let mut first: BTreeMap<usize, &str> = BTreeMap::new();
            for (line, path) in lines {
                first.entry(*line).or_insert(path);
            }
            let mut at: Vec<String> =
                first.iter().take(4).map(|(line, path)| format!("line {line} `{path}`")).collect();
            if first.len() > 4 {
                at.push(format!("and {} more lines", first.len() - 4));
            }
            writeln!(text, "  {from} → {to} ({})", at.join(", ")).unwrap();
        }
    }
}
