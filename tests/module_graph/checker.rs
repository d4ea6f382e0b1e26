//! The module-graph checker behind tests/module_graph.rs (its rules are in that file's docs):
//! parsing with `syn`, path resolution through re-exports, the graph, cycles per level.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

pub(crate) type ModPath = Vec<String>;

pub(crate) fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The module a library source file defines, from its path relative to src/; None for the
/// binaries (src/main.rs, src/bin/).
pub(crate) fn module_of(rel: &Path) -> Option<ModPath> {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") || parts == ["main.rs"] {
        return None;
    }
    let mut m: ModPath = parts;
    let last = m.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if stem != "mod" && !(m.is_empty() && stem == "lib") {
        m.push(stem.to_string());
    }
    Some(m)
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| matches!(m, syn::Meta::Path(p) if p.is_ident("test")))
    })
}

/// What the crate's files declare: modules, re-exports and item names.
#[derive(Default)]
struct Crate {
    /// File modules (nodes), and inline modules mapped to their file module.
    file_modules: BTreeSet<ModPath>,
    inline_modules: BTreeMap<ModPath, ModPath>,
    test_modules: BTreeSet<ModPath>,
    /// (module, name) → absolute path it re-exports.
    reexports: HashMap<(ModPath, String), ModPath>,
    glob_reexports: HashMap<ModPath, Vec<ModPath>>,
    items: HashMap<ModPath, BTreeSet<String>>,
}

impl Crate {
    fn is_module(&self, m: &ModPath) -> bool {
        self.file_modules.contains(m) || self.inline_modules.contains_key(m)
    }

    fn file_of(&self, m: &ModPath) -> ModPath {
        self.inline_modules
            .get(m)
            .cloned()
            .unwrap_or_else(|| m.clone())
    }

    fn is_test(&self, m: &[String]) -> bool {
        (1..=m.len()).any(|n| self.test_modules.contains(&m[..n]))
    }

    /// The absolute path of `segs` written in module `ctx`; None for external crates.
    /// `in_use`: a `use` tree, where a leading child-module name is relative (uniform paths).
    fn absolute(&self, ctx: &ModPath, segs: &[String], in_use: bool) -> Option<ModPath> {
        let first = segs.first()?;
        match first.as_str() {
            "crate" => Some(segs[1..].to_vec()),
            "self" => Some(ctx.iter().chain(&segs[1..]).cloned().collect()),
            "super" => {
                let mut m = ctx.clone();
                let mut rest = segs;
                while rest.first().is_some_and(|s| s == "super") {
                    m.pop()?;
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                Some(m)
            }
            _ if in_use => {
                let mut child = ctx.clone();
                child.push(first.clone());
                self.is_module(&child)
                    .then(|| ctx.iter().chain(segs).cloned().collect())
            }
            _ => None,
        }
    }

    /// The file module defining the target of absolute path `abs`, through re-exports.
    fn resolve(&self, abs: &[String], depth: usize) -> ModPath {
        let mut n = abs.len();
        while n > 0 && !self.is_module(&abs[..n].to_vec()) {
            n -= 1;
        }
        let m = abs[..n].to_vec();
        if n < abs.len() && depth < 16 {
            let name = &abs[n];
            if let Some(target) = self.reexports.get(&(m.clone(), name.clone())) {
                let full: ModPath = target.iter().chain(&abs[n + 1..]).cloned().collect();
                return self.resolve(&full, depth + 1);
            }
            let declared = self.items.get(&m).is_some_and(|s| s.contains(name));
            if !declared {
                for glob in self.glob_reexports.get(&m).into_iter().flatten() {
                    let via: ModPath = glob.iter().chain(&abs[n..]).cloned().collect();
                    let target = self.resolve(&via, depth + 1);
                    if target != self.file_of(glob)
                        || self.items.get(glob).is_some_and(|s| s.contains(name))
                    {
                        return target;
                    }
                }
            }
        }
        self.file_of(&m)
    }
}

/// A `use` tree flattened: the path, and the name it binds (None for a glob).
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(ModPath, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                out.push((prefix.clone(), prefix.last().cloned()));
            } else {
                let mut p = prefix.clone();
                p.push(name.clone());
                out.push((p, Some(name)));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            let name = r.ident.to_string();
            if name != "self" {
                p.push(name);
            }
            out.push((p, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, out);
            }
        }
    }
}

/// First pass: modules, test modules, item names and re-exports of one file's items.
fn declare(c: &mut Crate, file_module: &ModPath, ctx: &ModPath, items: &[syn::Item]) {
    for item in items {
        let name = match item {
            syn::Item::Const(i) => Some(&i.ident),
            syn::Item::Enum(i) => Some(&i.ident),
            syn::Item::Fn(i) => Some(&i.sig.ident),
            syn::Item::Static(i) => Some(&i.ident),
            syn::Item::Struct(i) => Some(&i.ident),
            syn::Item::Trait(i) => Some(&i.ident),
            syn::Item::Type(i) => Some(&i.ident),
            syn::Item::Union(i) => Some(&i.ident),
            syn::Item::Macro(i) => i.ident.as_ref(),
            syn::Item::Mod(i) => Some(&i.ident),
            _ => None,
        };
        if let Some(n) = name {
            c.items
                .entry(ctx.clone())
                .or_default()
                .insert(n.to_string());
        }
        if let syn::Item::Mod(m) = item {
            let mut child = ctx.clone();
            child.push(m.ident.to_string());
            if is_cfg_test(&m.attrs) {
                c.test_modules.insert(child.clone());
            } else if let Some((_, inner)) = &m.content {
                c.inline_modules.insert(child.clone(), file_module.clone());
                declare(c, file_module, &child, inner);
            }
        }
    }
}

fn declare_reexports(c: &mut Crate, ctx: &ModPath, items: &[syn::Item]) {
    for item in items {
        match item {
            syn::Item::Use(u)
                if !matches!(u.vis, syn::Visibility::Inherited) && !is_cfg_test(&u.attrs) =>
            {
                let mut flat = Vec::new();
                flatten_use(&u.tree, &mut Vec::new(), &mut flat);
                for (path, name) in flat {
                    let Some(abs) = c.absolute(ctx, &path, true) else {
                        continue;
                    };
                    match name {
                        Some(n) => {
                            c.reexports.insert((ctx.clone(), n), abs);
                        }
                        None => c.glob_reexports.entry(ctx.clone()).or_default().push(abs),
                    }
                }
            }
            syn::Item::Mod(m) if !is_cfg_test(&m.attrs) => {
                if let Some((_, inner)) = &m.content {
                    let mut child = ctx.clone();
                    child.push(m.ident.to_string());
                    declare_reexports(c, &child, inner);
                }
            }
            _ => {}
        }
    }
}

/// Second pass: every path of one file, resolved to the file module it reaches.
struct Uses<'a> {
    krate: &'a Crate,
    file_module: ModPath,
    /// Module of the code being visited (inline modules push onto it).
    ctx: ModPath,
    /// (target file module, the path as written) for each reference.
    found: Vec<(ModPath, String)>,
}

impl Uses<'_> {
    fn reach(&mut self, segs: &[String], in_use: bool) {
        if let Some(abs) = self.krate.absolute(&self.ctx, segs, in_use) {
            let target = self.krate.resolve(&abs, 0);
            if !target.is_empty() && target != self.file_module {
                self.found.push((target, segs.join("::")));
            }
        }
    }

    /// `crate::a::b` / `super::a` sequences inside a macro's tokens.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            if let TokenTree::Group(g) = &tts[i] {
                self.scan_tokens(g.stream());
                i += 1;
                continue;
            }
            let start = matches!(&tts[i], TokenTree::Ident(id) if id == "crate" || id == "super");
            let after_colons =
                i >= 2 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == ':');
            if !start || after_colons {
                i += 1;
                continue;
            }
            let mut segs = vec![tts[i].to_string()];
            let mut j = i + 1;
            loop {
                let colons = matches!((&tts.get(j), &tts.get(j + 1)),
                    (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':');
                match (colons, tts.get(j + 2)) {
                    (true, Some(TokenTree::Ident(id))) => {
                        segs.push(id.to_string());
                        j += 3;
                    }
                    _ => break,
                }
            }
            self.reach(&segs, false);
            i = j;
        }
    }
}

impl<'ast> Visit<'ast> for Uses<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.ctx.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.ctx.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !matches!(u.vis, syn::Visibility::Inherited) {
            return; // a re-export: resolved through, not a dependency of this module
        }
        let mut flat = Vec::new();
        flatten_use(&u.tree, &mut Vec::new(), &mut flat);
        for (path, _) in flat {
            self.reach(&path, true);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs
            .first()
            .is_some_and(|s| s == "crate" || s == "super" || s == "self")
            && segs.len() > 1
        {
            self.reach(&segs, false);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.scan_tokens(m.tokens.clone());
    }
}

/// Module graph: file module → (module it uses → one path that shows it).
pub(crate) type Graph = BTreeMap<ModPath, BTreeMap<ModPath, String>>;

/// Builds the graph from (module, source) pairs.
pub(crate) fn graph(files: &[(ModPath, String)]) -> Graph {
    let parsed: Vec<(ModPath, syn::File)> = files
        .iter()
        .map(|(m, src)| {
            let f = syn::parse_file(src).unwrap_or_else(|e| panic!("parsing {}: {e}", show(m)));
            (m.clone(), f)
        })
        .collect();
    let mut c = Crate::default();
    for (m, _) in &parsed {
        c.file_modules.insert(m.clone());
    }
    for (m, f) in &parsed {
        declare(&mut c, m, m, &f.items);
    }
    for (m, f) in &parsed {
        if !c.is_test(m) {
            declare_reexports(&mut c, m, &f.items);
        }
    }
    let mut g = Graph::new();
    for (m, f) in &parsed {
        if c.is_test(m) || m.is_empty() {
            continue;
        }
        let mut v = Uses {
            krate: &c,
            file_module: m.clone(),
            ctx: m.clone(),
            found: Vec::new(),
        };
        for item in &f.items {
            v.visit_item(item);
        }
        let edges = g.entry(m.clone()).or_default();
        for (target, written) in v.found {
            if !c.is_test(&target) {
                edges.entry(target).or_insert(written);
            }
        }
    }
    g
}

/// Strongly connected components with more than one module (Tarjan), each as one cycle.
pub(crate) fn cycles(g: &Graph) -> Vec<Vec<ModPath>> {
    components(g).into_iter().map(|(_, c)| c).collect()
}

/// Each strongly connected component of more than one module, and a shortest cycle through its
/// first module.
fn components(g: &Graph) -> Vec<(Vec<ModPath>, Vec<ModPath>)> {
    struct Tarjan<'a> {
        g: &'a Graph,
        index: HashMap<&'a ModPath, usize>,
        low: HashMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        sccs: Vec<Vec<&'a ModPath>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a ModPath) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g.get(v).into_iter().flat_map(|e| e.keys()) {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(w);
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                self.sccs.push(scc);
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        sccs: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.sccs
        .into_iter()
        .filter(|s| s.len() > 1)
        .map(|scc| {
            // A shortest cycle through the component's smallest module (BFS inside it).
            let members: BTreeSet<&ModPath> = scc.iter().copied().collect();
            let start = *members.iter().next().unwrap();
            let mut prev: HashMap<&ModPath, &ModPath> = HashMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut end = None;
            'bfs: while let Some(v) = queue.pop_front() {
                for w in g[v].keys().filter(|w| members.contains(w)) {
                    if w == start {
                        end = Some(v);
                        break 'bfs;
                    }
                    if !prev.contains_key(w) {
                        prev.insert(w, v);
                        queue.push_back(w);
                    }
                }
            }
            let mut path = vec![end.expect("a component of size > 1 has a cycle").clone()];
            while path.last().unwrap() != start {
                path.push(prev[path.last().unwrap()].clone());
            }
            path.reverse();
            (members.into_iter().cloned().collect(), path)
        })
        .collect()
}

pub(crate) fn describe(g: &Graph, cycle: &[ModPath]) -> String {
    let mut s = String::new();
    for (i, m) in cycle.iter().enumerate() {
        let next = &cycle[(i + 1) % cycle.len()];
        s += &format!("  {} → {} ({})\n", show(m), show(next), g[m][next]);
    }
    s
}

/// The graph among the children of one module `p`, each child standing for its subtree, and
/// `p` itself for its own code: keyed by `p`. Each edge keeps a file-level witness.
fn levels(g: &Graph) -> BTreeMap<ModPath, Graph> {
    let mut out: BTreeMap<ModPath, Graph> = BTreeMap::new();
    for (u, edges) in g {
        for (v, written) in edges {
            let n = u.iter().zip(v).take_while(|(a, b)| a == b).count();
            let p = u[..n].to_vec();
            let node = |m: &ModPath| {
                if m.len() == n {
                    p.clone()
                } else {
                    m[..=n].to_vec()
                }
            };
            let witness = format!("{} uses {written}", show(u));
            out.entry(p.clone())
                .or_default()
                .entry(node(u))
                .or_default()
                .entry(node(v))
                .or_insert(witness);
        }
    }
    out
}

/// One paragraph per cycle found at any level; empty when there is none.
pub(crate) fn check(g: &Graph) -> String {
    let mut report = String::new();
    for (p, level) in levels(g) {
        for (members, c) in components(&level) {
            let names: Vec<String> = members.iter().map(|m| show(m)).collect();
            report += &format!(
                "among the modules of {} ({} on cycles), for example:\n{}\n",
                show(&p),
                names.join(", "),
                describe(&level, &c)
            );
        }
    }
    report
}
