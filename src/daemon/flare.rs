//! The binary protocol (`flare://`) as a daemon connection's [`Framing`]:
//! frames starting `CPRF` with a proto2 `RpcMeta` ([`frame`]: the bytes),
//! answers matched by correlation id. A compressed request is inflated here
//! (bounded by the frame limit); an answer says how the call core
//! compressed it ([`rpc::compression`]).

pub mod frame;

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use tokio::time::Instant;

use self::frame::{FrameHeader, HEADER_LEN, RequestMeta};
use super::{
    After, Framing, Incoming, Request,
    conn::{QueuedAnswer, Reader},
};
use crate::{
    edge::{self, Reservation},
    pb::{Encoding, Method, SCHEDULER_SERVICE, Service},
    protocol::Protocol,
    rpc::{
        self,
        compression::{Accepted, Algorithm, InflateError},
        error::{ApiError, ErrorKind},
        state::AppState,
    },
    service,
};

/// The binary protocol's framing of one connection.
#[derive(Debug, Default)]
pub struct Flare;

impl Framing for Flare {
    /// The correlation id the answer echoes.
    type Reply = u64;

    async fn read_request(
        &mut self,
        reader: &mut Reader,
        state: &AppState,
        peer: SocketAddr,
    ) -> Result<Incoming<u64>, String> {
        let Some(Frame {
            meta,
            payload,
            framing,
            mut budget,
        }) = read_frame(reader, state).await?
        else {
            return Ok(Incoming::Dropped);
        };
        let (method, body) = match method_of(&meta)
            .and_then(|method| Ok((method, inflate(&meta, payload, framing, &mut budget)?)))
        {
            Ok((method, body)) => (Ok(method), body),
            Err(error) => (Err(error), Bytes::new()),
        };
        Ok(Incoming::Call(Request {
            call: call_of(peer, &meta),
            method,
            body,
            budget: Some(budget),
            reply: meta.correlation_id,
            then: After::ReadOn,
        }))
    }

    fn answer(id: u64, outcome: Result<rpc::EncodedAnswer, ApiError>) -> QueuedAnswer {
        answer(id, outcome)
    }
}

/// One request frame, read and checked.
struct Frame {
    meta: RequestMeta,
    payload: Bytes,
    /// Bytes of the meta and attachment: what the frame holds besides the
    /// payload.
    framing: usize,
    /// The frame's share of the global budget for large bodies.
    budget: Reservation,
}

/// Reads one frame: its header and meta within the header-read timeout, the
/// rest within the body-read timeout. Any error closes the connection: after
/// a bad header the stream cannot be resynchronised. A frame without
/// `request_meta` is read and dropped (None), the connection kept, as the
/// original's server drops it ("Corrupted message: Request or response meta
/// is not present").
async fn read_frame(reader: &mut Reader, state: &AppState) -> Result<Option<Frame>, String> {
    let edge = &state.settings.edge;
    // Set when the first wait starts: a heartbeat usually arrives whole with
    // the read that woke the connection, and then no timer is armed at all.
    let mut head_deadline = None;
    let mut head_deadline =
        || *head_deadline.get_or_insert_with(|| Instant::now() + edge.header_read_timeout);
    fill_by(reader, HEADER_LEN, &mut head_deadline, "header").await?;
    let header_bytes: [u8; HEADER_LEN] = reader.buf[..HEADER_LEN]
        .try_into()
        .map_err(|_| "short header".to_owned())?;
    let header = FrameHeader::parse(&header_bytes).map_err(|error| error.to_string())?;
    let budget = reader
        .budget
        .reserve(header.body_len())
        .ok_or_else(|| "the budget for buffered bodies is exhausted".to_owned())?;
    let meta_end = HEADER_LEN + header.meta_size;
    fill_by(reader, meta_end, &mut head_deadline, "meta").await?;
    let frame_end = meta_end + header.msg_size + header.att_size;
    fill_by(
        reader,
        frame_end,
        &mut || Instant::now() + edge.body_read_timeout,
        "payload",
    )
    .await?;
    let frame = reader.buf.split_to(frame_end).freeze();
    let meta = frame::decode_request_meta(frame.slice(HEADER_LEN..meta_end))
        .map_err(|error| format!("unparsable meta: {error}"))?;
    if !meta.is_request {
        tracing::debug!(
            target: super::LOG,
            correlation_id = meta.correlation_id,
            "dropped a frame without request meta"
        );
        return Ok(None);
    }
    // The attachment (after the payload) is consumed and dropped: no scheduler
    // call carries one.
    let payload = frame.slice(meta_end..meta_end + header.msg_size);
    Ok(Some(Frame {
        meta,
        payload,
        framing: header.meta_size + header.att_size,
        budget,
    }))
}

/// The request message of a frame: its payload, inflated if the meta says
/// it is compressed. The inflated message counts against the frame limit
/// (with the meta and attachment, as an uncompressed frame would) and
/// against the budget for buffered bodies; beyond either it is refused
/// with the answer an uncompressed frame that large would get, or
/// "overloaded".
fn inflate(
    meta: &RequestMeta,
    payload: Bytes,
    framing: usize,
    budget: &mut Reservation,
) -> Result<Bytes, ApiError> {
    let algorithm = match Algorithm::from_wire(meta.compression_algorithm) {
        Ok(None) => return Ok(payload),
        Ok(Some(algorithm)) => algorithm,
        Err(value) => {
            return Err(ApiError::new(
                ErrorKind::CompressionNotSupported,
                format!("compression algorithm {value} is not one the framework defines"),
            ));
        }
    };
    let limit = frame::MAX_FRAME_BODY.saturating_sub(framing);
    let inflated = algorithm
        .inflate(&payload, limit)
        .map_err(|error| match error {
            InflateError::TooLarge { .. } => ApiError::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "{error}: a frame of {} bytes inflated",
                    frame::MAX_FRAME_BODY
                ),
            ),
            InflateError::Corrupt { .. } => ApiError::malformed(error.to_string()),
        })?;
    if !budget.grow_to(framing + inflated.len()) {
        return Err(rpc::budget_exhausted());
    }
    Ok(Bytes::from(inflated))
}

/// Reads until `len` bytes are buffered, by the deadline `deadline` gives
/// when a wait is needed.
async fn fill_by(
    reader: &mut Reader,
    len: usize,
    deadline: &mut impl FnMut() -> Instant,
    what: &str,
) -> Result<(), String> {
    if reader.buf.len() >= len {
        return Ok(());
    }
    match tokio::time::timeout_at(deadline(), reader.fill_to(len)).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(format!("closed in the middle of a frame's {what}")),
        Ok(Err(error)) => Err(format!("read failed: {error}")),
        Err(_) => Err(format!("the frame's {what} did not arrive in time")),
    }
}

/// What the transport knows about a call: the meta's `timeout` is its
/// deadline, its `acceptable_compression_algorithms` what the answer may be
/// compressed with.
fn call_of(peer: SocketAddr, meta: &RequestMeta) -> rpc::Call {
    let timeout = meta.timeout.filter(|&ms| ms > 0);
    let mut call = rpc::Call::new(
        Protocol::Flare,
        Encoding::Binary,
        peer.ip().to_canonical(),
        timeout.map(|ms| Duration::from_millis(u64::from(ms))),
        Instant::now(),
    );
    call.accepts = Accepted::from_bits(meta.acceptable_compression_algorithms.unwrap_or(0));
    call
}

/// The method a request names, or the framework's error for it.
fn method_of(meta: &RequestMeta) -> Result<Method, ApiError> {
    // Every daemon call names the scheduler's service: match its bytes
    // first, and spell the name out only for an error. The operators'
    // service is not served on the daemons' binary protocol (it carries no
    // `Authorization`): its methods are unknown here, as any other's.
    let known = meta
        .method_name()
        .strip_prefix(SCHEDULER_SERVICE.as_bytes())
        .and_then(|rest| rest.strip_prefix(b"."))
        .and_then(|method| {
            Service::Scheduler
                .methods()
                .iter()
                .copied()
                .find(|known| known.name().as_bytes() == method)
        });
    known.ok_or_else(|| unknown_method(&edge::echo_bytes(meta.method_name())))
}

/// The framework's error for a method name this server does not implement:
/// its server looks the whole name up, so another service's method is an
/// unknown method too (10), with its words.
fn unknown_method(name: &str) -> ApiError {
    ApiError::new(
        ErrorKind::MethodNotFound,
        format!("Method [{name}] is not implemented."),
    )
}

/// The answer frame of call `id`: its head, and the payload as it is.
fn answer(id: u64, outcome: Result<rpc::EncodedAnswer, ApiError>) -> QueuedAnswer {
    match outcome {
        Ok(answer) => QueuedAnswer::new(
            frame::response_head(id, Ok(answer.payload.len()), answer.compression),
            answer.payload,
        ),
        Err(error) => {
            // Scheduler outcomes carry the original's description, mostly none.
            let description = match error.kind {
                ErrorKind::Scheduler(status) => service::original_description(status).unwrap_or(""),
                _ => error.message.as_str(),
            };
            let status = error.kind.wire().rpc_code as i32;
            QueuedAnswer::new(
                frame::response_head(id, Err((status, description)), None),
                Bytes::new(),
            )
        }
    }
}
