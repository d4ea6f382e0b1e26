//! One process per variant. A CUDA backend built after another one in the same process (the
//! first one dropped) ran its batch-1 decode steps ~0.7 % slower on the GPU, whatever its
//! switches: every variant that ran first in its process was as fast as the default, every one
//! after another backend slower (BENCHMARKS.md, session 31). So where a command builds one
//! backend per value of a list flag (`decode-variants` and `offline` by `--variants`; `decode`,
//! `decode-batch`, `ttft` and `offline` by `--kv-cache-dtype`), it runs each value in a child
//! process of this binary with the same arguments, the flag narrowed to that value. A child has
//! one value, so it splits no further on that flag. Backends built for one value (`decode`'s
//! and `ttft`'s variants, the leave-one-out breakdowns) still share their process.

use std::process::Command;

use anyhow::Context;

/// Runs each of `values` of `flag` (e.g. "--variants") in its own child process, in order, and
/// returns true (an error names the values whose child failed, after all of them ran). False
/// where there is nothing to split (fewer than two values): the caller runs it itself.
pub fn each_in_own_process(flag: &str, values: &[&str]) -> anyhow::Result<bool> {
    if values.len() < 2 {
        return Ok(false);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exe = std::env::current_exe().context("locating gpu-bench")?;
    let mut failed = Vec::new();
    for v in values {
        let status = Command::new(&exe)
            .args(narrowed(&args, flag, v))
            .status()
            .with_context(|| format!("starting {flag} {v}"))?;
        if !status.success() {
            failed.push(format!("{v} ({status})"));
        }
    }
    anyhow::ensure!(failed.is_empty(), "{flag} failed: {}", failed.join(", "));
    Ok(true)
}

/// `args` with every value of `flag` (`--flag a,b` or `--flag=a,b`) replaced by one `--flag
/// value`, appended where the flag is absent (its default may be a list).
fn narrowed(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 2);
    let mut it = args.iter();
    let with_eq = format!("{flag}=");
    while let Some(a) = it.next() {
        if a == flag {
            it.next();
        } else if !a.starts_with(&with_eq) {
            out.push(a.clone());
        }
    }
    out.extend([flag.to_string(), value.to_string()]);
    out
}

#[cfg(test)]
mod tests {
    use super::narrowed;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn narrows_the_flag_in_either_spelling() {
        let base = "decode-variants --model llama-2-7b --variants default,lookahead --batch 1";
        assert_eq!(
            narrowed(&args(base), "--variants", "lookahead"),
            args("decode-variants --model llama-2-7b --batch 1 --variants lookahead")
        );
        assert_eq!(
            narrowed(
                &args("offline --variants=untimed,all --kv-cache-dtype bf16,fp8"),
                "--kv-cache-dtype",
                "fp8"
            ),
            args("offline --variants=untimed,all --kv-cache-dtype fp8")
        );
    }

    #[test]
    fn appends_the_value_where_the_flag_was_absent_or_repeated() {
        // decode-variants without --variants runs them all: each child gets one.
        assert_eq!(
            narrowed(
                &args("decode-variants --input-len 128"),
                "--variants",
                "pinned"
            ),
            args("decode-variants --input-len 128 --variants pinned")
        );
        assert_eq!(
            narrowed(
                &args("ttft --kv-cache-dtype bf16 --kv-cache-dtype=fp8"),
                "--kv-cache-dtype",
                "bf16"
            ),
            args("ttft --kv-cache-dtype bf16")
        );
    }
}
