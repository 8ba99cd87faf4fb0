//! Who may call each operation: every operation declares its `security`,
//! the inspection API's basic-auth scheme when the server asks for it, the
//! admin token (a bearer token) on the operators' service, an empty list
//! (open) everywhere else, so that linters and client generators need not
//! guess.

use serde_json::{Value, json};

use crate::pb;

/// Name of the basic-auth security scheme of the inspection API.
pub const INSPECT_SECURITY: &str = "inspectCredential";

/// Name of the bearer scheme of the operators' service (`--admin_tokens`).
pub const ADMIN_SECURITY: &str = "adminToken";

/// Whether `path` is an operation of the operators' service (either route style).
pub fn is_admin_path(path: &str) -> bool {
    path.starts_with(&format!("{}{}.", pb::RPC_PATH_PREFIX, pb::ADMIN_SERVICE))
        || path.starts_with(&format!("/{}/", pb::ADMIN_SERVICE))
}

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
    let mut schemes = json!({
        ADMIN_SECURITY: {
            "type": "http",
            "scheme": "bearer",
            "description": "A token of `--admin_tokens`, as `Authorization: Bearer <token>`: \
                the operators' service. Without one the answer is 401, with any other token \
                (a daemon's too) 403, both with `STATUS_ACCESS_DENIED`.",
        }
    });
    if inspect_auth {
        schemes[INSPECT_SECURITY] = json!({
            "type": "http",
            "scheme": "basic",
            "description": "The `user:password` of `--inspect_credential`, \
                guarding the dashboard and its API.",
        });
    }
    document["components"]["securitySchemes"] = schemes;
    for (path, item) in document["paths"]
        .as_object_mut()
        .expect("paths is an object")
        .iter_mut()
    {
        let security = if is_admin_path(path) {
            json!([{ ADMIN_SECURITY: [] }])
        } else if inspect_auth && is_inspection_path(path) {
            json!([{ INSPECT_SECURITY: [] }])
        } else {
            json!([])
        };
        for operation in item
            .as_object_mut()
            .into_iter()
            .flat_map(|ops| ops.values_mut())
        {
            operation["security"] = security.clone();
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
            let (mut guarded, mut admin) = (0, 0);
            for (path, item) in json["paths"].as_object().unwrap() {
                for operation in item.as_object().unwrap().values() {
                    let security = &operation["security"];
                    if is_admin_path(path) {
                        assert_eq!(security, &json!([{ ADMIN_SECURITY: [] }]), "{path}");
                        admin += 1;
                    } else if inspect_auth && is_inspection_path(path) {
                        assert_eq!(security, &json!([{ INSPECT_SECURITY: [] }]), "{path}");
                        guarded += 1;
                    } else {
                        assert_eq!(security, &json!([]), "{path}: open, and saying so");
                    }
                }
            }
            // The dashboard's three (overview, history, tenants) and the
            // dump's three GET operations.
            assert_eq!(guarded, if inspect_auth { 6 } else { 0 });
            // Every operators' RPC in both route styles.
            assert_eq!(admin, 2 * pb::Service::Admin.methods().len());
            assert_eq!(
                json["components"]["securitySchemes"][ADMIN_SECURITY]["scheme"],
                "bearer"
            );
            assert_eq!(
                json["components"]["securitySchemes"][INSPECT_SECURITY]["scheme"]
                    .as_str()
                    .is_some(),
                inspect_auth
            );
        }
    }
}
