//! Rule "no cross-site calls": a browser sends a page's POST to another
//! site without asking first (no CORS preflight) when it carries no custom
//! header and a CORS-safelisted `Content-Type` (`text/plain`, the form
//! types) or none. The page cannot read the answer, but the call would run.
//! So an RPC is refused on every HTTP protocol when its `Origin` is neither
//! this server's own nor in `--cors_allowed_origins` (403), or when it has no
//! `Content-Type` or a safelisted one (415); the stock daemons' `http+pb`
//! always sends `application/x-protobuf` and no `Origin`.

use axum::http::{HeaderMap, HeaderValue, header};

use crate::rpc::error::{ApiError, ErrorKind};

/// The media types a browser sends across sites without a preflight
/// (Fetch standard, "CORS-safelisted request-header").
const SAFELISTED_TYPES: [&str; 3] = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
];

/// Refuses a call a page of another site could make: see the module.
/// `authority` is the request's host (`Host`, or HTTP/2's `:authority`).
pub fn refuse_cross_site(
    headers: &HeaderMap,
    authority: Option<&str>,
    allowed: &[HeaderValue],
) -> Result<(), ApiError> {
    if let Some(origin) = headers.get(header::ORIGIN)
        && !origin_allowed(origin, authority, allowed)
    {
        return Err(ApiError::new(
            ErrorKind::CrossSite,
            format!(
                "calls from pages of {} are refused: list the origin in --cors_allowed_origins",
                origin.to_str().unwrap_or("another site")
            ),
        ));
    }
    let essence = headers.get(header::CONTENT_TYPE).map(|value| {
        value
            .to_str()
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    });
    match essence {
        None => Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            "no Content-Type: send application/x-protobuf, application/proto or \
             application/json (a request without one could come from another site's page)",
        )),
        Some(essence) if SAFELISTED_TYPES.contains(&essence.as_str()) => Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            format!(
                "Content-Type {essence} is what any page may send across sites: send \
                 application/x-protobuf, application/proto or application/json"
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// This server's own pages (the origin names the host the request was sent
/// to, on either scheme), `*`, or a listed origin.
fn origin_allowed(origin: &HeaderValue, authority: Option<&str>, allowed: &[HeaderValue]) -> bool {
    if allowed
        .iter()
        .any(|listed| listed == "*" || listed == origin)
    {
        return true;
    }
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let host = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    host.zip(authority)
        .is_some_and(|(host, authority)| host.eq_ignore_ascii_case(authority))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    header::HeaderName::from_static(name),
                    HeaderValue::from_static(value),
                )
            })
            .collect()
    }

    fn kind(result: Result<(), ApiError>) -> Option<ErrorKind> {
        result.err().map(|error| error.kind)
    }

    #[test]
    fn another_sites_origin_is_refused_unless_listed() {
        let proto = ("content-type", "application/proto");
        let evil = headers(&[("origin", "http://evil.example"), proto]);
        assert_eq!(
            kind(refuse_cross_site(&evil, Some("sched:8336"), &[])),
            Some(ErrorKind::CrossSite)
        );
        let listed = [HeaderValue::from_static("http://evil.example")];
        assert_eq!(kind(refuse_cross_site(&evil, None, &listed)), None);
        let any = [HeaderValue::from_static("*")];
        assert_eq!(kind(refuse_cross_site(&evil, None, &any)), None);
        let own = headers(&[("origin", "https://sched:8336"), proto]);
        assert_eq!(kind(refuse_cross_site(&own, Some("sched:8336"), &[])), None);
        assert_eq!(
            kind(refuse_cross_site(&own, Some("sched:9000"), &[])),
            Some(ErrorKind::CrossSite)
        );
        let daemon = headers(&[("content-type", "application/x-protobuf")]);
        assert_eq!(kind(refuse_cross_site(&daemon, None, &[])), None);
    }

    #[test]
    fn a_missing_or_safelisted_content_type_is_refused() {
        for refused in [
            headers(&[]),
            headers(&[("content-type", "text/plain")]),
            headers(&[("content-type", "Text/Plain; charset=utf-8")]),
            headers(&[("content-type", "application/x-www-form-urlencoded")]),
            headers(&[("content-type", "multipart/form-data; boundary=x")]),
        ] {
            assert_eq!(
                kind(refuse_cross_site(&refused, None, &[])),
                Some(ErrorKind::UnsupportedMediaType),
                "{refused:?}"
            );
        }
        for accepted in ["application/json", "application/grpc", "application/proto"] {
            let headers = headers(&[("content-type", accepted)]);
            assert_eq!(kind(refuse_cross_site(&headers, None, &[])), None);
        }
    }
}
