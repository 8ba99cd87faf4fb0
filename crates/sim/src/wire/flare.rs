//! `flare://`: frames of a 16-byte header (`CPRF`, then meta, payload and
//! attachment sizes, little-endian), a proto2 `flare.rpc.RpcMeta`, the payload
//! and the attachment. Answers are matched by correlation id.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use super::{Compression, Outcome, StreamAnswer, StreamError};
use yadcc_pb::{
    Method,
    flare::rpc::{MethodType, RpcMeta, RpcRequestMeta},
};

/// The 4 bytes every flare frame starts with.
pub const FLARE_MAGIC: [u8; 4] = *b"CPRF";
/// Bytes of the fixed frame header.
pub const FLARE_HEADER_BYTES: usize = 16;
/// Largest answer a stock daemon takes (header included): yadcc's daemon
/// raises the framework's packet limits to 512 MiB (`entry.cc`), so a large
/// cluster's whole `GetRunningTasks` list reaches it. Also the most an
/// answer may inflate to.
pub const FLARE_MAX_FRAME_BYTES: usize = 512 << 20;
/// `acceptable_compression_algorithms` as stock daemons send it: bits 1..5
/// (none, gzip, lz4, snappy, zstd).
pub const DAEMON_ACCEPTABLE_COMPRESSION: u64 = 62;

/// The request meta a stock daemon sends with call `correlation_id` of
/// `method_name` (`yadcc.scheduler.SchedulerService.Heartbeat`).
pub fn daemon_request_meta(correlation_id: u64, method_name: String, timeout: Duration) -> RpcMeta {
    request_meta_accepting(
        correlation_id,
        method_name,
        timeout,
        DAEMON_ACCEPTABLE_COMPRESSION,
    )
}

/// A daemon's request meta announcing `acceptable` compressions (bits of
/// [`Compression::bit`]) for the answer.
pub fn request_meta_accepting(
    correlation_id: u64,
    method_name: String,
    timeout: Duration,
    acceptable: u64,
) -> RpcMeta {
    RpcMeta {
        correlation_id,
        request_meta: Some(RpcRequestMeta {
            method_name,
            request_id: None,
            timeout: Some(u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX)),
            tracing_context: None,
            acceptable_compression_algorithms: Some(acceptable),
        }),
        response_meta: None,
        method_type: MethodType::Single as i32,
        flags: None,
        compression_algorithm: None,
        attachment_compressed: None,
    }
}

/// Appends a flare request frame as a stock daemon writes it.
pub fn encode_flare_request(
    out: &mut BytesMut,
    correlation_id: u64,
    rpc: Method,
    timeout: Duration,
    payload: &[u8],
) {
    let meta = daemon_request_meta(correlation_id, rpc.full_name().to_owned(), timeout);
    encode_flare_frame(out, &meta, payload, &[]);
}

/// A daemon's request frames, with the meta encoded once per method: a call
/// writes the header, its correlation id and the method's constant rest of
/// the meta (name, the daemon's timeout, accepted compressions, method type),
/// byte for byte what [`encode_flare_request`] writes.
#[derive(Debug, Clone)]
pub struct FlareRequests {
    /// By method (`Method as usize`): the meta after its correlation id.
    meta_tails: Vec<Vec<u8>>,
}

impl FlareRequests {
    /// Requests announcing `acceptable` answer compressions
    /// ([`DAEMON_ACCEPTABLE_COMPRESSION`] for a stock daemon).
    pub fn new(acceptable: u64) -> FlareRequests {
        let meta_tails = Method::ALL
            .iter()
            .map(|&rpc| {
                let meta = request_meta_accepting(
                    0,
                    rpc.full_name().to_owned(),
                    super::client_timeout(rpc),
                    acceptable,
                );
                // The required correlation id comes first: key 0x08, value 0.
                let whole = meta.encode_to_vec();
                whole[2..].to_vec()
            })
            .collect();
        FlareRequests { meta_tails }
    }

    /// Appends call `correlation_id` of `rpc` carrying `payload`.
    pub fn encode(&self, out: &mut BytesMut, correlation_id: u64, rpc: Method, payload: &[u8]) {
        let tail = &self.meta_tails[rpc as usize];
        let meta_len = 1 + prost::encoding::encoded_len_varint(correlation_id) + tail.len();
        out.reserve(FLARE_HEADER_BYTES + meta_len + payload.len());
        out.put_slice(&FLARE_MAGIC);
        out.put_u32_le(meta_len as u32);
        out.put_u32_le(payload.len() as u32);
        out.put_u32_le(0);
        out.put_u8(0x08);
        prost::encoding::encode_varint(correlation_id, out);
        out.put_slice(tail);
        out.put_slice(payload);
    }
}

/// Appends one frame of any meta: the header, the meta, payload and attachment.
pub fn encode_flare_frame(out: &mut BytesMut, meta: &RpcMeta, payload: &[u8], attachment: &[u8]) {
    let meta_len = meta.encoded_len();
    out.reserve(FLARE_HEADER_BYTES + meta_len + payload.len() + attachment.len());
    out.put_slice(&FLARE_MAGIC);
    out.put_u32_le(meta_len as u32);
    out.put_u32_le(payload.len() as u32);
    out.put_u32_le(attachment.len() as u32);
    // Encoding into a buffer with reserved room cannot fail.
    let _ = meta.encode(out);
    out.put_slice(payload);
    out.put_slice(attachment);
}

/// One answer frame, whole: what a test inspects byte for byte.
#[derive(Debug, Clone, PartialEq)]
pub struct FlareResponse {
    /// The frame as it came off the wire, header to attachment.
    pub frame: Bytes,
    pub meta: RpcMeta,
    /// The message as it came, compressed if `compression` says so.
    pub payload: Bytes,
    /// How `payload` is compressed (the meta's `compression_algorithm`).
    pub compression: Compression,
}

impl FlareResponse {
    /// `RpcResponseMeta.status`: 0 on success.
    pub fn status(&self) -> i32 {
        self.meta
            .response_meta
            .as_ref()
            .map_or(0, |meta| meta.status)
    }

    pub fn description(&self) -> &str {
        self.meta
            .response_meta
            .as_ref()
            .and_then(|meta| meta.description.as_deref())
            .unwrap_or("")
    }

    /// The message, inflated if it came compressed.
    pub fn message(&self) -> Result<Bytes, StreamError> {
        self.compression
            .inflate_message(&self.payload)
            .map_err(StreamError::BadPayload)
    }

    /// What the answer says, as the simulated daemons read it: the message
    /// inflated.
    pub fn answer(self) -> Result<StreamAnswer, StreamError> {
        let status = self.status();
        let outcome = if status == 0 {
            Outcome::Ok(self.message()?)
        } else {
            Outcome::Failed {
                code: status,
                description: self.description().to_owned(),
            }
        };
        Ok(StreamAnswer {
            id: Some(self.meta.correlation_id),
            outcome,
            close: false,
        })
    }
}

/// Takes one flare answer off the front of `buffer`, if a whole frame is
/// there. The attachment, which no scheduler call carries, is consumed.
pub fn decode_flare_answer(buffer: &mut BytesMut) -> Result<Option<StreamAnswer>, StreamError> {
    decode_flare_response(buffer)?
        .map(FlareResponse::answer)
        .transpose()
}

/// Takes one flare answer frame off the front of `buffer`, if it is all there,
/// and checks that it is an answer to a unary call a daemon can use.
pub fn decode_flare_response(buffer: &mut BytesMut) -> Result<Option<FlareResponse>, StreamError> {
    if buffer.len() < FLARE_HEADER_BYTES {
        // A wrong first byte is wrong already; do not wait for 16 of them.
        let seen = buffer.len().min(4);
        if buffer[..seen] != FLARE_MAGIC[..seen] {
            let mut magic = [0; 4];
            magic[..seen].copy_from_slice(&buffer[..seen]);
            return Err(StreamError::BadMagic(magic));
        }
        return Ok(None);
    }
    let word = |at: usize| {
        u32::from_le_bytes([buffer[at], buffer[at + 1], buffer[at + 2], buffer[at + 3]]) as usize
    };
    if buffer[..4] != FLARE_MAGIC {
        return Err(StreamError::BadMagic([
            buffer[0], buffer[1], buffer[2], buffer[3],
        ]));
    }
    let (meta_len, msg_len, att_len) = (word(4), word(8), word(12));
    let frame_len = FLARE_HEADER_BYTES + meta_len + msg_len + att_len;
    if frame_len > FLARE_MAX_FRAME_BYTES {
        return Err(StreamError::TooLarge(frame_len));
    }
    if buffer.len() < frame_len {
        buffer.reserve(frame_len - buffer.len());
        return Ok(None);
    }
    let frame = buffer.split_to(frame_len).freeze();
    let meta_end = FLARE_HEADER_BYTES + meta_len;
    let meta = RpcMeta::decode(&frame[FLARE_HEADER_BYTES..meta_end])
        .map_err(|error| StreamError::BadMeta(error.to_string()))?;
    if meta.method_type != MethodType::Single as i32 {
        return Err(StreamError::BadMeta(format!(
            "method_type {} in an answer to a unary call",
            meta.method_type
        )));
    }
    if meta.response_meta.is_none() {
        return Err(StreamError::BadMeta("no response_meta".to_owned()));
    }
    // Stock daemons accept every algorithm the framework has and inflate the
    // answer (flare-wire.md); 0 or an unknown value is none of them.
    let compression = Compression::from_meta(meta.compression_algorithm).ok_or_else(|| {
        StreamError::BadMeta(format!(
            "compression_algorithm {:?}",
            meta.compression_algorithm
        ))
    })?;
    let payload = frame.slice(meta_end..meta_end + msg_len);
    Ok(Some(FlareResponse {
        frame,
        meta,
        payload,
        compression,
    }))
}
