//! CPU time and memory of a process on this host, from `/proc` (Linux), so a
//! benchmark can say what the scheduler spent, not only what the client saw.

use std::time::Duration;

/// One reading of `/proc/PID/stat` and `/proc/PID/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSample {
    /// User + system CPU time so far.
    pub cpu: Duration,
    /// Resident set size now, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident set size, KiB (`VmHWM`).
    pub peak_rss_kib: u64,
}

/// Reads the process's CPU time and memory; `None` if it is gone or this is
/// not Linux.
pub fn sample(pid: u32) -> Option<ProcessSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse(&stat, &status)
}

fn parse(stat: &str, status: &str) -> Option<ProcessSample> {
    // Fields after the command name (which may hold spaces and parentheses)
    // start with the state; utime and stime are the 12th and 13th of those.
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let kib = |name: &str| {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(ProcessSample {
        // USER_HZ is 100 on every Linux architecture this runs on.
        cpu: Duration::from_millis(ticks * 10),
        rss_kib: kib("VmRSS:"),
        peak_rss_kib: kib("VmHWM:"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_ticks_and_memory() {
        let stat = "42 (tokio (rt) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        let status = "Name:\tx\nVmHWM:\t  20480 kB\nVmRSS:\t  10240 kB\n";
        let sample = parse(stat, status).unwrap();
        assert_eq!(sample.cpu, Duration::from_secs(3));
        assert_eq!(sample.rss_kib, 10240);
        assert_eq!(sample.peak_rss_kib, 20480);
    }

    #[test]
    fn this_process_can_be_read() {
        if cfg!(target_os = "linux") {
            assert!(sample(std::process::id()).is_some());
        }
    }
}
