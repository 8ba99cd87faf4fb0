//! The client side of the wire protocols a stock yadcc daemon speaks to its
//! scheduler (`flare-wire.md`), plus plain-HTTP JSON as scripts send it.
//! Depends on the generated protobuf types only, never on the server's
//! modules, so the simulator checks the server from the outside.
//!
//! - `flare://`: frames of a 16-byte header (`CPRF`, then meta, payload and
//!   attachment sizes, little-endian), a proto2 `flare.rpc.RpcMeta`, the
//!   payload and the attachment. Answers are matched by correlation id.
//! - `http+pb`: `POST /rpc/yadcc.scheduler.SchedulerService.<Method>` with
//!   `Rpc-SeqNo`, `Rpc-Timeout`, `Content-Type: application/x-protobuf` and
//!   `Content-Length`, nothing else (no `Host`). Answers are matched by the
//!   echoed `Rpc-SeqNo`.
//! - `json`: the same path with `Host` and `Content-Type: application/json`,
//!   one call at a time per connection, as curl or a script does.

use std::{fmt, str::FromStr, time::Duration};

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use crate::pb::{
    Method,
    flare::rpc::{CompressionAlgorithm, MethodType, RpcMeta, RpcRequestMeta},
};

/// The stock daemon's client timeout for a call of `rpc`; it is also sent as
/// the call's deadline (`timeout` in the request meta, `Rpc-Timeout`).
pub fn client_timeout(rpc: Method) -> Duration {
    Duration::from_secs(match rpc {
        Method::Heartbeat | Method::GetRunningTasks | Method::GetConfig => 2,
        Method::KeepTaskAlive | Method::FreeTask => 5,
        // The server may hold it `milliseconds_to_wait` (5 s).
        Method::WaitForStartingTask => 10,
    })
}

/// How a simulated machine talks to the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Protocol {
    /// The daemons' default (`--scheduler_uri=flare://HOST:8336`).
    #[default]
    Flare,
    /// `--scheduler_uri=http+pb://HOST:8336`.
    HttpPb,
    /// Proto3 JSON over plain HTTP/1.1, one call at a time per connection.
    Json,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Flare, Protocol::HttpPb, Protocol::Json];

    pub fn label(self) -> &'static str {
        match self {
            Protocol::Flare => "flare",
            Protocol::HttpPb => "http+pb",
            Protocol::Json => "json",
        }
    }

    /// True if answers are matched by id, so many calls share a connection.
    pub fn multiplexed(self) -> bool {
        !matches!(self, Protocol::Json)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(text: &str) -> Result<Protocol, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "flare" => Ok(Protocol::Flare),
            "http+pb" | "httppb" | "http-pb" => Ok(Protocol::HttpPb),
            "json" => Ok(Protocol::Json),
            other => Err(format!(
                "unknown protocol {other:?}; use flare, http+pb or json"
            )),
        }
    }
}

/// The 4 bytes every flare frame starts with.
pub const FLARE_MAGIC: [u8; 4] = *b"CPRF";
/// Bytes of the fixed frame header.
pub const FLARE_HEADER_BYTES: usize = 16;
/// Largest frame the framework accepts (header included).
pub const FLARE_MAX_FRAME_BYTES: usize = 4 << 20;
/// `acceptable_compression_algorithms` as stock daemons send it: bits 1..5
/// (none, gzip, lz4, snappy, zstd).
pub const DAEMON_ACCEPTABLE_COMPRESSION: u64 = 62;

/// Why bytes from the server are not a usable answer. Each closes the
/// connection: the stream can no longer be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// A flare frame not starting with `CPRF`.
    BadMagic([u8; 4]),
    /// Meta + payload + attachment over the 4 MiB limit.
    TooLarge(usize),
    /// The meta did not decode, or lacks what an answer must carry.
    BadMeta(String),
    /// Not an HTTP/1.1 answer this client can use.
    BadHttp(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadMagic(magic) => write!(f, "bad frame magic {magic:02x?}"),
            WireError::TooLarge(size) => write!(
                f,
                "frame of {size} bytes over the {FLARE_MAX_FRAME_BYTES}-byte limit"
            ),
            WireError::BadMeta(why) => write!(f, "bad RpcMeta: {why}"),
            WireError::BadHttp(why) => write!(f, "bad HTTP answer: {why}"),
        }
    }
}

impl std::error::Error for WireError {}

/// What an answer says, in either protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success: the encoded response message.
    Ok(Bytes),
    /// A non-zero framework or yadcc status (`RpcResponseMeta.status`,
    /// `Rpc-Error-Code`), with its description if any.
    Failed { code: i32, description: String },
    /// An HTTP error status without `Rpc-Error-Code` (a daemon closes the
    /// connection on it).
    Http { status: u16 },
}

/// One answer taken off the stream: the id it answers (correlation id,
/// `Rpc-SeqNo`; `None` if the HTTP answer carried none) and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: Option<u64>,
    pub outcome: Outcome,
    /// The server asked to close the connection after this answer.
    pub close: bool,
}

/// Appends a flare request frame as a stock daemon writes it.
pub fn encode_flare_request(
    out: &mut BytesMut,
    correlation_id: u64,
    rpc: Method,
    timeout: Duration,
    payload: &[u8],
) {
    let meta = RpcMeta {
        correlation_id,
        request_meta: Some(RpcRequestMeta {
            method_name: rpc.full_name().to_owned(),
            request_id: None,
            timeout: Some(u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX)),
            tracing_context: None,
            acceptable_compression_algorithms: Some(DAEMON_ACCEPTABLE_COMPRESSION),
        }),
        response_meta: None,
        method_type: MethodType::Single as i32,
        flags: None,
        compression_algorithm: None,
        attachment_compressed: None,
    };
    let meta_len = meta.encoded_len();
    out.reserve(FLARE_HEADER_BYTES + meta_len + payload.len());
    out.put_slice(&FLARE_MAGIC);
    out.put_u32_le(meta_len as u32);
    out.put_u32_le(payload.len() as u32);
    out.put_u32_le(0);
    // Encoding into a buffer with reserved room cannot fail.
    let _ = meta.encode(out);
    out.put_slice(payload);
}

/// Takes one flare answer off the front of `buffer`, if a whole frame is
/// there. The attachment, which no scheduler call carries, is consumed.
pub fn decode_flare_answer(buffer: &mut BytesMut) -> Result<Option<Answer>, WireError> {
    if buffer.len() < FLARE_HEADER_BYTES {
        // A wrong first byte is wrong already; do not wait for 16 of them.
        let seen = buffer.len().min(4);
        if buffer[..seen] != FLARE_MAGIC[..seen] {
            let mut magic = [0; 4];
            magic[..seen].copy_from_slice(&buffer[..seen]);
            return Err(WireError::BadMagic(magic));
        }
        return Ok(None);
    }
    let word = |at: usize| {
        u32::from_le_bytes([buffer[at], buffer[at + 1], buffer[at + 2], buffer[at + 3]]) as usize
    };
    if buffer[..4] != FLARE_MAGIC {
        return Err(WireError::BadMagic([
            buffer[0], buffer[1], buffer[2], buffer[3],
        ]));
    }
    let (meta_len, msg_len, att_len) = (word(4), word(8), word(12));
    let frame_len = FLARE_HEADER_BYTES + meta_len + msg_len + att_len;
    if frame_len > FLARE_MAX_FRAME_BYTES {
        return Err(WireError::TooLarge(frame_len));
    }
    if buffer.len() < frame_len {
        buffer.reserve(frame_len - buffer.len());
        return Ok(None);
    }
    let frame = buffer.split_to(frame_len).freeze();
    let meta_end = FLARE_HEADER_BYTES + meta_len;
    let meta = RpcMeta::decode(&frame[FLARE_HEADER_BYTES..meta_end])
        .map_err(|error| WireError::BadMeta(error.to_string()))?;
    if meta.method_type != MethodType::Single as i32 {
        return Err(WireError::BadMeta(format!(
            "method_type {} in an answer to a unary call",
            meta.method_type
        )));
    }
    let Some(response) = meta.response_meta else {
        return Err(WireError::BadMeta("no response_meta".to_owned()));
    };
    if let Some(algorithm) = meta.compression_algorithm
        && algorithm != CompressionAlgorithm::None as i32
    {
        // The daemons ask for none of their answers to be compressed
        // in practice; a scheduler must not (flare-wire.md).
        return Err(WireError::BadMeta(format!(
            "compressed answer (algorithm {algorithm})"
        )));
    }
    let outcome = if response.status == 0 {
        Outcome::Ok(frame.slice(meta_end..meta_end + msg_len))
    } else {
        Outcome::Failed {
            code: response.status,
            description: response.description.unwrap_or_default(),
        }
    };
    Ok(Some(Answer {
        id: Some(meta.correlation_id),
        outcome,
        close: false,
    }))
}

/// Appends an `http+pb` request exactly as a stock daemon writes it.
pub fn encode_http_pb_request(
    out: &mut BytesMut,
    seq_no: u64,
    rpc: Method,
    timeout: Duration,
    payload: &[u8],
) {
    encode_http_request(
        out,
        rpc.rpc_path(),
        &[
            ("Rpc-SeqNo", seq_no.to_string()),
            ("Rpc-Timeout", timeout.as_millis().to_string()),
            ("Content-Type", "application/x-protobuf".to_owned()),
        ],
        payload,
    );
}

/// Appends a JSON request as a plain HTTP client (curl) writes it.
pub fn encode_json_request(out: &mut BytesMut, host: &str, rpc: Method, body: &[u8]) {
    encode_http_request(
        out,
        rpc.rpc_path(),
        &[
            ("Host", host.to_owned()),
            ("Content-Type", "application/json".to_owned()),
        ],
        body,
    );
}

/// Appends `POST path HTTP/1.1`, the headers, `Content-Length` and the body.
pub fn encode_http_request(
    out: &mut BytesMut,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) {
    use std::fmt::Write as _;
    let mut head = String::with_capacity(128);
    // Writing into a String cannot fail.
    let _ = write!(head, "POST {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    let _ = write!(head, "Content-Length: {}\r\n\r\n", body.len());
    out.reserve(head.len() + body.len());
    out.put_slice(head.as_bytes());
    out.put_slice(body);
}

/// Headers an answer head may have; more is not an answer to a daemon.
const MAX_ANSWER_HEADERS: usize = 32;
/// Largest answer head this client accepts.
const MAX_ANSWER_HEAD_BYTES: usize = 16 << 10;

/// Takes one HTTP/1.1 answer off the front of `buffer`, if it is all there.
/// Daemons need `Content-Length` on every answer (a chunked one is taken as
/// a stream and breaks the call), so one without it is an error.
pub fn decode_http_answer(buffer: &mut BytesMut) -> Result<Option<Answer>, WireError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_ANSWER_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buffer) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buffer.len() > MAX_ANSWER_HEAD_BYTES => {
            return Err(WireError::BadHttp("answer head too large".to_owned()));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(WireError::BadHttp(error.to_string())),
    };
    let status = response.code.unwrap_or(0);
    let mut length = None;
    let mut id = None;
    let mut code = None;
    let mut reason = String::new();
    let mut close = response.version == Some(0);
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value)
            .map_err(|_| WireError::BadHttp(format!("header {} is not text", header.name)))?
            .trim();
        let number = |what: &str| {
            value
                .parse::<u64>()
                .map_err(|_| WireError::BadHttp(format!("{what}: {value:?}")))
        };
        let name = header.name;
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(number("Content-Length")? as usize);
        } else if name.eq_ignore_ascii_case("rpc-seqno") {
            id = Some(number("Rpc-SeqNo")?);
        } else if name.eq_ignore_ascii_case("rpc-error-code") {
            code = Some(
                value
                    .parse::<i32>()
                    .map_err(|_| WireError::BadHttp(format!("Rpc-Error-Code: {value:?}")))?,
            );
        } else if name.eq_ignore_ascii_case("rpc-error-reason") {
            value.clone_into(&mut reason);
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(WireError::BadHttp(format!(
                "Transfer-Encoding: {value} on a unary answer"
            )));
        }
    }
    let length =
        length.ok_or_else(|| WireError::BadHttp("answer without Content-Length".to_owned()))?;
    if head_len + length > FLARE_MAX_FRAME_BYTES {
        return Err(WireError::TooLarge(head_len + length));
    }
    if buffer.len() < head_len + length {
        buffer.reserve(head_len + length - buffer.len());
        return Ok(None);
    }
    let answer = buffer.split_to(head_len + length).freeze();
    let outcome = match (status, code) {
        (200, None | Some(0)) => Outcome::Ok(answer.slice(head_len..)),
        (_, Some(code)) if code != 0 => Outcome::Failed {
            code,
            description: reason,
        },
        (status, _) => Outcome::Http { status },
    };
    Ok(Some(Answer { id, outcome, close }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    fn hex(text: &str) -> Vec<u8> {
        text.split_whitespace()
            .map(|byte| u8::from_str_radix(byte, 16).unwrap())
            .collect()
    }

    /// The Heartbeat of `flare-wire.md`, as this client writes it.
    #[test]
    fn heartbeat_request_matches_the_vector_byte_for_byte() {
        let expected = hex("
            43 50 52 46 37 00 00 00 49 00 00 00 00 00 00 00
            08 01 2a 31 12 2a 79 61 64 63 63 2e 73 63 68 65
            64 75 6c 65 72 2e 53 63 68 65 64 75 6c 65 72 53
            65 72 76 69 63 65 2e 48 65 61 72 74 62 65 61 74
            20 d0 0f 30 3e 38 01 0a 11 31 39 32 2e 31 36 38
            2e 31 2e 31 30 3a 38 33 33 35 18 04 20 02 32 12
            0a 10 30 31 32 33 34 35 36 37 38 39 61 62 63 64
            65 66 38 90 4e 50 08 58 14 6a 06 73 65 63 72 65
            74 70 02 78 80 80 80 80 40 80 01 80 80 80 80 20");
        let request = pb::HeartbeatRequest {
            token: "secret".into(),
            next_heartbeat_in_ms: 10_000,
            version: 20,
            location: "192.168.1.10:8335".into(),
            num_processors: 8,
            current_load: 2,
            servant_priority: pb::ServantPriority::User as i32,
            capacity: 4,
            total_memory_in_bytes: 16 << 30,
            memory_available_in_bytes: 8 << 30,
            env_descs: vec![pb::EnvironmentDesc {
                compiler_digest: "0123456789abcdef".into(),
            }],
            ..pb::HeartbeatRequest::default()
        };
        let mut out = BytesMut::new();
        encode_flare_request(
            &mut out,
            1,
            Method::Heartbeat,
            client_timeout(Method::Heartbeat),
            &request.encode_to_vec(),
        );
        assert_eq!(out.len(), 144);
        assert_eq!(&out[..], &expected[..]);
    }

    #[test]
    fn heartbeat_answer_vector_decodes() {
        let mut buffer = BytesMut::from(
            &hex("
            43 50 52 46 08 00 00 00 27 00 00 00 00 00 00 00
            08 01 32 02 08 00 38 01 0a 03 07 ac 02 12 20 30
            30 31 31 32 32 33 33 34 34 35 35 36 36 37 37 38
            38 39 39 61 61 62 62 63 63 64 64 65 65 66 66")[..],
        );
        let answer = decode_flare_answer(&mut buffer).unwrap().unwrap();
        assert!(buffer.is_empty());
        assert_eq!(answer.id, Some(1));
        let Outcome::Ok(payload) = answer.outcome else {
            panic!("{answer:?}");
        };
        let response = pb::HeartbeatResponse::decode(payload).unwrap();
        assert_eq!(response.expired_tasks, [7, 300]);
        assert_eq!(
            response.acceptable_tokens,
            ["00112233445566778899aabbccddeeff"]
        );
    }

    #[test]
    fn smallest_success_and_access_denied_vectors_decode() {
        let mut buffer = BytesMut::from(
            &hex("43 50 52 46 08 00 00 00 00 00 00 00 00 00 00 00 08 01 32 02 08 00 38 01")[..],
        );
        buffer.extend_from_slice(&hex(
            "43 50 52 46 0b 00 00 00 00 00 00 00 00 00 00 00 08 01 32 05 08 eb 07 12 00 38 01",
        ));
        let first = decode_flare_answer(&mut buffer).unwrap().unwrap();
        assert_eq!(first.outcome, Outcome::Ok(Bytes::new()));
        let second = decode_flare_answer(&mut buffer).unwrap().unwrap();
        assert_eq!(
            second.outcome,
            Outcome::Failed {
                code: pb::Status::AccessDenied as i32,
                description: String::new()
            }
        );
        assert!(buffer.is_empty());
        assert_eq!(decode_flare_answer(&mut buffer), Ok(None));
    }

    #[test]
    fn partial_frames_wait_and_bad_frames_fail() {
        let whole = hex("43 50 52 46 08 00 00 00 00 00 00 00 00 00 00 00 08 01 32 02 08 00 38 01");
        for cut in 0..whole.len() {
            let mut buffer = BytesMut::from(&whole[..cut]);
            assert_eq!(decode_flare_answer(&mut buffer), Ok(None), "cut at {cut}");
        }
        let mut http = BytesMut::from(&b"HTTP/1.1 400 Bad Request\r\n"[..]);
        assert!(matches!(
            decode_flare_answer(&mut http),
            Err(WireError::BadMagic(_))
        ));
        let mut huge = BytesMut::from(&FLARE_MAGIC[..]);
        huge.put_u32_le(8);
        huge.put_u32_le(4 << 20);
        huge.put_u32_le(0);
        assert!(matches!(
            decode_flare_answer(&mut huge),
            Err(WireError::TooLarge(_))
        ));
        // A request meta where a response meta must be.
        let mut request = BytesMut::new();
        encode_flare_request(
            &mut request,
            3,
            Method::FreeTask,
            Duration::from_secs(5),
            &[],
        );
        assert!(matches!(
            decode_flare_answer(&mut request),
            Err(WireError::BadMeta(_))
        ));
    }

    #[test]
    fn http_pb_requests_are_the_daemons() {
        let mut out = BytesMut::new();
        encode_http_pb_request(
            &mut out,
            7,
            Method::GetConfig,
            client_timeout(Method::GetConfig),
            b"\x0a\x01t",
        );
        assert_eq!(
            &out[..],
            b"POST /rpc/yadcc.scheduler.SchedulerService.GetConfig HTTP/1.1\r\n\
              Rpc-SeqNo: 7\r\nRpc-Timeout: 2000\r\nContent-Type: application/x-protobuf\r\n\
              Content-Length: 3\r\n\r\n\x0a\x01t"
        );
    }

    #[test]
    fn http_answers_are_matched_by_seq_no_and_errors_read() {
        let mut buffer = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nrpc-seqno: 9\r\ncontent-length: 2\r\n\r\nab\
               HTTP/1.1 429 Too Many Requests\r\nRpc-SeqNo: 4\r\nRpc-Error-Code: 1001\r\n\
               Rpc-Error-Reason: busy\r\nContent-Length: 0\r\n\r\n\
               HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n\
               HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"[..],
        );
        let first = decode_http_answer(&mut buffer).unwrap().unwrap();
        assert_eq!(first.id, Some(9));
        assert_eq!(first.outcome, Outcome::Ok(Bytes::from_static(b"ab")));
        let second = decode_http_answer(&mut buffer).unwrap().unwrap();
        assert_eq!(
            (second.id, second.outcome),
            (
                Some(4),
                Outcome::Failed {
                    code: 1001,
                    description: "busy".into()
                }
            )
        );
        let third = decode_http_answer(&mut buffer).unwrap().unwrap();
        assert_eq!(third.outcome, Outcome::Http { status: 502 });
        assert!(third.close);
        // The body is not all there yet.
        assert_eq!(decode_http_answer(&mut buffer), Ok(None));
        let mut chunked =
            BytesMut::from(&b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..]);
        assert!(decode_http_answer(&mut chunked).is_err());
    }

    #[test]
    fn protocols_parse_and_timeouts_are_the_daemons() {
        assert_eq!("flare".parse(), Ok(Protocol::Flare));
        assert_eq!("http+pb".parse(), Ok(Protocol::HttpPb));
        assert_eq!("JSON".parse(), Ok(Protocol::Json));
        assert!("grpc".parse::<Protocol>().is_err());
        assert_eq!(client_timeout(Method::Heartbeat), Duration::from_secs(2));
        assert_eq!(
            client_timeout(Method::WaitForStartingTask),
            Duration::from_secs(10)
        );
    }
}
