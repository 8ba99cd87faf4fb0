//! JSON for a machine that speaks it: the simulated roles build every request
//! in the binary encoding and read every answer in it, whatever the
//! protocol, so a JSON endpoint converts both ways through the generated
//! types (pbjson's proto3 JSON mapping).

use bytes::Bytes;
use prost::Message;
use serde::{Serialize, de::DeserializeOwned};

use super::CallError;
use yadcc_pb::{self as pb, Method};

fn decode_error(error: impl std::fmt::Display) -> CallError {
    CallError::Decode(error.to_string())
}

fn to_json<M: Message + Default + Serialize>(binary: &[u8]) -> Result<Vec<u8>, CallError> {
    let message = M::decode(binary).map_err(decode_error)?;
    serde_json::to_vec(&message).map_err(decode_error)
}

fn to_binary<M: Message + DeserializeOwned>(json: &[u8]) -> Result<Bytes, CallError> {
    let message: M = serde_json::from_slice(json).map_err(decode_error)?;
    Ok(Bytes::from(message.encode_to_vec()))
}

/// The JSON body of a call of `rpc` whose request is `binary`.
pub fn request(rpc: Method, binary: &[u8]) -> Result<Vec<u8>, CallError> {
    match rpc {
        Method::Heartbeat => to_json::<pb::HeartbeatRequest>(binary),
        Method::GetConfig => to_json::<pb::GetConfigRequest>(binary),
        Method::WaitForStartingTask => to_json::<pb::WaitForStartingTaskRequest>(binary),
        Method::KeepTaskAlive => to_json::<pb::KeepTaskAliveRequest>(binary),
        Method::FreeTask => to_json::<pb::FreeTaskRequest>(binary),
        Method::GetRunningTasks => to_json::<pb::GetRunningTasksRequest>(binary),
        Method::CordonServant => to_json::<pb::CordonServantRequest>(binary),
        Method::UncordonServant => to_json::<pb::UncordonServantRequest>(binary),
        Method::DrainServant => to_json::<pb::DrainServantRequest>(binary),
        Method::ListServantStates => to_json::<pb::ListServantStatesRequest>(binary),
        Method::ListAuditEvents => to_json::<pb::ListAuditEventsRequest>(binary),
    }
}

/// The binary encoding of `rpc`'s JSON answer.
pub fn answer(rpc: Method, json: &[u8]) -> Result<Bytes, CallError> {
    match rpc {
        Method::Heartbeat => to_binary::<pb::HeartbeatResponse>(json),
        Method::GetConfig => to_binary::<pb::GetConfigResponse>(json),
        Method::WaitForStartingTask => to_binary::<pb::WaitForStartingTaskResponse>(json),
        Method::KeepTaskAlive => to_binary::<pb::KeepTaskAliveResponse>(json),
        Method::FreeTask => to_binary::<pb::FreeTaskResponse>(json),
        Method::GetRunningTasks => to_binary::<pb::GetRunningTasksResponse>(json),
        Method::CordonServant => to_binary::<pb::CordonServantResponse>(json),
        Method::UncordonServant => to_binary::<pb::UncordonServantResponse>(json),
        Method::DrainServant => to_binary::<pb::DrainServantResponse>(json),
        Method::ListServantStates => to_binary::<pb::ListServantStatesResponse>(json),
        Method::ListAuditEvents => to_binary::<pb::ListAuditEventsResponse>(json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_convert_both_ways() {
        let renew = pb::KeepTaskAliveRequest {
            token: "t".into(),
            task_grant_ids: vec![1, u64::MAX],
            next_keep_alive_in_ms: 10_000,
        };
        let json = request(Method::KeepTaskAlive, &renew.encode_to_vec()).unwrap();
        let text = String::from_utf8(json).unwrap();
        assert!(text.contains("\"18446744073709551615\""), "{text}");
        let reply = answer(Method::KeepTaskAlive, br#"{"statuses":[true,false]}"#).unwrap();
        let reply = pb::KeepTaskAliveResponse::decode(reply).unwrap();
        assert_eq!(reply.statuses, [true, false]);
        assert!(matches!(
            answer(Method::FreeTask, b"not json"),
            Err(CallError::Decode(_))
        ));
    }
}
