//! The page and its ES modules, embedded in the binary from `web/`, and the
//! security headers on every dashboard and inspection answer. One list,
//! [`ASSETS`], both embeds the files and routes them; a test checks it
//! against the files in `web/` and against every module's imports.

use std::sync::Arc;

use axum::{
    Router,
    extract::Request,
    http::{HeaderValue, header},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::get,
};

use super::Dashboard;

/// One file of the page, embedded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    /// Path under `web/`, which is also its URL path under the dashboard.
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

/// The file the dashboard serves at `/`.
const INDEX: &str = "index.html";

/// The `Content-Type` for a file name. Browsers run a module script only
/// when it comes as JavaScript (`text/javascript`, RFC 9239).
const fn content_type_of(path: &str) -> &'static str {
    if ends_with(path, ".js") {
        "text/javascript; charset=utf-8"
    } else if ends_with(path, ".css") {
        "text/css; charset=utf-8"
    } else if ends_with(path, ".html") {
        "text/html; charset=utf-8"
    } else {
        panic!("web/ holds .html, .css and .js files only: give the new kind its Content-Type here")
    }
}

const fn ends_with(text: &str, suffix: &str) -> bool {
    let (text, suffix) = (text.as_bytes(), suffix.as_bytes());
    if suffix.len() > text.len() {
        return false;
    }
    let offset = text.len() - suffix.len();
    let mut i = 0;
    while i < suffix.len() {
        if text[offset + i] != suffix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Embeds each named file of `web/` with the `Content-Type` its name calls for.
macro_rules! web_assets {
    ($($path:literal),* $(,)?) => {
        [$(Asset {
            path: $path,
            content_type: content_type_of($path),
            body: include_str!(concat!("../../web/", $path)),
        }),*]
    };
}

/// Every file of the page: the entry module `app.js` imports the rest.
pub const ASSETS: &[Asset] = &web_assets![
    "index.html",
    "style.css",
    "app.js",
    "api.js",
    "cells.js",
    "chart.js",
    "chart-geometry.js",
    "dom.js",
    "format.js",
    "store.js",
    "table.js",
    "views/admin.js",
    "views/environments.js",
    "views/grants.js",
    "views/requesters.js",
    "views/servants.js",
    "views/status.js",
    "views/summary.js",
    "views/tabs.js",
    "views/tenants.js",
];

impl Asset {
    /// The URL path it is served at.
    pub fn url_path(&self) -> String {
        if self.path == INDEX {
            "/".to_owned()
        } else {
            format!("/{}", self.path)
        }
    }

    fn response(&self) -> Response {
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(self.content_type),
                ),
                // Revalidated on every load: a new binary's page never runs
                // with an older module from the cache.
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            self.body,
        )
            .into_response()
    }
}

/// A route for every asset.
pub(super) fn routes() -> Router<Arc<Dashboard>> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        router.route(&asset.url_path(), get(|| async { asset.response() }))
    })
}

/// The dashboard's `Content-Security-Policy`: its own scripts (module scripts
/// included), styles and JSON only, never framed. The page has no inline
/// script or style attribute (the browser test runs it under this policy).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Headers on every answer of the dashboard and the inspection API, refusals
/// included.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
];

pub(super) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeSet,
        path::{Path, PathBuf},
    };

    use super::*;

    fn files_under(dir: &Path, root: &Path, found: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("web/ is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                files_under(&path, root, found);
            } else {
                let relative = path.strip_prefix(root).expect("under web/");
                found.insert(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }

    #[test]
    fn every_file_in_web_is_embedded_and_nothing_else() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("web");
        let mut on_disk = BTreeSet::new();
        files_under(&root, &root, &mut on_disk);
        let embedded: BTreeSet<String> = ASSETS.iter().map(|asset| asset.path.to_owned()).collect();
        assert_eq!(embedded.len(), ASSETS.len(), "an asset is listed twice");
        assert_eq!(
            embedded, on_disk,
            "ASSETS must list exactly the files in web/"
        );
    }

    /// `dir/../x.js` and `./x.js` against the importing file's folder.
    fn resolve(from: &str, target: &str) -> String {
        let mut parts: Vec<&str> = from.split('/').collect();
        parts.pop();
        for part in target.split('/') {
            match part {
                "." => {}
                ".." => {
                    parts.pop();
                }
                name => parts.push(name),
            }
        }
        parts.join("/")
    }

    /// The quoted text after each occurrence of `marker`.
    fn quoted_after<'a>(text: &'a str, marker: &str, quote: char) -> Vec<&'a str> {
        text.match_indices(marker)
            .filter_map(|(at, _)| {
                let rest = &text[at + marker.len()..];
                rest.find(quote).map(|end| &rest[..end])
            })
            .collect()
    }

    #[test]
    fn every_module_and_file_the_page_loads_is_embedded() {
        let served: BTreeSet<&str> = ASSETS.iter().map(|asset| asset.path).collect();
        let mut loaded = Vec::new();
        for asset in ASSETS {
            if asset.path.ends_with(".js") {
                for target in quoted_after(asset.body, " from '", '\'') {
                    assert!(
                        target.starts_with("./") || target.starts_with("../"),
                        "{}: imports must be relative to work behind a path prefix: {target}",
                        asset.path
                    );
                    loaded.push((asset.path, resolve(asset.path, target)));
                }
            }
        }
        let index = ASSETS.iter().find(|asset| asset.path == INDEX).unwrap();
        let scripts = quoted_after(index.body, "<script type=\"module\" src=\"", '"');
        assert_eq!(scripts, ["app.js"], "one entry module");
        let stylesheets = quoted_after(index.body, "<link rel=\"stylesheet\" href=\"", '"');
        for target in scripts.into_iter().chain(stylesheets) {
            loaded.push((INDEX, resolve(INDEX, target)));
        }
        assert!(loaded.len() > ASSETS.len(), "the scan found the imports");
        for (from, target) in &loaded {
            assert!(
                served.contains(target.as_str()),
                "{from} loads {target}, which is not served"
            );
        }
        for asset in ASSETS.iter().filter(|asset| asset.path != INDEX) {
            assert!(
                loaded.iter().any(|(_, target)| target == asset.path),
                "{} is served but nothing loads it",
                asset.path
            );
        }
    }

    #[test]
    fn the_page_preloads_every_module_its_entry_imports() {
        let index = ASSETS.iter().find(|asset| asset.path == INDEX).unwrap();
        let preloaded: BTreeSet<&str> =
            quoted_after(index.body, "<link rel=\"modulepreload\" href=\"", '"')
                .into_iter()
                .collect();
        let modules: BTreeSet<&str> = ASSETS
            .iter()
            .map(|asset| asset.path)
            .filter(|path| path.ends_with(".js") && *path != "app.js")
            .collect();
        assert_eq!(
            preloaded, modules,
            "index.html's modulepreload links name every module but the entry"
        );
    }

    #[test]
    fn modules_go_out_as_javascript_and_the_page_at_the_root() {
        for asset in ASSETS {
            let expected = match asset.path.rsplit_once('.').map(|(_, ext)| ext) {
                Some("js") => "text/javascript; charset=utf-8",
                Some("css") => "text/css; charset=utf-8",
                _ => "text/html; charset=utf-8",
            };
            assert_eq!(asset.content_type, expected, "{}", asset.path);
        }
        assert_eq!(ASSETS[0].url_path(), "/");
        let chart = ASSETS
            .iter()
            .find(|asset| asset.path == "chart.js")
            .unwrap();
        assert_eq!(chart.url_path(), "/chart.js");
        let view = ASSETS
            .iter()
            .find(|asset| asset.path == "views/servants.js")
            .unwrap();
        assert_eq!(view.url_path(), "/views/servants.js");
    }
}
