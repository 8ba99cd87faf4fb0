//! The operators' side over a real engine: who may act, the order of the
//! checks, save-then-apply, and the audit.

use std::path::PathBuf;

use super::*;
use crate::engine::{self, CordonState, GrantFence};

const ADMIN: &str = "admin-token-1";
const USER: &str = "user-token-1";

fn engine() -> Scheduler {
    Scheduler::new(engine::Config {
        user_tokens: engine::TokenSet::new([USER]),
        ..engine::Config::default()
    })
}

fn admin_with(engine: &Scheduler, store: Store) -> Admin {
    Admin::new(
        AdminTokens::new([ADMIN, "alice:admin-token-2"]),
        engine.clone(),
        Leadership::solo(),
        store,
    )
}

fn caller(admin: &Admin) -> Operator {
    admin
        .authenticate(
            &Credentials::bearer(ADMIN),
            "10.1.2.3".parse().unwrap(),
            Protocol::Connect,
        )
        .expect("an admin token")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("yadcc-admin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn only_an_admin_token_may_act_and_a_missing_one_is_told_apart() {
    let engine = engine();
    let admin = admin_with(&engine, Store::Memory);
    let peer = "10.1.2.3".parse().unwrap();
    let with = |credentials: Credentials| admin.authenticate(&credentials, peer, Protocol::HttpPb);
    assert!(matches!(
        with(Credentials::NONE),
        Err(AdminError::Unauthenticated(_))
    ));
    for token in [USER, "wrong", ""] {
        assert!(
            matches!(
                with(Credentials::bearer(token)),
                Err(AdminError::Forbidden(_))
            ),
            "{token:?}"
        );
    }
    let accepted = with(Credentials::bearer("admin-token-2")).unwrap();
    assert_eq!(
        accepted.identity.to_string(),
        "token:alice",
        "the operator's label, nothing derived from the token"
    );
    // Closed without --admin_tokens: even a token is refused.
    let closed = Admin::closed(engine, Leadership::solo());
    assert!(matches!(
        closed.authenticate(&Credentials::bearer(ADMIN), peer, Protocol::HttpPb),
        Err(AdminError::Forbidden(_))
    ));
}

#[tokio::test]
async fn an_action_is_saved_audited_newest_first_and_read_back_after_a_restart() {
    let dir = scratch("saved");
    let path = dir.join("state.json");
    let engine = engine();
    let admin = admin_with(&engine, Store::File(path.clone()));
    let caller = caller(&admin);
    let cordoned = admin
        .cordon(&caller, "10.0.0.1:8335", "bad disk", false)
        .await
        .unwrap();
    assert_eq!(cordoned.state, CordonState::Cordoned);
    assert_eq!(cordoned.cordon.by, caller.identity.to_string());
    admin
        .cordon(&caller, "10.0.0.2:8335", "maintenance", true)
        .await
        .unwrap();
    assert!(admin.uncordon(&caller, "10.0.0.1:8335").await.unwrap());
    assert!(!admin.uncordon(&caller, "10.0.0.1:8335").await.unwrap());

    let actions: Vec<String> = admin
        .audit_events()
        .into_iter()
        .map(|event| event.action)
        .collect();
    assert_eq!(
        actions,
        [
            "UncordonServant",
            "UncordonServant",
            "DrainServant",
            "CordonServant"
        ]
    );
    let first = admin.audit_events().pop().unwrap();
    assert_eq!(first.location, "10.0.0.1:8335");
    assert_eq!(first.reason, "bad disk");
    assert_eq!(first.peer, "10.1.2.3");
    assert_eq!(first.protocol, "connect");

    // What the file holds is what a restarted scheduler starts with.
    let saved = store::read_file(&path).unwrap().expect("a saved state");
    assert_eq!(saved, admin.state());
    let restarted_engine = self::engine();
    let restarted = admin_with(&restarted_engine, Store::File(path));
    restarted.restore(Some(saved));
    let states: Vec<(String, CordonState)> = restarted
        .servant_states()
        .into_iter()
        .map(|view| (view.location.to_string(), view.state))
        .collect();
    assert_eq!(states, [("10.0.0.2:8335".to_owned(), CordonState::Drained)]);
    assert_eq!(restarted.audit_events(), admin.audit_events());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_state_that_cannot_be_saved_changes_nothing() {
    let dir = scratch("unsaved");
    let engine = engine();
    let admin = admin_with(
        &engine,
        Store::File(dir.join("no-such-directory").join("state.json")),
    );
    let caller = caller(&admin);
    let refused = admin.cordon(&caller, "10.0.0.1:8335", "", false).await;
    assert!(
        matches!(refused, Err(AdminError::NotSaved(_))),
        "{refused:?}"
    );
    assert!(engine.cordons().is_empty(), "not applied");
    assert!(admin.audit_events().is_empty(), "not audited as done");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn arguments_are_checked_before_anything_is_saved() {
    let dir = scratch("arguments");
    let path = dir.join("state.json");
    let engine = engine();
    let admin = admin_with(&engine, Store::File(path.clone()));
    let caller = caller(&admin);
    for location in ["", "10.0.0.1", "servant-7:8335"] {
        let refused = admin.cordon(&caller, location, "", true).await;
        assert!(
            matches!(refused, Err(AdminError::InvalidArgument(_))),
            "{location:?}: {refused:?}"
        );
        let refused = admin.uncordon(&caller, location).await;
        assert!(matches!(refused, Err(AdminError::InvalidArgument(_))));
    }
    assert!(!path.exists(), "nothing saved");
    assert!(admin.audit_events().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_standby_taking_over_does_not_act() {
    let fence = GrantFence::closed();
    let engine = Scheduler::new(engine::Config {
        grant_fence: fence.clone(),
        ..engine::Config::default()
    });
    let leadership = Leadership::elected(engine.clone(), fence);
    let admin = Admin::new(
        AdminTokens::new([ADMIN]),
        engine.clone(),
        leadership.clone(),
        Store::Etcd(leadership),
    );
    let caller = caller(&admin);
    let refused = admin.cordon(&caller, "10.0.0.1:8335", "", false).await;
    assert!(
        matches!(refused, Err(AdminError::NotLeading(_))),
        "{refused:?}"
    );
    assert!(engine.cordons().is_empty());
}
