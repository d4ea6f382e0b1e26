//! Access-policy values the config holds and the server's gate applies: the API key (compared
//! in constant time, never printed) and the WebSocket Origin allow-list. A leaf module, so the
//! config can hold them without depending on the server.

use std::fmt;
use std::sync::Arc;

pub const MIN_KEY_LEN: usize = 16;
const MAX_KEY_LEN: usize = 512;

/// The API key. Its `Debug` never shows it, and equality is constant-time.
#[derive(Clone)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    /// At least 16 visible ASCII characters without spaces or commas (it travels in headers;
    /// for the subprotocol way it must also be an HTTP token, e.g. hex or base64url).
    pub fn new(key: &str) -> Result<Self, String> {
        if key.len() < MIN_KEY_LEN || key.len() > MAX_KEY_LEN {
            return Err(format!(
                "the API key must be {MIN_KEY_LEN} to {MAX_KEY_LEN} characters long, got {}",
                key.len()
            ));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
            return Err(
                "the API key must be visible ASCII characters without spaces or commas".into(),
            );
        }
        Ok(ApiKey(key.into()))
    }

    /// Constant-time in the key's content (only a length mismatch returns early, which tells
    /// an attacker nothing about the characters).
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq::constant_time_eq(self.0.as_bytes(), presented.as_bytes())
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl PartialEq for ApiKey {
    fn eq(&self, other: &Self) -> bool {
        self.matches(&other.0)
    }
}

/// Origins allowed to open a WebSocket.
#[derive(Debug, Clone, PartialEq)]
pub enum AllowedOrigins {
    Any,
    /// Normalized `scheme://host[:port]`, lower case.
    List(Vec<String>),
}

/// Lower case, without a trailing slash or the scheme's default port: the form browsers send
/// (`https://a.com`, never `https://a.com:443`).
fn normalize_origin(o: &str) -> String {
    let n = o.trim().trim_end_matches('/').to_ascii_lowercase();
    for (scheme, port) in [("http://", ":80"), ("https://", ":443")] {
        if let Some(host) = n.strip_prefix(scheme).and_then(|h| h.strip_suffix(port)) {
            return format!("{scheme}{host}");
        }
    }
    n
}

/// Why `host` (an origin's part after the scheme) cannot be one a browser sends.
fn origin_host_problem(host: &str) -> Option<&'static str> {
    if host.is_empty() {
        return Some("no host");
    }
    if host.contains(['/', '?', '#']) {
        return Some("a path, query or fragment");
    }
    if host.contains('@') {
        return Some("user information");
    }
    // The port after the last colon, unless that colon is inside an IPv6 address's brackets.
    let port = match host.rfind(':') {
        Some(i) if !host[i..].contains(']') => Some(&host[i + 1..]),
        _ => None,
    };
    match port {
        Some(p) if p.parse::<u16>().map_or(true, |p| p == 0) => Some("a port outside 1-65535"),
        _ => None,
    }
}

impl AllowedOrigins {
    /// Empty or containing `*`: any origin.
    pub fn parse(list: &[String]) -> Result<Self, String> {
        if list.is_empty() || list.iter().any(|o| o.trim() == "*") {
            return Ok(AllowedOrigins::Any);
        }
        let mut out = Vec::new();
        for o in list {
            let n = normalize_origin(o);
            let host = n
                .strip_prefix("http://")
                .or_else(|| n.strip_prefix("https://"))
                .ok_or_else(|| format!("{o:?} is not an origin: expected http(s)://host[:port]"))?;
            if let Some(what) = origin_host_problem(host) {
                return Err(format!(
                    "{o:?} is not an origin ({what}): expected http(s)://host[:port], as a browser's Origin header"
                ));
            }
            out.push(n);
        }
        Ok(AllowedOrigins::List(out))
    }

    /// Only listed origins pass; the server's own origin is not implied (a page on any host
    /// name the server answers to would pass, which DNS rebinding exploits): list it to use
    /// the bundled chat page.
    pub fn allows(&self, origin: &str) -> bool {
        match self {
            AllowedOrigins::Any => true,
            AllowedOrigins::List(list) => list.contains(&normalize_origin(origin)),
        }
    }
}
