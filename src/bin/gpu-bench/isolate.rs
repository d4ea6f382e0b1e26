//! One process per variant. A CUDA backend built after another one in the same process (the
//! first one dropped) ran its batch-1 decode steps ~0.7 % slower on the GPU, whatever its
//! switches: every variant that ran first in its process was as fast as the default, every one
//! after another backend slower (BENCHMARKS.md, session 31). So `decode-variants` and
//! `offline --variants` run each variant in a child process of this binary with the same
//! arguments, `--variants` narrowed to that one.

use std::process::Command;

use anyhow::Context;

/// Set in a child's environment: it runs its variants itself.
const CHILD: &str = "BROOK_BENCH_CHILD";

/// Runs each of `variants` in its own child process, in order, and returns true (an error names
/// the variants whose child failed, after all of them ran). False where there is nothing to
/// split (one variant, or this process is a child): the caller runs them itself.
pub fn each_in_own_process(variants: &[String]) -> anyhow::Result<bool> {
    if variants.len() < 2 || std::env::var_os(CHILD).is_some() {
        return Ok(false);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exe = std::env::current_exe().context("locating gpu-bench")?;
    let mut failed = Vec::new();
    for v in variants {
        let status = Command::new(&exe)
            .args(narrowed(&args, v))
            .env(CHILD, "1")
            .status()
            .with_context(|| format!("starting variant {v}"))?;
        if !status.success() {
            failed.push(format!("{v} ({status})"));
        }
    }
    anyhow::ensure!(failed.is_empty(), "variants failed: {}", failed.join(", "));
    Ok(true)
}

/// `args` with the value of `--variants` (`--variants a,b` or `--variants=a,b`) replaced by
/// `variant`, or `--variants variant` appended where there is none.
fn narrowed(args: &[String], variant: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut found = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--variants" {
            it.next();
        } else if !a.starts_with("--variants=") {
            out.push(a.clone());
            continue;
        }
        out.extend(["--variants".to_string(), variant.to_string()]);
        found = true;
    }
    if !found {
        out.extend(["--variants".to_string(), variant.to_string()]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::narrowed;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn narrows_the_variants_in_either_spelling() {
        let base = "decode-variants --model llama-2-7b --variants default,lookahead --batch 1";
        assert_eq!(
            narrowed(&args(base), "lookahead"),
            args("decode-variants --model llama-2-7b --variants lookahead --batch 1")
        );
        assert_eq!(
            narrowed(
                &args("offline --variants=untimed,all --num-prompts 8"),
                "all"
            ),
            args("offline --variants all --num-prompts 8")
        );
    }

    #[test]
    fn appends_the_variant_where_none_was_named() {
        // decode-variants without --variants runs them all: each child gets one.
        assert_eq!(
            narrowed(&args("decode-variants --input-len 128"), "pinned"),
            args("decode-variants --input-len 128 --variants pinned")
        );
    }
}
