//! The names this server answers browser pages by (rule "no rebinding",
//! applied by `http::rebinding`): plain data and the rule, for the leaf.

use std::sync::Arc;

/// The names a browser page may reach this server by, besides IP literals
/// and loopback names: the machine's own and `--allowed_hosts`, lower-case.
/// A name starting with `.` stands for every name under it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts(pub Arc<[String]>);

impl AllowedHosts {
    pub fn new<I: IntoIterator<Item = String>>(names: I) -> Self {
        AllowedHosts(
            names
                .into_iter()
                .map(|name| name.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|name| !name.is_empty())
                .collect(),
        )
    }

    /// Whether a request for `authority` (`Host` or `:authority`, with or
    /// without a port) may be served to a page.
    pub fn allows(&self, authority: &str) -> bool {
        let host = host_of(authority)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if host.parse::<std::net::IpAddr>().is_ok() {
            return true;
        }
        if host == "localhost" || host.ends_with(".localhost") {
            return true;
        }
        self.0.iter().any(|name| match name.strip_prefix('.') {
            Some(suffix) => host.ends_with(name.as_str()) || host == suffix,
            None => *name == host,
        })
    }
}

/// The host of an authority: `[v6]:port`, `[v6]`, `name:port`, `name`.
fn host_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literals_loopback_names_and_listed_names_are_allowed() {
        let allowed = AllowedHosts::new(["Build-01".to_owned(), ".farm.example.".to_owned()]);
        for host in [
            "127.0.0.1:8336",
            "10.1.2.3",
            "[::1]:8336",
            "[2001:db8::1]",
            "localhost:8336",
            "LOCALHOST",
            "dash.localhost:80",
            "build-01:8336",
            "farm.example",
            "sched.farm.example:443",
            "localhost.",
        ] {
            assert!(allowed.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8336",
            "build-01.evil.example",
            "localhost.evil.example",
            "notfarm.example",
            "",
        ] {
            assert!(!allowed.allows(host), "{host}");
        }
    }
}
