//! Who may use the server: an optional API key (compared in constant time) and, for WebSockets,
//! an Origin allow-list. The key travels as `Authorization: Bearer <key>` (HTTP and WS), or, for
//! browsers, which cannot set headers on a WebSocket, as the subprotocol `bearer.<key>` next to
//! `brook`, or as `?api_key=<key>`.

use actix_web::http::header;
use actix_web::HttpRequest;
use serde::Deserialize;

use super::edge_error::EdgeError;
pub use crate::access::{AllowedOrigins, ApiKey, MIN_KEY_LEN};
use crate::config::ServerConfig;

/// Subprotocol entry that carries the key: `Sec-WebSocket-Protocol: brook, bearer.<key>`.
const SUBPROTOCOL_KEY_PREFIX: &str = "bearer.";

/// The access policy of one server.
#[derive(Debug, Clone)]
pub struct Access {
    key: Option<ApiKey>,
    origins: AllowedOrigins,
    public_metrics: bool,
}

#[derive(Deserialize)]
struct KeyQuery {
    api_key: Option<String>,
}

fn bearer(req: &HttpRequest) -> Option<String> {
    let v = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

fn subprotocol_key(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| {
            p.trim()
                .strip_prefix(SUBPROTOCOL_KEY_PREFIX)
                .map(str::to_string)
        })
}

fn query_key(req: &HttpRequest) -> Option<String> {
    actix_web::web::Query::<KeyQuery>::from_query(req.query_string())
        .ok()?
        .into_inner()
        .api_key
}

impl Access {
    pub fn from_config(c: &ServerConfig) -> Result<Self, String> {
        Ok(Access {
            key: c.api_key.clone(),
            origins: AllowedOrigins::parse(&c.allowed_origins)?,
            public_metrics: c.public_metrics,
        })
    }

    pub fn requires_key(&self) -> bool {
        self.key.is_some()
    }

    /// The first credential presented (header, then subprotocol, then query) must match.
    fn check_key(&self, presented: Option<String>) -> Result<(), EdgeError> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        match presented {
            None => Err(EdgeError::MissingKey),
            Some(p) if key.matches(&p) => Ok(()),
            Some(_) => Err(EdgeError::WrongKey),
        }
    }

    /// A WebSocket upgrade: origin first (a refused page learns nothing about the key), then
    /// the key by any of the three ways.
    pub fn check_ws(&self, req: &HttpRequest) -> Result<(), EdgeError> {
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            if !self.origins.allows(origin) {
                return Err(EdgeError::OriginNotAllowed(
                    origin.chars().take(200).collect(),
                ));
            }
        }
        self.check_key(
            bearer(req)
                .or_else(|| subprotocol_key(req))
                .or_else(|| query_key(req)),
        )
    }

    /// The OpenAI-compatible HTTP API: behind the key when one is set, as
    /// `Authorization: Bearer <key>` (what OpenAI clients send).
    pub fn check_http_api(&self, req: &HttpRequest) -> Result<(), EdgeError> {
        self.check_key(bearer(req))
    }

    /// `/metrics`: behind the key when one is set, unless `public_metrics`.
    pub fn check_metrics(&self, req: &HttpRequest) -> Result<(), EdgeError> {
        if self.public_metrics {
            return Ok(());
        }
        self.check_key(bearer(req))
    }

    /// `/v1/dashboard/stream` shows what `/metrics` shows, under the same policy; a browser's
    /// EventSource cannot send headers, so `?api_key=` is accepted too.
    pub fn check_dashboard(&self, req: &HttpRequest) -> Result<(), EdgeError> {
        if self.public_metrics {
            return Ok(());
        }
        self.check_key(bearer(req).or_else(|| query_key(req)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    const KEY: &str = "0123456789abcdef-key";

    fn access(key: bool, origins: &[&str]) -> Access {
        let c = ServerConfig {
            api_key: key.then(|| ApiKey::new(KEY).unwrap()),
            allowed_origins: origins.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        Access::from_config(&c).unwrap()
    }

    #[test]
    fn key_rules_and_redaction() {
        assert!(ApiKey::new("short").is_err());
        assert!(ApiKey::new("has a space in it!!").is_err());
        assert!(ApiKey::new("has,a,comma,in,it,x").is_err());
        let k = ApiKey::new(KEY).unwrap();
        assert!(k.matches(KEY));
        assert!(!k.matches("0123456789abcdef-kez"));
        assert!(!k.matches(""));
        assert!(!format!("{k:?}").contains("0123"));
    }

    #[test]
    fn key_by_header_subprotocol_or_query() {
        let a = access(true, &[]);
        let ok = [
            TestRequest::default().insert_header(("Authorization", format!("Bearer {KEY}"))),
            TestRequest::default().insert_header(("authorization", format!("bearer  {KEY}"))),
            TestRequest::default()
                .insert_header(("Sec-WebSocket-Protocol", format!("brook, bearer.{KEY}"))),
            TestRequest::with_uri(&format!("/v1/ws?x=1&api_key={KEY}")),
        ];
        for r in ok {
            assert_eq!(a.check_ws(&r.to_http_request()), Ok(()));
        }
        let missing = TestRequest::default().to_http_request();
        assert_eq!(a.check_ws(&missing), Err(EdgeError::MissingKey));
        let wrong = TestRequest::with_uri("/v1/ws?api_key=nope").to_http_request();
        assert_eq!(a.check_ws(&wrong), Err(EdgeError::WrongKey));
        let basic = TestRequest::default()
            .insert_header(("Authorization", format!("Basic {KEY}")))
            .to_http_request();
        assert_eq!(a.check_ws(&basic), Err(EdgeError::MissingKey));
        // Without a key configured, anything passes.
        assert_eq!(access(false, &[]).check_ws(&missing), Ok(()));
    }

    #[test]
    fn metrics_need_the_header_key_unless_public() {
        let query = TestRequest::with_uri(&format!("/metrics?api_key={KEY}")).to_http_request();
        assert_eq!(
            access(true, &[]).check_metrics(&query),
            Err(EdgeError::MissingKey)
        );
        let c = ServerConfig {
            api_key: Some(ApiKey::new(KEY).unwrap()),
            public_metrics: true,
            ..Default::default()
        };
        assert_eq!(
            Access::from_config(&c).unwrap().check_metrics(&query),
            Ok(())
        );
    }

    #[test]
    fn the_http_api_takes_the_key_as_a_bearer_header_only() {
        let a = access(true, &[]);
        let req = |h: Option<String>| {
            let mut t = TestRequest::with_uri(&format!("/v1/completions?api_key={KEY}"));
            if let Some(h) = h {
                t = t.insert_header(("Authorization", h));
            }
            t.to_http_request()
        };
        assert_eq!(
            a.check_http_api(&req(Some(format!("Bearer {KEY}")))),
            Ok(())
        );
        assert_eq!(
            a.check_http_api(&req(Some("Bearer wrong-key-0123456789".into()))),
            Err(EdgeError::WrongKey)
        );
        assert_eq!(a.check_http_api(&req(None)), Err(EdgeError::MissingKey));
        assert_eq!(access(false, &[]).check_http_api(&req(None)), Ok(()));
    }

    #[test]
    fn origins() {
        assert!(AllowedOrigins::parse(&["ftp://x".into()]).is_err());
        assert!(AllowedOrigins::parse(&["https://x.com/path".into()]).is_err());
        // What a browser never sends is refused at start, by what is wrong.
        for (bad, why) in [
            ("https://a.com?x=1", "query"),
            ("https://a.com:99999", "port"),
            ("https://a.com:0", "port"),
            ("https://user:pw@a.com", "user"),
            ("https://", "not an origin"),
        ] {
            let e = AllowedOrigins::parse(&[bad.into()]).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // The scheme's default port is what browsers leave out.
        let list = AllowedOrigins::parse(&["https://a.com:443".into(), "http://b.org:80/".into()]);
        let list = list.unwrap();
        assert!(list.allows("https://a.com") && list.allows("http://b.org"));
        assert!(list.allows("https://a.com:443") && !list.allows("https://a.com:8443"));
        let v6 = AllowedOrigins::parse(&["http://[::1]:8080".into()]).unwrap();
        assert!(v6.allows("http://[::1]:8080"));
        assert!(AllowedOrigins::parse(&["http://[::1]".into()]).is_ok());
        assert_eq!(
            AllowedOrigins::parse(&["https://a.com".into(), "*".into()]),
            Ok(AllowedOrigins::Any)
        );
        let a = access(
            false,
            &["https://chat.example.com/", "http://localhost:3000"],
        );
        let with = |origin: &str, host: &str| {
            TestRequest::default()
                .insert_header(("Origin", origin))
                .insert_header(("Host", host))
                .to_http_request()
        };
        assert_eq!(
            a.check_ws(&with("https://CHAT.example.com", "api:8080")),
            Ok(())
        );
        assert_eq!(
            a.check_ws(&with("http://localhost:3000", "api:8080")),
            Ok(())
        );
        let refused = |origin: &str, host: &str| {
            matches!(
                a.check_ws(&with(origin, host)),
                Err(EdgeError::OriginNotAllowed(_))
            )
        };
        assert!(refused("https://evil.example", "api:8080"));
        assert!(refused("null", "api:8080"));
        // Matching the Host header is not enough (DNS rebinding).
        assert!(refused("http://evil.example:8080", "evil.example:8080"));
        // No Origin header: a non-browser client.
        assert_eq!(
            a.check_ws(&TestRequest::default().to_http_request()),
            Ok(())
        );
    }
}
