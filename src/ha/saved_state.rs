//! What must outlive a leader: the operators' state (cordons, the audit
//! list), one etcd value beside the election. A new leader reads it before
//! its fence opens (on every win, a takeover's too) and hands it to the
//! [`SavedStateKeeper`]; only the leader writes it, in a transaction that
//! holds only while its election key does, so an instance that lost the
//! election cannot overwrite what the next leader saved.
//!
//! The key is `<election name>.saved-state`: beside the election's keys,
//! not under `<election name>/`, where etcd's election counts every key as
//! a candidate (one without a lease would hold the election for ever).

use std::{fmt, time::Duration};

use tokio::time::timeout;

use super::connection::EtcdConnection;
use super::etcd::{
    etcdserverpb::{
        Compare, PutRequest, RangeRequest, RequestOp, TxnRequest,
        compare::{CompareResult, CompareTarget, TargetUnion},
        kv_client::KvClient,
        request_op::Request,
    },
    v3electionpb::LeaderKey,
};

/// Each read or write of the saved state.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Who holds the state an instance restores when it starts to lead.
pub trait SavedStateKeeper: Send + Sync + fmt::Debug {
    /// Replaces what this instance holds with `saved` (None: nothing was
    /// saved yet). An error keeps this instance from leading.
    fn restore_saved(&self, saved: Option<&[u8]>) -> Result<(), String>;
}

/// The etcd key of the saved state of election `election_name`.
pub fn key(election_name: &str) -> Vec<u8> {
    format!("{election_name}.saved-state").into_bytes()
}

/// What a leader writes with: its connection to etcd and its election key.
#[derive(Debug, Clone)]
pub(super) struct LeaderTerm {
    pub etcd: EtcdConnection,
    pub leader: LeaderKey,
    pub key: Vec<u8>,
}

/// The saved value, linearizable (a leader must see the last write of the
/// one before it); None if nothing was saved yet.
pub(super) async fn read(etcd: &EtcdConnection, key: Vec<u8>) -> Result<Option<Vec<u8>>, String> {
    let range = etcd.call(|service| {
        let request = RangeRequest {
            key: key.clone(),
            ..RangeRequest::default()
        };
        async move { KvClient::new(service).range(request).await }
    });
    let answer = timeout(CALL_TIMEOUT, range)
        .await
        .map_err(|_| "etcd did not answer the read of the saved state in time".to_owned())?
        .map_err(|status| format!("etcd refused the read of the saved state: {status}"))?;
    Ok(answer
        .into_inner()
        .kvs
        .into_iter()
        .next()
        .map(|kv| kv.value))
}

/// Writes `value` if `term`'s election key still exists as created.
pub(super) async fn write(term: LeaderTerm, value: Vec<u8>) -> Result<(), String> {
    let still_leading = Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: term.leader.key.clone(),
        target_union: Some(TargetUnion::CreateRevision(term.leader.rev)),
        ..Compare::default()
    };
    let put = RequestOp {
        request: Some(Request::RequestPut(PutRequest {
            key: term.key,
            value,
            lease: 0,
        })),
    };
    let txn = TxnRequest {
        compare: vec![still_leading],
        success: vec![put],
        failure: Vec::new(),
    };
    let write = term.etcd.call(|service| {
        let request = txn.clone();
        async move { KvClient::new(service).txn(request).await }
    });
    let answer = timeout(CALL_TIMEOUT, write)
        .await
        .map_err(|_| "etcd did not answer the write in time".to_owned())?
        .map_err(|status| format!("etcd refused the write: {status}"))?;
    if answer.into_inner().succeeded {
        Ok(())
    } else {
        Err("this instance no longer leads the election".to_owned())
    }
}
