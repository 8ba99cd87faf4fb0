//! The binary protocol's frame: a 16-byte header (magic `CPRF`, then the
//! sizes of meta, payload and attachment, little-endian), the `RpcMeta`, the
//! payload and the attachment. Pure bytes in, bytes out; no I/O.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use crate::pb::flare::rpc::{MethodType, RpcMeta};

/// The first four bytes of every frame (and so of every connection).
pub const MAGIC: [u8; 4] = *b"CPRF";
/// Bytes before the meta.
pub const HEADER_LEN: usize = 16;
/// The framework's limit on meta + payload + attachment; a larger frame
/// closes the connection, as the original server does.
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

/// The answer to call `correlation_id`: the payload with status 0, or an
/// error status, its description and no payload. `method_type` is always 1 and
/// `status` is always on the wire, even when 0 (proto2 `required`).
///
/// Written field by field into the frame's one buffer, in the order prost
/// writes [`RpcMeta`] (a test holds the two equal): every call pays for its
/// answer's meta, and building the message, sizing it and encoding it again
/// cost about as much as the rest of the frame.
pub fn response(correlation_id: u64, outcome: Result<&[u8], (i32, &str)>) -> Bytes {
    use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
    let (status, description, payload) = match outcome {
        Ok(payload) => (0, None, payload),
        Err((status, description)) => (status, Some(description), &[][..]),
    };
    // int32 on the wire: a negative status is sign-extended to 64 bits.
    let status = i64::from(status) as u64;
    // Keys of fields 1 to 15 take one byte.
    let description_len = description.map_or(0, |text| {
        1 + encoded_len_varint(text.len() as u64) + text.len()
    });
    let response_meta_len = 1 + encoded_len_varint(status) + description_len;
    let method_type = MethodType::Single as u64;
    let meta_size = 1
        + encoded_len_varint(correlation_id)
        + 1
        + encoded_len_varint(response_meta_len as u64)
        + response_meta_len
        + 1
        + encoded_len_varint(method_type);
    let mut frame = BytesMut::with_capacity(HEADER_LEN + meta_size + payload.len());
    frame.put_slice(&MAGIC);
    // Both are bounded far below u32::MAX: answers are encoded scheduler messages.
    frame.put_u32_le(meta_size as u32);
    frame.put_u32_le(payload.len() as u32);
    frame.put_u32_le(0);
    encode_key(1, WireType::Varint, &mut frame);
    encode_varint(correlation_id, &mut frame);
    encode_key(6, WireType::LengthDelimited, &mut frame);
    encode_varint(response_meta_len as u64, &mut frame);
    encode_key(1, WireType::Varint, &mut frame);
    encode_varint(status, &mut frame);
    if let Some(text) = description {
        encode_key(2, WireType::LengthDelimited, &mut frame);
        encode_varint(text.len() as u64, &mut frame);
        frame.put_slice(text.as_bytes());
    }
    encode_key(7, WireType::Varint, &mut frame);
    encode_varint(method_type, &mut frame);
    frame.put_slice(payload);
    frame.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::flare::rpc::RpcResponseMeta;

    fn header(bytes: [u8; 16]) -> Result<FrameHeader, HeaderError> {
        FrameHeader::parse(&bytes)
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
        assert_eq!(&response(1, Ok(&payload))[..], expected);
    }

    /// What prost writes for the same answer: the reference `response` must match.
    fn response_by_prost(correlation_id: u64, outcome: Result<&[u8], (i32, &str)>) -> Vec<u8> {
        let (status, description, payload) = match outcome {
            Ok(payload) => (0, None, payload),
            Err((status, description)) => (status, Some(description.to_owned()), &[][..]),
        };
        let meta = RpcMeta {
            correlation_id,
            method_type: MethodType::Single as i32,
            response_meta: Some(RpcResponseMeta {
                status,
                description,
                trace_forcibly_sampled: None,
            }),
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
        for id in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            for outcome in outcomes {
                let ours = response(id, outcome);
                assert_eq!(
                    &ours[..],
                    response_by_prost(id, outcome),
                    "{id} {outcome:?}"
                );
                let header = FrameHeader::parse(ours[..HEADER_LEN].try_into().unwrap()).unwrap();
                let meta =
                    RpcMeta::decode(&ours[HEADER_LEN..HEADER_LEN + header.meta_size]).unwrap();
                assert_eq!(meta.correlation_id, id);
            }
        }
    }

    #[test]
    fn the_smallest_success_is_the_documented_bytes() {
        assert_eq!(
            &response(1, Ok(&[]))[..],
            [
                0x43, 0x50, 0x52, 0x46, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x01, 0x32,
                0x02, 0x08, 0x00, 0x38, 0x01
            ]
        );
    }
}
