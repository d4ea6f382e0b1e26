//! The browser page: `/` (chat) and `/dashboard` serve the same single-page app, whose scripts,
//! styles and vendored libraries are under `/static/`. Everything is compiled into the binary,
//! so `brook serve` works from any directory and there is no build step.

use actix_web::{http::header, web, HttpResponse};

const INDEX_HTML: &str = include_str!("../../static/index.html");

/// Scripts only from our own origin, no inline script, no plugins: model output that slipped
/// past the renderer still could not run. `connect-src 'self'` covers the same-origin WebSocket
/// and the dashboard's event stream.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// (path under /static/, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.css", CSS, include_bytes!("../../static/app.css")),
    ("js/app.js", JS, include_bytes!("../../static/js/app.js")),
    ("js/chat.js", JS, include_bytes!("../../static/js/chat.js")),
    ("js/conn.js", JS, include_bytes!("../../static/js/conn.js")),
    (
        "js/dashboard.js",
        JS,
        include_bytes!("../../static/js/dashboard.js"),
    ),
    (
        "js/markdown.js",
        JS,
        include_bytes!("../../static/js/markdown.js"),
    ),
    (
        "js/store.js",
        JS,
        include_bytes!("../../static/js/store.js"),
    ),
    (
        "vendor/uplot/uPlot.iife.min.js",
        JS,
        include_bytes!("../../static/vendor/uplot/uPlot.iife.min.js"),
    ),
    (
        "vendor/uplot/uPlot.min.css",
        CSS,
        include_bytes!("../../static/vendor/uplot/uPlot.min.css"),
    ),
    (
        "vendor/uplot/LICENSE",
        TEXT,
        include_bytes!("../../static/vendor/uplot/LICENSE"),
    ),
    (
        "vendor/README.md",
        TEXT,
        include_bytes!("../../static/vendor/README.md"),
    ),
    (
        "favicon.svg",
        SVG,
        include_bytes!("../../static/favicon.svg"),
    ),
];
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// `GET /` and `GET /dashboard`: the app picks its tab from the path.
pub async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type(header::ContentType::html())
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(INDEX_HTML)
}

fn find(path: &str) -> Option<&'static (&'static str, &'static str, &'static [u8])> {
    ASSETS.iter().find(|(p, _, _)| *p == path)
}

/// `GET /static/{path}`.
pub async fn asset(path: web::Path<String>) -> HttpResponse {
    match find(&path) {
        Some((_, content_type, body)) => HttpResponse::Ok()
            .content_type(*content_type)
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            // Revalidate each load: the binary may have been rebuilt with a new page.
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .body(*body),
        None => HttpResponse::NotFound().json(serde_json::json!({
            "error": "not_found",
            "message": format!("no static file {:?}", path.as_str()),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn files_under(dir: &Path, base: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                files_under(&p, base, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy();
                out.push(rel.replace('\\', "/"));
            }
        }
    }

    #[test]
    fn every_static_file_is_served_and_every_served_file_exists() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("static");
        let mut on_disk = Vec::new();
        files_under(&base, &base, &mut on_disk);
        on_disk.retain(|p| p != "index.html");
        on_disk.sort();
        let mut served: Vec<String> = ASSETS.iter().map(|(p, _, _)| p.to_string()).collect();
        served.sort();
        assert_eq!(on_disk, served, "static/ and ASSETS differ");
    }

    #[test]
    fn page_links_only_served_assets() {
        for (i, _) in INDEX_HTML.match_indices("/static/") {
            let rest = &INDEX_HTML[i + "/static/".len()..];
            let end = rest.find('"').unwrap();
            assert!(find(&rest[..end]).is_some(), "{} not served", &rest[..end]);
        }
        assert!(!INDEX_HTML.contains("<script>"), "no inline script (CSP)");
        assert!(!INDEX_HTML.contains("style=\""), "no inline style (CSP)");
    }
}
