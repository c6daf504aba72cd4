//! Tidy tests: the layering rules of ARCHITECTURE.md ("Layering"), checked by reading the
//! sources, as rust-analyzer's tidy tests do.
//!
//! - **No import circle** spans more than one file in the compiler's or the executor's
//!   library: a file depends on another when it names an item defined there through a `use`
//!   line or a path (`crate::…`, `super::…`, `self::…`, a child module, or a module it
//!   imported). A module's `pub use` re-exports are its interface, not a dependency: a name
//!   used through a re-export is charged to the file that defines it. `mod x;` is not a
//!   dependency, nor is anything under `#[cfg(test)]`.
//! - **Layers:** in the compiler, `cost/` imports nothing from `families/`, `synth/` or
//!   `search/`; in the executor, no file outside `backends/` (the crate root aside, which
//!   re-exports) imports from `backends/`.
//! - **No function over 150 lines** outside tests, in every workspace member's sources,
//!   binaries, examples and benchmarks.
//! - **No file over 1,000 lines** without a line in ARCHITECTURE.md (section "Files over
//!   1,000 lines") naming it and saying why.
//!
//! The sources are parsed with `syn`, so strings, comments and macros do not confuse it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;
use syn::visit::Visit;

const MAX_FN_LINES: usize = 150;
const MAX_FILE_LINES: usize = 1000;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One parsed source file of a crate: its module path (`cost::sim`), its text and syntax tree.
struct Source {
    /// Relative to the repository root, with `/` separators.
    rel: String,
    module: Vec<String>,
    text: String,
    ast: syn::File,
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

fn has_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .map(|m| matches!(&m, syn::Meta::Path(p) if p.is_ident("test")))
                .unwrap_or(false)
    })
}

/// The files of the crate whose root is `root_file`, following `mod x;` declarations (and
/// skipping those under `#[cfg(test)]`).
fn crate_sources(root_file: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut todo = vec![(root_file.to_path_buf(), Vec::<String>::new())];
    while let Some((file, module)) = todo.pop() {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: cannot read: {e}", file.display()));
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}: cannot parse: {e}", file.display()));
        // Where `mod x;` of this file looks: beside a crate root or a `mod.rs`, else in a
        // folder named after the file.
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let dir = file.parent().unwrap().to_path_buf();
        let child_dir = if module.is_empty() || name == "mod.rs" {
            dir
        } else {
            dir.join(file.file_stem().unwrap())
        };
        collect_mods(&ast.items, &child_dir, &module, &mut todo);
        out.push(Source {
            rel: rel(&file),
            module,
            text,
            ast,
        });
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

fn collect_mods(
    items: &[syn::Item],
    dir: &Path,
    module: &[String],
    todo: &mut Vec<(PathBuf, Vec<String>)>,
) {
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if has_cfg_test(&m.attrs) {
            continue;
        }
        let name = m.ident.to_string();
        let mut child = module.to_vec();
        child.push(name.clone());
        if let Some((_, inner)) = &m.content {
            // An inline module: its own `mod x;` live in a folder of its name.
            collect_mods(inner, &dir.join(&name), &child, todo);
            continue;
        }
        let explicit = m.attrs.iter().find_map(|a| {
            if !a.path().is_ident("path") {
                return None;
            }
            match &a.meta {
                syn::Meta::NameValue(nv) => match &nv.value {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(s),
                        ..
                    }) => Some(dir.join(s.value())),
                    _ => None,
                },
                _ => None,
            }
        });
        let file = explicit.unwrap_or_else(|| {
            let flat = dir.join(format!("{name}.rs"));
            if flat.exists() {
                flat
            } else {
                dir.join(&name).join("mod.rs")
            }
        });
        todo.push((file, child));
    }
}

/// A `use` tree flattened into full paths; `*` and `self` kept as segments.
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            let mut path = prefix.clone();
            if name != "self" {
                path.push(name.clone());
            }
            let alias = if name == "self" {
                prefix.last().cloned().unwrap_or_default()
            } else {
                name
            };
            out.push((path, alias));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((path, r.rename.to_string()));
        }
        syn::UseTree::Glob(_) => {
            let mut path = prefix.clone();
            path.push("*".into());
            out.push((path, "*".into()));
        }
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, out);
            }
        }
    }
}

/// The import graph of one library crate.
struct Crate {
    sources: Vec<Source>,
    /// Module path → index of the file that defines it.
    files: HashMap<Vec<String>, usize>,
    /// (module of a file, re-exported name) → the absolute path it re-exports.
    reexports: HashMap<(Vec<String>, String), Vec<String>>,
}

impl Crate {
    fn load(lib: &Path) -> Crate {
        let sources = crate_sources(lib);
        let files = sources
            .iter()
            .enumerate()
            .map(|(i, s)| (s.module.clone(), i))
            .collect();
        let mut krate = Crate {
            sources,
            files,
            reexports: HashMap::new(),
        };
        let mut reexports = HashMap::new();
        for s in &krate.sources {
            for item in &s.ast.items {
                let syn::Item::Use(u) = item else { continue };
                if matches!(u.vis, syn::Visibility::Inherited) || has_cfg_test(&u.attrs) {
                    continue;
                }
                let mut paths = Vec::new();
                flatten_use(&u.tree, &mut Vec::new(), &mut paths);
                for (path, alias) in paths {
                    if alias == "*" {
                        continue;
                    }
                    if let Some(abs) = krate.absolute(&s.module, &path, &HashMap::new()) {
                        reexports.insert((s.module.clone(), alias), abs);
                    }
                }
            }
        }
        krate.reexports = reexports;
        krate
    }

    /// `path` as written in module `at` (with the file's module imports `aliases`), made
    /// absolute within the crate; `None` for another crate's or the prelude's names.
    fn absolute(
        &self,
        at: &[String],
        path: &[String],
        aliases: &HashMap<String, Vec<String>>,
    ) -> Option<Vec<String>> {
        let (first, rest) = path.split_first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => at.to_vec(),
            "super" => {
                let mut m = at.to_vec();
                m.pop();
                let mut rest = rest;
                while rest.first().map(String::as_str) == Some("super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                return Some(m);
            }
            _ => {
                let mut child = at.to_vec();
                child.push(first.clone());
                if self.files.contains_key(&child) {
                    child
                } else if let Some(a) = aliases.get(first) {
                    a.clone()
                } else {
                    return None;
                }
            }
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file that defines what the absolute `path` names: the longest prefix that is a
    /// file's module, then through that file's re-exports.
    fn file_of(&self, path: &[String]) -> Option<usize> {
        let mut seen = 0;
        let mut path = path.to_vec();
        loop {
            let (len, file) = (0..=path.len())
                .rev()
                .find_map(|n| self.files.get(&path[..n]).map(|&f| (n, f)))?;
            let Some(name) = path.get(len) else {
                return Some(file);
            };
            let key = (self.sources[file].module.clone(), name.clone());
            match self.reexports.get(&key) {
                Some(target) if seen < 16 => {
                    seen += 1;
                    let mut next = target.clone();
                    next.extend(path[len + 1..].iter().cloned());
                    path = next;
                }
                _ => return Some(file),
            }
        }
    }

    /// Edges between files: (from, to) with one example path each.
    fn edges(&self) -> BTreeMap<(usize, usize), String> {
        let mut edges = BTreeMap::new();
        for (i, s) in self.sources.iter().enumerate() {
            let mut collector = Paths::default();
            collector.visit_file(&s.ast);
            // Module imports of this file (`use crate::cost;`, `use super::sim`) resolve the
            // first segment of later paths.
            let mut aliases = HashMap::new();
            for (path, alias) in &collector.uses {
                if let Some(abs) = self.absolute(&s.module, path, &HashMap::new())
                    && self.files.contains_key(&abs)
                {
                    aliases.insert(alias.clone(), abs);
                }
            }
            let written = collector
                .uses
                .iter()
                .map(|(p, _)| p.clone())
                .chain(collector.paths.iter().cloned());
            for path in written {
                let path: Vec<String> = path.into_iter().filter(|seg| seg != "*").collect();
                let Some(abs) = self.absolute(&s.module, &path, &aliases) else {
                    continue;
                };
                if let Some(j) = self.file_of(&abs)
                    && j != i
                {
                    edges.entry((i, j)).or_insert_with(|| abs.join("::"));
                }
            }
        }
        edges
    }
}

/// Every `use` (except re-exports) and every path of a file, outside `#[cfg(test)]`.
#[derive(Default)]
struct Paths {
    uses: Vec<(Vec<String>, String)>,
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Trait(t) => &t.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if has_cfg_test(attrs) {
            return;
        }
        if let syn::Item::Use(u) = item {
            if matches!(u.vis, syn::Visibility::Inherited) {
                flatten_use(&u.tree, &mut Vec::new(), &mut self.uses);
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            self.paths
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // Paths inside macro calls (`format!("{}", crate::x::y())`) are tokens: read the
        // `a::b::c` runs among them.
        let tokens: Vec<proc_macro2::TokenTree> = mac.tokens.clone().into_iter().collect();
        scan_tokens(&tokens, &mut self.paths);
        syn::visit::visit_macro(self, mac);
    }
}

fn scan_tokens(tokens: &[proc_macro2::TokenTree], out: &mut Vec<Vec<String>>) {
    use proc_macro2::TokenTree;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                scan_tokens(&inner, out);
                i += 1;
            }
            TokenTree::Ident(first) => {
                let mut path = vec![first.to_string()];
                let mut j = i + 1;
                // `::ident` runs after it (`get` ends the run at the end of the tokens).
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(id)),
                ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    && a.as_char() == ':'
                    && b.as_char() == ':'
                {
                    path.push(id.to_string());
                    j += 3;
                }
                if path.len() > 1 {
                    out.push(path);
                }
                i = j;
            }
            _ => i += 1,
        }
    }
}

fn library(krate: &str) -> Crate {
    Crate::load(&root().join(krate).join("src/lib.rs"))
}

/// The import circles (strongly connected components of more than one file) of a crate,
/// each with the edges inside it.
fn circles(krate: &Crate) -> Vec<String> {
    let edges = krate.edges();
    let mut graph = DiGraph::<usize, ()>::new();
    let nodes: Vec<_> = (0..krate.sources.len())
        .map(|i| graph.add_node(i))
        .collect();
    for &(a, b) in edges.keys() {
        graph.add_edge(nodes[a], nodes[b], ());
    }
    let mut out = Vec::new();
    for scc in tarjan_scc(&graph) {
        if scc.len() < 2 {
            continue;
        }
        let members: BTreeSet<usize> = scc.iter().map(|n| graph[*n]).collect();
        let mut text = format!("a circle of {} files:\n", members.len());
        for (&(a, b), example) in &edges {
            if members.contains(&a) && members.contains(&b) {
                text += &format!(
                    "    {} -> {} ({example})\n",
                    krate.sources[a].rel, krate.sources[b].rel
                );
            }
        }
        out.push(text);
    }
    out
}

#[test]
fn no_import_circle_spans_files_in_the_compiler_or_the_executor() {
    let mut found = Vec::new();
    for name in ["compiler", "executor"] {
        for circle in circles(&library(name)) {
            found.push(format!("{name}: {circle}"));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// Edges of `krate` from files whose module starts with one of `from` (or any file but the
/// crate root when `from` is empty) to files whose module starts with one of `to`.
fn crossings(krate: &Crate, from: &[&str], to: &[&str]) -> Vec<String> {
    let starts =
        |s: &Source, set: &[&str]| s.module.first().is_some_and(|m| set.iter().any(|x| x == m));
    krate
        .edges()
        .iter()
        .filter(|&(&(a, b), _)| {
            let (a, b) = (&krate.sources[a], &krate.sources[b]);
            let from_ok = if from.is_empty() {
                !a.module.is_empty() && !starts(a, to)
            } else {
                starts(a, from)
            };
            from_ok && starts(b, to)
        })
        .map(|(&(a, b), example)| {
            format!(
                "{} -> {} ({example})",
                krate.sources[a].rel, krate.sources[b].rel
            )
        })
        .collect()
}

#[test]
fn the_cost_model_imports_no_candidate_source() {
    let bad = crossings(
        &library("compiler"),
        &["cost"],
        &["families", "synth", "search"],
    );
    assert!(
        bad.is_empty(),
        "cost/ imports a candidate source:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_executor_core_names_no_backend() {
    let krate = library("executor");
    assert!(
        krate.files.contains_key(&vec!["backends".to_string()]),
        "executor/src has no `backends` module"
    );
    let bad = crossings(&krate, &[], &["backends"]);
    assert!(
        bad.is_empty(),
        "the executor's core imports a backend:\n{}",
        bad.join("\n")
    );
}

/// The workspace members' crate roots: libraries, binaries, examples and benchmarks.
fn crate_roots() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members line in Cargo.toml");
    let mut dirs: Vec<PathBuf> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root().join(m))
        .collect();
    dirs.push(root());
    let mut roots = Vec::new();
    for dir in dirs {
        let src = dir.join("src");
        for file in ["lib.rs", "main.rs"] {
            if src.join(file).exists() {
                roots.push(src.join(file));
            }
        }
        // Examples and benchmarks are programs too (tests are not held to these rules).
        for extra in [dir.join("examples"), dir.join("benches")] {
            if let Ok(files) = std::fs::read_dir(&extra) {
                for f in files.flatten() {
                    let p = f.path();
                    if p.extension().is_some_and(|e| e == "rs") {
                        roots.push(p);
                    } else if p.join("main.rs").exists() {
                        roots.push(p.join("main.rs"));
                    }
                }
            }
        }
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            for bin in bins.flatten() {
                let p = bin.path();
                if p.is_dir() && p.join("main.rs").exists() {
                    roots.push(p.join("main.rs"));
                } else if p.extension().is_some_and(|e| e == "rs") {
                    roots.push(p);
                }
            }
        }
    }
    roots.sort();
    roots
}

/// Whether `s` is test code that a program includes by path (a benchmark's test fixtures).
fn is_test_code(s: &Source) -> bool {
    s.rel.split('/').any(|part| part == "tests")
}

/// Functions (free, inherent, trait) of a file with their line counts, outside tests.
#[derive(Default)]
struct Fns {
    found: Vec<(String, usize, usize)>,
}

impl Fns {
    fn add(&mut self, name: String, sig: &syn::Signature, body: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let end = body.brace_token.span.close().end().line;
        self.found.push((name, start, end + 1 - start));
    }
}

impl<'ast> Visit<'ast> for Fns {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !has_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if has_cfg_test(&f.attrs) {
            return;
        }
        self.add(f.sig.ident.to_string(), &f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if has_cfg_test(&f.attrs) {
            return;
        }
        self.add(f.sig.ident.to_string(), &f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.add(f.sig.ident.to_string(), &f.sig, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn no_function_is_longer_than_150_lines() {
    let mut long = Vec::new();
    for krate in crate_roots() {
        for s in crate_sources(&krate)
            .into_iter()
            .filter(|s| !is_test_code(s))
        {
            let mut fns = Fns::default();
            fns.visit_file(&s.ast);
            for (name, line, len) in fns.found {
                if len > MAX_FN_LINES {
                    long.push(format!("{}:{line}: fn {name} has {len} lines", s.rel));
                }
            }
        }
    }
    long.sort();
    long.dedup();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them into named phases):\n{}",
        long.join("\n")
    );
}

#[test]
fn every_file_over_1000_lines_is_explained_in_architecture_md() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section: Vec<&str> = arch
        .lines()
        .skip_while(|l| !(l.starts_with("## ") && l.contains("1,000 lines")))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect();
    let mut unexplained = Vec::new();
    let mut seen = BTreeSet::new();
    for krate in crate_roots() {
        for s in crate_sources(&krate)
            .into_iter()
            .filter(|s| !is_test_code(s))
        {
            let lines = s.text.lines().count();
            if lines > MAX_FILE_LINES
                && seen.insert(s.rel.clone())
                && !section.iter().any(|l| l.contains(&format!("`{}`", s.rel)))
            {
                unexplained.push(format!("{} ({lines} lines)", s.rel));
            }
        }
    }
    assert!(
        unexplained.is_empty(),
        "files over {MAX_FILE_LINES} lines that ARCHITECTURE.md's section \"Files over 1,000 \
         lines\" does not name (in backquotes) with a reason:\n{}",
        unexplained.join("\n")
    );
}

/// The checker itself: a circle through a `super::` import and a child-module path is found,
/// and a re-export is charged to the file that defines the name.
#[test]
fn the_checker_finds_a_circle_and_sees_through_reexports() {
    let dir = std::env::temp_dir().join(format!("hccl-tidy-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "mod inner;\npub use inner::Thing;\npub fn helper() { crate::b::g(); }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "pub struct Thing;\n#[cfg(test)]\nmod tests { use crate::b::*; }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "use crate::a::Thing;\npub fn g() -> Option<Thing> { None }\n",
    )
    .unwrap();
    let krate = Crate::load(&src.join("lib.rs"));
    let edges: Vec<(String, String)> = krate
        .edges()
        .keys()
        .map(|&(a, b)| {
            (
                krate.sources[a].module.join("::"),
                krate.sources[b].module.join("::"),
            )
        })
        .collect();
    assert!(
        edges.contains(&("b".into(), "a::inner".into())),
        "{edges:?}"
    );
    assert!(edges.contains(&("a".into(), "b".into())), "{edges:?}");
    assert!(!edges.contains(&("b".into(), "a".into())), "{edges:?}");
    assert!(circles(&krate).is_empty());
    // Now the definition moves into a/mod.rs, which b uses and which uses b: a circle.
    std::fs::write(
        src.join("a/mod.rs"),
        "mod inner;\npub struct Thing;\npub fn helper() { crate::b::g(); }\n",
    )
    .unwrap();
    let krate = Crate::load(&src.join("lib.rs"));
    let found = circles(&krate);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("src/b.rs"), "{}", found[0]);
}
