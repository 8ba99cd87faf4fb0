//! Who may call each operation: every operation declares its `security`,
//! the inspection API's basic-auth scheme when the server asks for it, an
//! empty list (open) everywhere else, so that linters and client generators
//! need not guess.

use serde_json::{Value, json};

/// Name of the basic-auth security scheme of the inspection API.
pub const INSPECT_SECURITY: &str = "inspectCredential";

/// Path prefixes of the inspection API that [`INSPECT_SECURITY`] guards: the
/// dashboard's JSON and the original's inspection pages.
pub const INSPECT_API_PREFIXES: [&str; 2] = ["/api/v1/", "/inspect/"];

/// Whether `path` is behind the inspection credential.
pub fn is_inspection_path(path: &str) -> bool {
    INSPECT_API_PREFIXES
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

/// Declares `security` on every operation of `document`. With
/// `inspect_auth`, the basic-auth scheme is declared too and required by
/// every operation of the inspection API; every other operation is open (the
/// RPCs check their tokens themselves, in the body).
pub(super) fn declare_security(document: &mut Value, inspect_auth: bool) {
    if inspect_auth {
        document["components"]["securitySchemes"] = json!({
            INSPECT_SECURITY: {
                "type": "http",
                "scheme": "basic",
                "description": "The `user:password` of `--inspect_credential`, \
                    guarding the dashboard and its API.",
            }
        });
    }
    for (path, item) in document["paths"]
        .as_object_mut()
        .expect("paths is an object")
        .iter_mut()
    {
        let guarded = inspect_auth && is_inspection_path(path);
        for operation in item
            .as_object_mut()
            .into_iter()
            .flat_map(|ops| ops.values_mut())
        {
            operation["security"] = if guarded {
                json!([{ INSPECT_SECURITY: [] }])
            } else {
                json!([])
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openapi::document_for;

    #[test]
    fn basic_auth_covers_the_inspection_api_when_on() {
        for inspect_auth in [true, false] {
            let json = document_for(inspect_auth);
            let mut guarded = 0;
            for (path, item) in json["paths"].as_object().unwrap() {
                for operation in item.as_object().unwrap().values() {
                    let security = &operation["security"];
                    if inspect_auth && is_inspection_path(path) {
                        assert_eq!(security, &json!([{ INSPECT_SECURITY: [] }]), "{path}");
                        guarded += 1;
                    } else {
                        assert_eq!(security, &json!([]), "{path}: open, and saying so");
                    }
                }
            }
            // The dashboard's two and the dump's three GET operations.
            assert_eq!(guarded, if inspect_auth { 5 } else { 0 });
            assert_eq!(
                json["components"]["securitySchemes"][INSPECT_SECURITY]["scheme"]
                    .as_str()
                    .is_some(),
                inspect_auth
            );
        }
    }
}
