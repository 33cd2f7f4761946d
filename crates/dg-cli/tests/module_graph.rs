//! The crate's modules import each other without a circle.
//!
//! Reads every file under `src/`, strips comments, strings and character literals, and collects
//! each module's paths that start with `crate::`, `super::` or `self::` (`use` groups included,
//! inline modules such as `mod tests { use super::*; }` resolved where they sit). Each path names
//! the deepest module it reaches. Two rules, each checked by a depth-first search that prints the
//! circle it finds:
//! - the crate's top-level modules (a module and everything under it as one node; the crate root,
//!   `main.rs`, left out) form a DAG;
//! - under every module, its direct children (each with everything under it) form a DAG. A child
//!   may use its parent's own items, and the parent its children's: only siblings are ordered.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module: its path from the crate root (empty for the root).
type Module = Vec<String>;

#[test]
fn the_top_level_modules_form_a_dag() {
    let graph = module_graph();
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in &graph {
        let Some(a) = from.first() else { continue };
        let edges = top.entry(a.clone()).or_default();
        for to in tos {
            if let Some(b) = to.first().filter(|b| *b != a) {
                edges.insert(b.clone());
            }
        }
    }
    if let Some(cycle) = find_cycle(&top) {
        panic!("the top-level modules import each other in a circle: {}\nthe graph: {top:#?}", cycle.join(" -> "));
    }
}

#[test]
fn the_children_of_every_module_form_a_dag() {
    let graph = module_graph();
    let parents: BTreeSet<Module> = graph.keys().filter(|m| !m.is_empty()).map(|m| m[..m.len() - 1].to_vec()).collect();
    for parent in parents {
        let depth = parent.len();
        let mut children: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in &graph {
            if from.len() <= depth || !from.starts_with(&parent) {
                continue;
            }
            let a = &from[depth];
            let edges = children.entry(a.clone()).or_default();
            for to in tos {
                if to.len() > depth && to.starts_with(&parent) && &to[depth] != a {
                    edges.insert(to[depth].clone());
                }
            }
        }
        if let Some(cycle) = find_cycle(&children) {
            panic!("the children of `crate::{}` import each other in a circle: {}", parent.join("::"), cycle.join(" -> "));
        }
    }
}

#[test]
fn the_checker_sees_paths_groups_and_inline_modules() {
    let modules: BTreeSet<Module> = [vec![], m("a"), m("b"), m("b::c"), m("d")].into_iter().collect();
    let src = r#"
        use crate::{a, b::c::{Thing, other}};
        // crate::d in a comment is no import
        const S: &str = "crate::d in a string";
        fn f<'x>(c: char) -> bool { c == '"' }
        mod tests { use super::*; fn g() { crate::d::h(); } }
    "#;
    let mut graph = BTreeMap::new();
    references(&m("b"), src, &modules, &mut graph);
    let b: BTreeSet<Module> = [m("a"), m("b::c")].into_iter().collect();
    let tests: BTreeSet<Module> = [m("b"), m("d")].into_iter().collect();
    assert_eq!(graph[&m("b")], b);
    assert_eq!(graph[&m("b::tests")], tests);
    let cyclic: BTreeMap<String, BTreeSet<String>> =
        [("x".into(), ["y".into()].into()), ("y".into(), ["x".into()].into())].into_iter().collect();
    assert_eq!(find_cycle(&cyclic), Some(vec!["x".into(), "y".into(), "x".into()]));
}

fn m(path: &str) -> Module {
    path.split("::").map(str::to_string).collect()
}

/// Every module of `src/` and the modules it refers to.
fn module_graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect_files(&src, &mut files);
    let module_of = |file: &Path| -> Module {
        let rel = file.strip_prefix(&src).unwrap().with_extension("");
        let mut path: Module = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        if matches!(path.last().map(String::as_str), Some("mod" | "main" | "lib")) {
            path.pop();
        }
        path
    };
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(f)).collect();
    assert!(modules.len() > 10, "found only {modules:?} under {}", src.display());
    let mut graph = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        references(&module_of(file), &text, &modules, &mut graph);
    }
    graph
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Adds to `graph` the modules `text` (the file of `module`) refers to, by the modules its
/// inline `mod NAME { … }` blocks sit in. `modules` are the crate's file modules.
fn references(module: &Module, text: &str, modules: &BTreeSet<Module>, graph: &mut BTreeMap<Module, BTreeSet<Module>>) {
    let tokens = tokens(&strip(text));
    // The module each open brace belongs to: an inline module's body, or a block of the current.
    let mut scopes: Vec<Module> = vec![module.clone()];
    let mut pending_mod: Option<String> = None;
    graph.entry(module.clone()).or_default();
    let mut i = 0;
    while i < tokens.len() {
        let here = scopes.last().unwrap().clone();
        match tokens[i].as_str() {
            "mod" if i + 2 < tokens.len() && tokens[i + 2] == "{" => pending_mod = Some(tokens[i + 1].clone()),
            "{" => {
                let mut scope = here.clone();
                if let Some(name) = pending_mod.take() {
                    scope.push(name);
                    graph.entry(scope.clone()).or_default();
                }
                scopes.push(scope);
            }
            "}" if scopes.len() > 1 => {
                scopes.pop();
            }
            "crate" | "super" | "self" if tokens.get(i + 1).is_some_and(|t| t == "::") => {
                let (paths, next) = path_tree(&tokens, i);
                for path in paths {
                    if let Some(target) = resolve(&here, &path, modules)
                        && target != here
                    {
                        graph.entry(here.clone()).or_default().insert(target);
                    }
                }
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// The deepest module of the crate that `path` (starting with `crate`, `super` or `self`, seen
/// from `here`) reaches, or `None` for a path that leaves the crate's files (an inline module
/// is reached through the file module it sits in).
fn resolve(here: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let mut at: Module = match path[0].as_str() {
        "crate" => Vec::new(),
        _ => here.clone(),
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        at.pop()?;
        while rest.first().is_some_and(|s| s == "super") {
            at.pop()?;
            rest = &rest[1..];
        }
    }
    // An inline module (not a file) resolves to the file module it sits in.
    while !at.is_empty() && !modules.contains(&at) {
        at.pop();
    }
    for segment in rest {
        let mut next = at.clone();
        next.push(segment.clone());
        if !modules.contains(&next) {
            break;
        }
        at = next;
    }
    Some(at)
}

/// The paths of the path starting at token `i` (a `use` group `a::{b, c::{d}}` gives each of its
/// leaves), and the index after it.
fn path_tree(tokens: &[String], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        let Some(t) = tokens.get(i) else { return (vec![prefix], i) };
        if t == "{" {
            let mut paths = Vec::new();
            i += 1;
            while i < tokens.len() && tokens[i] != "}" {
                if tokens[i] == "," {
                    i += 1;
                    continue;
                }
                let (inner, next) = path_tree(tokens, i);
                paths.extend(inner.into_iter().map(|p| [prefix.clone(), p].concat()));
                i = next;
            }
            return (paths, i + 1);
        }
        if !t.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '*') {
            return (vec![prefix], i);
        }
        prefix.push(t.clone());
        i += 1;
        if tokens.get(i).is_some_and(|t| t == "::") {
            i += 1;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// Identifiers, `::`, and every other character as a token of its own (whitespace dropped).
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
        i += 1;
    }
    out
}

/// `text` without comments, string literals (raw ones included) and character literals; each
/// becomes a space.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied();
        if c[i] == '/' && at(i + 1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (at(i + 1) == Some('"') || at(i + 1) == Some('#')) && (i == 0 || !is_ident(c[i - 1])) {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == Some('#') {
                hashes += 1;
                j += 1;
            }
            if at(j) != Some('"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|k| at(j + k) == Some('#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c[i] == '\'' && (at(i + 2) == Some('\'') || at(i + 1) == Some('\\')) {
            // A character literal ('x', '\n', '\u{…}'); a lifetime has no closing quote.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        }
        out.push(' ');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A circle of `graph`, as the nodes along it with the first repeated at the end.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let from = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(next, graph, marks, stack) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if marks.get(node).copied().unwrap_or(Mark::New) == Mark::New {
            let mut stack = Vec::new();
            if let Some(cycle) = visit(node, graph, &mut marks, &mut stack) {
                return Some(cycle);
            }
        }
    }
    None
}
