//! No import cycles between brook's modules.
//!
//! Parses every library source file under src/ (not the binaries, not test-only modules or
//! items) with `syn`, resolves each `crate::` / `super::` / `self::` path — in `use` trees,
//! in code, and inside macro invocations — to the file module that defines its target, and fails
//! on any cycle in that graph, printing one concrete cycle per strongly connected component.
//!
//! Rules:
//! - A file module (`src/a/b.rs` or `src/a/b/mod.rs` is `a::b`) is the unit of dependency;
//!   inline modules belong to their file.
//! - Cycles are looked for at every level of the module tree: among the children of each
//!   module (`scheduler` and `executor` at the top, `device` and `kernels` under
//!   `executor::cuda`), a child standing for everything below it, plus the parent's own code
//!   (its mod.rs). So an edge `scheduler::core → executor::x` and one `executor::y →
//!   scheduler::z` make `scheduler ⇄ executor` a cycle although no file is on a cycle of files
//!   (as the step types once made it).
//! - `pub use` re-exports are aliases, not dependencies: a path through one resolves to the
//!   module that defines the item (so `scheduler/mod.rs` re-exporting `core::Scheduler` is no edge,
//!   and `crate::scheduler::Scheduler` used elsewhere is an edge to `scheduler::core`).
//! - `#[cfg(test)]` modules and items are skipped: test code may reach anywhere.
//! - Child → parent edges count like any other: a parent module's own code may not depend on
//!   a child that depends on it.

#[path = "module_graph/checker.rs"]
mod checker;

use std::path::Path;

use checker::{check, graph, module_of, ModPath};

fn read_src() -> Vec<(ModPath, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(ModPath, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                if let Some(m) = module_of(p.strip_prefix(root).unwrap()) {
                    out.push((m, std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    out
}

#[test]
fn src_has_no_module_cycles() {
    let files = read_src();
    assert!(files.len() > 50, "found only {} source files", files.len());
    let g = graph(&files);
    // The graph must see the dependencies it is there to police.
    let edges: usize = g.values().map(|e| e.len()).sum();
    assert!(edges > 100, "only {edges} edges: the parser misses paths");
    let report = check(&g);
    assert!(
        report.is_empty(),
        "import cycles between modules:\n{report}"
    );
}

#[cfg(test)]
mod checker_tests {
    use super::checker::*;
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(ModPath, String)> {
        list.iter()
            .map(|(path, src)| (module_of(Path::new(path)).unwrap(), src.to_string()))
            .collect()
    }

    fn names(c: &[ModPath]) -> Vec<String> {
        c.iter().map(|m| show(m)).collect()
    }

    /// A small acyclic crate; each test injects one kind of cycle into it.
    fn base() -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "lib.rs",
                "pub mod step; pub mod scheduler; pub mod executor; #[cfg(test)] mod fixture;",
            ),
            ("step/mod.rs", "pub mod batch; pub use batch::Batch;"),
            ("step/batch.rs", "pub struct Batch;"),
            (
                "scheduler/mod.rs",
                "mod core; pub use self::core::Scheduler; pub struct Config;",
            ),
            (
                "scheduler/core.rs",
                "use crate::step::Batch; use super::Config; pub struct Scheduler;",
            ),
            (
                "executor/mod.rs",
                "pub mod cuda; pub fn run(_: crate::step::Batch) {}",
            ),
            ("executor/cuda/mod.rs", "pub mod device; pub mod kernels;"),
            ("executor/cuda/device.rs", "pub struct Gpu;"),
            (
                "executor/cuda/kernels.rs",
                "use super::device::Gpu; pub fn launch(_: &Gpu) {}",
            ),
            (
                "fixture.rs",
                "use crate::scheduler::Scheduler; use crate::executor::run;",
            ),
        ]
    }

    fn with(extra: &[(&'static str, &'static str)]) -> Vec<(ModPath, String)> {
        let mut list = base();
        for (path, src) in extra {
            list.retain(|(p, _)| p != path);
            list.push((path, src));
        }
        files(&list)
    }

    #[test]
    fn module_paths_follow_the_file_layout() {
        assert_eq!(module_of(Path::new("lib.rs")), Some(vec![]));
        assert_eq!(
            module_of(Path::new("a/mod.rs")),
            Some(vec!["a".to_string()])
        );
        assert_eq!(
            module_of(Path::new("a/b.rs")),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(module_of(Path::new("main.rs")), None);
        assert_eq!(module_of(Path::new("bin/gpu-bench.rs")), None);
    }

    #[test]
    fn the_base_crate_is_acyclic_and_its_edges_are_seen() {
        let g = graph(&with(&[]));
        assert_eq!(check(&g), "");
        // Through the re-export to the defining module; the re-export itself is no edge.
        assert!(g[&vec!["scheduler".to_string(), "core".to_string()]]
            .contains_key(&vec!["step".to_string(), "batch".to_string()]));
        assert!(!g[&vec!["scheduler".to_string()]]
            .contains_key(&vec!["scheduler".to_string(), "core".to_string()]));
        // Test-only modules are not nodes.
        assert!(!g.contains_key(&vec!["fixture".to_string()]));
    }

    #[test]
    fn catches_an_injected_cycle_through_a_reexport() {
        // step::batch now reaches the scheduler core through `scheduler`'s re-export.
        let g = graph(&with(&[(
            "step/batch.rs",
            "pub struct Batch; pub fn f(_: &crate::scheduler::Scheduler) {}",
        )]));
        let found = cycles(&g);
        assert_eq!(found.len(), 1, "{found:?}");
        let mut c = names(&found[0]);
        c.sort();
        assert_eq!(c, ["scheduler::core", "step::batch"]);
        let text = describe(&g, &found[0]);
        assert!(text.contains("crate::scheduler::Scheduler"), "{text}");
    }

    #[test]
    fn catches_a_cycle_through_super_and_a_glob() {
        let g = graph(&with(&[(
            "executor/cuda/device.rs",
            "use super::kernels::*; pub struct Gpu;",
        )]));
        let found = cycles(&g);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].len(), 2);
    }

    #[test]
    fn catches_a_cycle_written_only_inside_a_macro_call() {
        let g = graph(&with(&[(
            "step/batch.rs",
            r#"pub struct Batch; fn f() { tracing::debug!(x = %crate::executor::run as usize, "x"); }"#,
        )]));
        let found = cycles(&g);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(names(&found[0]).contains(&"executor".to_string()));
        assert!(
            check(&g).contains("among the modules of crate"),
            "{}",
            check(&g)
        );
    }

    #[test]
    fn catches_a_cycle_between_subsystems_that_no_file_cycle_shows() {
        // scheduler::core → step::batch is fine; step::batch → executor::cuda::device and
        // executor/mod.rs → scheduler::core close a loop of subsystems only.
        let g = graph(&with(&[
            (
                "step/batch.rs",
                "pub struct Batch; use crate::executor::cuda::device::Gpu;",
            ),
            (
                "executor/mod.rs",
                "pub mod cuda; pub fn run(_: crate::scheduler::Scheduler) {}",
            ),
        ]));
        assert!(cycles(&g).is_empty(), "no cycle of files");
        let report = check(&g);
        assert!(report.contains("among the modules of crate"), "{report}");
        assert!(report.contains("step → executor"), "{report}");
        // A child using its parent's own code, and the parent's code using it back.
        let g = graph(&with(&[
            (
                "executor/cuda/mod.rs",
                "pub mod device; pub mod kernels; pub fn f() { kernels::launch(&device::Gpu) } \
             use self::kernels as k;",
            ),
            (
                "executor/cuda/kernels.rs",
                "use super::device::Gpu; pub fn launch(_: &Gpu) { super::f() }",
            ),
        ]));
        let report = check(&g);
        assert!(
            report.contains("among the modules of executor::cuda"),
            "{report}"
        );
    }

    #[test]
    fn catches_a_three_module_cycle_and_ignores_test_items() {
        let three = with(&[
            (
                "step/batch.rs",
                "pub struct Batch; use crate::executor::cuda::device::Gpu;",
            ),
            (
                "executor/cuda/device.rs",
                "pub struct Gpu; fn g() { crate::scheduler::Config; }",
            ),
        ]);
        // step::batch → device → scheduler? No: scheduler (mod.rs) uses nothing; add that edge.
        let mut three = three;
        three.retain(|(m, _)| show(m) != "scheduler");
        three.push((
            vec!["scheduler".to_string()],
            "mod core; pub use self::core::Scheduler; pub struct Config(crate::step::Batch);"
                .into(),
        ));
        let found = cycles(&graph(&three));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].len(), 3, "{:?}", names(&found[0]));

        // The same back edge in test-only code is not a dependency.
        let test_only = with(&[(
            "step/batch.rs",
            "pub struct Batch; #[cfg(test)] mod tests { use crate::scheduler::Scheduler; } \
             #[cfg(test)] fn t() { crate::executor::run(Batch); }",
        )]);
        assert!(cycles(&graph(&test_only)).is_empty());
    }
}
