//! The binary protocol's frame: a 16-byte header (magic `CPRF`, then the
//! sizes of meta, payload and attachment, little-endian), the `RpcMeta`, the
//! payload and the attachment. Pure bytes in, bytes out; no I/O.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use crate::{
    pb::flare::rpc::{MethodType, RpcMeta},
    rpc::compression::Algorithm,
};

/// The first four bytes of every frame (and so of every connection).
pub const MAGIC: [u8; 4] = *b"CPRF";
/// Bytes before the meta.
pub const HEADER_LEN: usize = 16;
/// The limit on what the scheduler reads: meta + payload + attachment of a
/// request frame, the payload counted inflated when it is compressed. The
/// framework's default (`flare_rpc_server_max_packet_size`), which the
/// original scheduler keeps; a larger frame closes the connection, as there.
/// Answers have no such limit: stock daemons raise theirs to 512 MiB.
pub const MAX_FRAME_BODY: usize = 4 << 20;

/// The sizes a frame header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub meta_size: usize,
    pub msg_size: usize,
    pub att_size: usize,
}

/// Why a frame header is refused (the connection is then closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("bad magic {0:02x?}: not the framework's binary protocol")]
    BadMagic([u8; 4]),
    #[error("frame of {0} bytes is over the {MAX_FRAME_BODY}-byte limit")]
    TooLarge(u64),
}

impl FrameHeader {
    pub fn parse(header: &[u8; HEADER_LEN]) -> Result<FrameHeader, HeaderError> {
        let word = |at: usize| {
            u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
        };
        let magic = [header[0], header[1], header[2], header[3]];
        if magic != MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        let (meta, msg, att) = (word(4), word(8), word(12));
        let total = u64::from(meta) + u64::from(msg) + u64::from(att);
        if total > MAX_FRAME_BODY as u64 {
            return Err(HeaderError::TooLarge(total));
        }
        Ok(FrameHeader {
            meta_size: meta as usize,
            msg_size: msg as usize,
            att_size: att as usize,
        })
    }

    /// Bytes after the header.
    pub fn body_len(&self) -> usize {
        self.meta_size + self.msg_size + self.att_size
    }
}

/// What the server acts on in a request frame's [`RpcMeta`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta {
    pub correlation_id: u64,
    /// Whether `request_meta` was present: a request frame must carry one.
    pub is_request: bool,
    /// `request_meta.method_name`, a slice of the frame (checked UTF-8).
    method_name: Bytes,
    /// `request_meta.timeout`, in milliseconds.
    pub timeout: Option<u32>,
    /// `request_meta.acceptable_compression_algorithms`: bit `n` for
    /// algorithm number `n`.
    pub acceptable_compression_algorithms: Option<u64>,
    /// How the payload is compressed (the meta's `compression_algorithm`).
    pub compression_algorithm: Option<i32>,
}

impl RequestMeta {
    /// The method name's bytes (UTF-8, checked when decoded).
    pub fn method_name(&self) -> &[u8] {
        &self.method_name
    }
}

/// Why a request meta is refused (the connection is then closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error(transparent)]
    Wire(#[from] prost::DecodeError),
    #[error("field {0} has the wrong wire type")]
    WireType(u32),
    #[error("a length runs past the end of the meta")]
    Truncated,
    #[error("the method name is not UTF-8")]
    MethodNameNotUtf8,
}

/// Decodes a request's meta (the bytes after the frame header), reading the
/// fields the server acts on and skipping the others the way prost does.
/// Decoding the whole generated [`RpcMeta`] copied the method name into a
/// new `String` on every call; here it stays a slice of the frame. A test
/// holds the fields equal to prost's decoding.
pub fn decode_request_meta(meta: Bytes) -> Result<RequestMeta, MetaError> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    /// A length-delimited field's bytes, taken off `buf`.
    fn delimited<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], MetaError> {
        let len = decode_varint(buf)?;
        let bytes: &'a [u8] = buf;
        if len > bytes.len() as u64 {
            return Err(MetaError::Truncated);
        }
        let (field, rest) = bytes.split_at(len as usize);
        *buf = rest;
        Ok(field)
    }
    let mut decoded = RequestMeta::default();
    let mut method_name: &[u8] = &[];
    let mut buf: &[u8] = &meta;
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        match (tag, wire_type) {
            (1, WireType::Varint) => decoded.correlation_id = decode_varint(&mut buf)?,
            (5, WireType::LengthDelimited) => {
                decoded.is_request = true;
                let mut request = delimited(&mut buf)?;
                while !request.is_empty() {
                    let (tag, wire_type) = decode_key(&mut request)?;
                    match (tag, wire_type) {
                        (2, WireType::LengthDelimited) => method_name = delimited(&mut request)?,
                        // uint32, truncated from the varint as prost does.
                        (4, WireType::Varint) => {
                            decoded.timeout = Some(decode_varint(&mut request)? as u32)
                        }
                        (6, WireType::Varint) => {
                            decoded.acceptable_compression_algorithms =
                                Some(decode_varint(&mut request)?)
                        }
                        (2 | 4 | 6, _) => return Err(MetaError::WireType(tag)),
                        _ => skip_field(wire_type, tag, &mut request, DecodeContext::default())?,
                    }
                }
            }
            (9, WireType::Varint) => {
                decoded.compression_algorithm = Some(decode_varint(&mut buf)? as i32)
            }
            (1 | 5 | 9, _) => return Err(MetaError::WireType(tag)),
            _ => skip_field(wire_type, tag, &mut buf, DecodeContext::default())?,
        }
    }
    if std::str::from_utf8(method_name).is_err() {
        return Err(MetaError::MethodNameNotUtf8);
    }
    decoded.method_name = meta.slice_ref(method_name);
    Ok(decoded)
}

/// A frame: header, meta, payload, no attachment.
pub fn encode(meta: &RpcMeta, payload: &[u8]) -> Bytes {
    let meta_size = meta.encoded_len();
    let mut frame = BytesMut::with_capacity(HEADER_LEN + meta_size + payload.len());
    frame.put_slice(&MAGIC);
    // Both are bounded far below u32::MAX: answers are encoded scheduler messages.
    frame.put_u32_le(meta_size as u32);
    frame.put_u32_le(payload.len() as u32);
    frame.put_u32_le(0);
    // Writing into a BytesMut with room cannot fail.
    let _ = meta.encode(&mut frame);
    frame.put_slice(payload);
    frame.freeze()
}

/// The head of the answer to call `correlation_id` (frame header and meta):
/// for a payload of `Ok(length)` bytes with status 0, or for an error status
/// with its description and no payload. The payload follows the head on the
/// wire and is not copied here: it may be shared by every caller.
/// `method_type` is always 1 and `status` is always on the wire, even when 0
/// (proto2 `required`). A payload compressed with `compression` says so as
/// the original's server does: `compression_algorithm` and
/// `attachment_compressed` (there is no attachment, but the framework sets
/// both together).
///
/// Written field by field into one buffer, in the order prost writes
/// [`RpcMeta`] (a test holds the two equal): every call pays for its
/// answer's meta, and building the message, sizing it and encoding it again
/// cost about as much as the rest of the frame.
pub fn response_head(
    correlation_id: u64,
    outcome: Result<usize, (i32, &str)>,
    compression: Option<Algorithm>,
) -> Bytes {
    use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
    let (status, description, payload_len, compression) = match outcome {
        Ok(payload_len) => (0, None, payload_len, compression.map(|a| a.wire() as u64)),
        Err((status, description)) => (status, Some(description), 0, None),
    };
    // int32 on the wire: a negative status is sign-extended to 64 bits.
    let status = i64::from(status) as u64;
    // Keys of fields 1 to 15 take one byte.
    let description_len = description.map_or(0, |text| {
        1 + encoded_len_varint(text.len() as u64) + text.len()
    });
    let response_meta_len = 1 + encoded_len_varint(status) + description_len;
    let method_type = MethodType::Single as u64;
    // Fields 9 and 10: a key byte and a one-byte value each.
    let compression_len = compression.map_or(0, |_| 4);
    let meta_size = 1
        + encoded_len_varint(correlation_id)
        + 1
        + encoded_len_varint(response_meta_len as u64)
        + response_meta_len
        + 1
        + encoded_len_varint(method_type)
        + compression_len;
    let mut head = BytesMut::with_capacity(HEADER_LEN + meta_size);
    head.put_slice(&MAGIC);
    // Both are bounded far below u32::MAX: answers are encoded scheduler messages.
    head.put_u32_le(meta_size as u32);
    head.put_u32_le(payload_len as u32);
    head.put_u32_le(0);
    encode_key(1, WireType::Varint, &mut head);
    encode_varint(correlation_id, &mut head);
    encode_key(6, WireType::LengthDelimited, &mut head);
    encode_varint(response_meta_len as u64, &mut head);
    encode_key(1, WireType::Varint, &mut head);
    encode_varint(status, &mut head);
    if let Some(text) = description {
        encode_key(2, WireType::LengthDelimited, &mut head);
        encode_varint(text.len() as u64, &mut head);
        head.put_slice(text.as_bytes());
    }
    encode_key(7, WireType::Varint, &mut head);
    encode_varint(method_type, &mut head);
    if let Some(algorithm) = compression {
        encode_key(9, WireType::Varint, &mut head);
        encode_varint(algorithm, &mut head);
        encode_key(10, WireType::Varint, &mut head);
        encode_varint(1, &mut head);
    }
    head.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::flare::rpc::RpcResponseMeta;

    fn header(bytes: [u8; 16]) -> Result<FrameHeader, HeaderError> {
        FrameHeader::parse(&bytes)
    }

    /// The whole answer frame: its head, then the payload.
    fn response(
        correlation_id: u64,
        outcome: Result<&[u8], (i32, &str)>,
        compression: Option<Algorithm>,
    ) -> Vec<u8> {
        let head = response_head(correlation_id, outcome.map(<[u8]>::len), compression);
        [&head[..], outcome.unwrap_or_default()].concat()
    }

    #[test]
    fn headers_are_little_endian_sizes_after_the_magic() {
        let parsed = header([
            0x43, 0x50, 0x52, 0x46, 0x37, 0, 0, 0, 0x49, 0, 0, 0, 1, 2, 0, 0,
        ])
        .unwrap();
        assert_eq!(
            parsed,
            FrameHeader {
                meta_size: 0x37,
                msg_size: 0x49,
                att_size: 0x0201
            }
        );
        assert_eq!(parsed.body_len(), 0x37 + 0x49 + 0x201);
    }

    #[test]
    fn bad_magic_and_oversize_frames_are_refused() {
        let mut bytes = *b"POST / HTTP/1.1\r";
        assert!(matches!(header(bytes), Err(HeaderError::BadMagic(_))));
        bytes = [
            0x43, 0x50, 0x52, 0x46, 0, 0, 0x40, 0, 1, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(header(bytes), Err(HeaderError::TooLarge((4 << 20) + 1)));
        bytes = [
            0x43, 0x50, 0x52, 0x46, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert!(header(bytes).is_ok(), "exactly 4 MiB is allowed");
        // Sizes that would overflow 32 bits when added.
        bytes = [
            0x43, 0x50, 0x52, 0x46, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0,
        ];
        assert!(matches!(header(bytes), Err(HeaderError::TooLarge(_))));
    }

    #[test]
    fn the_documented_heartbeat_answer_is_byte_for_byte() {
        let payload = crate::pb::HeartbeatResponse {
            acceptable_tokens: vec!["00112233445566778899aabbccddeeff".into()],
            expired_tasks: vec![7, 300],
        }
        .encode_to_vec();
        let expected: Vec<u8> = "43 50 52 46 08 00 00 00 27 00 00 00 00 00 00 00 \
            08 01 32 02 08 00 38 01 0a 03 07 ac 02 12 20 30 \
            30 31 31 32 32 33 33 34 34 35 35 36 36 37 37 38 \
            38 39 39 61 61 62 62 63 63 64 64 65 65 66 66"
            .split_whitespace()
            .map(|byte| u8::from_str_radix(byte, 16).unwrap())
            .collect();
        // flare-wire.md calls it "55 bytes"; its listing is 63: the 16-byte
        // header, 8 bytes of meta and the 39-byte (0x27) payload.
        assert_eq!(expected.len(), 16 + 8 + 0x27);
        assert_eq!(&response(1, Ok(&payload), None)[..], expected);
    }

    /// What prost writes for the same answer: the reference `response` must match.
    fn response_by_prost(
        correlation_id: u64,
        outcome: Result<&[u8], (i32, &str)>,
        compression: Option<Algorithm>,
    ) -> Vec<u8> {
        let (status, description, payload, compression) = match outcome {
            Ok(payload) => (0, None, payload, compression),
            Err((status, description)) => (status, Some(description.to_owned()), &[][..], None),
        };
        let meta = RpcMeta {
            correlation_id,
            method_type: MethodType::Single as i32,
            response_meta: Some(RpcResponseMeta {
                status,
                description,
                trace_forcibly_sampled: None,
            }),
            compression_algorithm: compression.map(Algorithm::wire),
            attachment_compressed: compression.map(|_| true),
            ..RpcMeta::default()
        };
        encode(&meta, payload).to_vec()
    }

    #[test]
    fn answers_are_what_prost_writes_for_their_meta() {
        let long = "d".repeat(300);
        let outcomes: [Result<&[u8], (i32, &str)>; 7] = [
            Ok(&[]),
            Ok(b"payload"),
            Err((1001, "")),
            Err((11, "too many calls in flight on this connection")),
            Err((-1, "negative")),
            Err((i32::MIN, &long)),
            Err((i32::MAX, "x")),
        ];
        let compressions = [
            None,
            Some(Algorithm::Gzip),
            Some(Algorithm::Lz4Frame),
            Some(Algorithm::Snappy),
            Some(Algorithm::Zstd),
        ];
        for (id, compression) in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX]
            .into_iter()
            .flat_map(|id| compressions.map(|compression| (id, compression)))
        {
            for outcome in outcomes {
                let ours = response(id, outcome, compression);
                assert_eq!(
                    &ours[..],
                    response_by_prost(id, outcome, compression),
                    "{id} {outcome:?} {compression:?}"
                );
                let header = FrameHeader::parse(ours[..HEADER_LEN].try_into().unwrap()).unwrap();
                let meta =
                    RpcMeta::decode(&ours[HEADER_LEN..HEADER_LEN + header.meta_size]).unwrap();
                assert_eq!(meta.correlation_id, id);
            }
        }
    }

    /// The request metas prost decodes, decoded by [`decode_request_meta`]:
    /// the fields the server acts on must agree.
    fn agrees_with_prost(bytes: &[u8]) {
        let ours = decode_request_meta(Bytes::copy_from_slice(bytes));
        let Ok(prost) = RpcMeta::decode(bytes) else {
            return;
        };
        let ours = ours.unwrap_or_else(|error| panic!("{bytes:02x?}: {error}"));
        let request = prost.request_meta.as_ref();
        assert_eq!(ours.correlation_id, prost.correlation_id, "{bytes:02x?}");
        assert_eq!(ours.is_request, request.is_some(), "{bytes:02x?}");
        assert_eq!(
            ours.method_name(),
            request.map_or(&b""[..], |request| request.method_name.as_bytes()),
            "{bytes:02x?}"
        );
        assert_eq!(ours.timeout, request.and_then(|request| request.timeout));
        assert_eq!(
            ours.acceptable_compression_algorithms,
            request.and_then(|request| request.acceptable_compression_algorithms)
        );
        assert_eq!(ours.compression_algorithm, prost.compression_algorithm);
    }

    #[test]
    fn request_metas_decode_as_prost_decodes_them() {
        use crate::pb::flare::rpc::RpcRequestMeta;
        let request = |name: &str, timeout| RpcRequestMeta {
            method_name: name.to_owned(),
            request_id: Some(9),
            timeout,
            tracing_context: Some(vec![1, 2, 3]),
            acceptable_compression_algorithms: Some(62),
        };
        let metas = [
            RpcMeta::default(),
            RpcMeta {
                correlation_id: u64::MAX,
                method_type: MethodType::Single as i32,
                request_meta: Some(request(
                    "yadcc.scheduler.SchedulerService.Heartbeat",
                    Some(2000),
                )),
                compression_algorithm: Some(1),
                flags: Some(5),
                attachment_compressed: Some(false),
                ..RpcMeta::default()
            },
            RpcMeta {
                correlation_id: 300,
                request_meta: Some(request("", None)),
                response_meta: Some(RpcResponseMeta {
                    status: -5,
                    description: Some("x".into()),
                    trace_forcibly_sampled: Some(true),
                }),
                compression_algorithm: Some(-1),
                ..RpcMeta::default()
            },
        ];
        let mut mutated = 0;
        for meta in &metas {
            let bytes = meta.encode_to_vec();
            agrees_with_prost(&bytes);
            // A field repeated is merged (the last scalar wins), as prost does.
            agrees_with_prost(&[bytes.clone(), bytes.clone()].concat());
            // Every truncation and every single-byte change: whenever prost
            // still decodes, the fields agree.
            for end in 0..bytes.len() {
                agrees_with_prost(&bytes[..end]);
            }
            for at in 0..bytes.len() {
                for value in [0x00, 0x01, 0x07, 0x0a, 0x12, 0x2a, 0x7f, 0x80, 0xff] {
                    let mut changed = bytes.clone();
                    changed[at] = value;
                    agrees_with_prost(&changed);
                    mutated += 1;
                }
            }
        }
        assert!(mutated > 500);
        // Refused, as prost refuses them: a wrong wire type for a field read,
        // a length past the end, a method name that is not UTF-8.
        for bad in [
            &[0x0a, 0x00][..],
            &[0x2a, 0x05, 0x12],
            &[0x2a, 0x03, 0x12, 0x01, 0xff],
        ] {
            assert!(RpcMeta::decode(bad).is_err(), "{bad:02x?}");
            assert!(
                decode_request_meta(Bytes::copy_from_slice(bad)).is_err(),
                "{bad:02x?}"
            );
        }
    }

    #[test]
    fn the_smallest_success_is_the_documented_bytes() {
        assert_eq!(
            &response(1, Ok(&[]), None)[..],
            [
                0x43, 0x50, 0x52, 0x46, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x01, 0x32,
                0x02, 0x08, 0x00, 0x38, 0x01
            ]
        );
    }
}
