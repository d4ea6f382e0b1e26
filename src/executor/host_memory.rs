//! The host's free memory, asked before the large host allocations (the CPU executor's KV pool,
//! the KV host tier): a size past it is refused with a message naming the setting, instead of
//! an allocation abort or the out-of-memory killer minutes later.

/// Bytes the kernel can hand out without swapping (`MemAvailable` of /proc/meminfo); None where
/// it cannot be read (not Linux), where nothing is checked.
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_available(&info)
}

fn parse_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses `bytes` of host memory for `what` (the settings that ask for it) when the host has
/// less available.
pub fn check(what: &str, bytes: usize) -> anyhow::Result<()> {
    let Some(free) = available_bytes() else {
        return Ok(());
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    anyhow::ensure!(
        bytes as u64 <= free,
        "{what} asks for {:.1} GiB of host memory; {:.1} GiB is available",
        gib(bytes as u64),
        gib(free)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available_and_refuses_past_it() {
        let info = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_available(info), Some(2048 * 1024));
        assert_eq!(parse_available("MemTotal: 1 kB\n"), None);
        if let Some(free) = available_bytes() {
            assert!(check("a test", 1 << 20).is_ok() || free < 1 << 20);
            let err = check("--kv-cache-mib", usize::MAX / 2)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--kv-cache-mib") && err.contains("available"),
                "{err}"
            );
        }
    }
}
