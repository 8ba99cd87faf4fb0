//! The wire against the vectors of flare-wire.md and the daemons' HTTP.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use super::*;
use yadcc_pb as pb;

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

/// The meta encoded once per method gives the same frames as prost's.
#[test]
fn frames_with_a_meta_encoded_once_are_prost_s() {
    for acceptable in [
        DAEMON_ACCEPTABLE_COMPRESSION,
        compression::ACCEPT_UNCOMPRESSED,
    ] {
        let requests = FlareRequests::new(acceptable);
        for rpc in Method::ALL {
            for id in [0, 1, 127, 128, 300, 1 << 40, u64::MAX] {
                let mut fast = BytesMut::new();
                requests.encode(&mut fast, id, rpc, b"payload");
                let meta = request_meta_accepting(
                    id,
                    rpc.full_name().to_owned(),
                    client_timeout(rpc),
                    acceptable,
                );
                let mut slow = BytesMut::new();
                encode_flare_frame(&mut slow, &meta, b"payload", &[]);
                assert_eq!(fast, slow, "{rpc} {id} {acceptable}");
            }
        }
    }
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

/// An answer frame of `payload` compressed with `algorithm` (meta value).
fn compressed_answer(correlation_id: u64, algorithm: i32, payload: &[u8]) -> BytesMut {
    let meta = pb::flare::rpc::RpcMeta {
        correlation_id,
        method_type: pb::flare::rpc::MethodType::Single as i32,
        response_meta: Some(pb::flare::rpc::RpcResponseMeta::default()),
        compression_algorithm: Some(algorithm),
        ..pb::flare::rpc::RpcMeta::default()
    };
    let mut frame = BytesMut::new();
    encode_flare_frame(&mut frame, &meta, payload, &[]);
    frame
}

/// Stock daemons accept every algorithm (62) and inflate the answer: so
/// does the simulator, keeping the compressed bytes for whoever counts them.
#[test]
fn compressed_answers_are_inflated_and_unknown_algorithms_refused() {
    let list = pb::GetRunningTasksResponse {
        running_tasks: (0..200)
            .map(|n| pb::RunningTask {
                servant_task_id: n,
                task_grant_id: 0,
                servant_location: format!("127.1.0.{}:8335", n % 250 + 1),
                task_digest: format!("{n:032x}"),
            })
            .collect(),
    }
    .encode_to_vec();
    for compression in Compression::ALL {
        let compressed = compression.compress(&list);
        let mut buffer = compressed_answer(4, compression.algorithm() as i32, &compressed);
        let whole = decode_flare_response(&mut buffer.clone()).unwrap().unwrap();
        assert_eq!(whole.compression, compression);
        assert_eq!(whole.payload, compressed);
        assert_eq!(whole.message().unwrap(), list);
        let answer = decode_flare_answer(&mut buffer).unwrap().unwrap();
        assert_eq!(answer.outcome, Outcome::Ok(Bytes::from(list.clone())));
    }
    // Damaged zstd: the answer is refused, not handed on half-inflated.
    let mut damaged = Compression::Zstd.compress(&list);
    damaged.truncate(damaged.len() - 3);
    let mut buffer = compressed_answer(5, Compression::Zstd.algorithm() as i32, &damaged);
    assert!(matches!(
        decode_flare_answer(&mut buffer),
        Err(StreamError::BadPayload(_))
    ));
    for unknown in [0, 6] {
        let mut buffer = compressed_answer(6, unknown, &list);
        assert!(
            matches!(
                decode_flare_answer(&mut buffer),
                Err(StreamError::BadMeta(_))
            ),
            "{unknown}"
        );
    }
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
        Err(StreamError::BadMagic(_))
    ));
    let mut huge = BytesMut::from(&FLARE_MAGIC[..]);
    huge.put_u32_le(8);
    huge.put_u32_le(512 << 20);
    huge.put_u32_le(0);
    assert!(matches!(
        decode_flare_answer(&mut huge),
        Err(StreamError::TooLarge(_))
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
        Err(StreamError::BadMeta(_))
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
    let mut chunked = BytesMut::from(&b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"[..]);
    assert!(decode_http_answer(&mut chunked).is_err());
}

#[test]
fn protocols_parse_and_timeouts_are_the_daemons() {
    assert_eq!("flare".parse(), Ok(Wire::Flare));
    assert_eq!("http+pb".parse(), Ok(Wire::HttpPb));
    assert_eq!("JSON".parse(), Ok(Wire::Json));
    assert!("grpc".parse::<Wire>().is_err());
    assert_eq!(client_timeout(Method::Heartbeat), Duration::from_secs(2));
    assert_eq!(
        client_timeout(Method::WaitForStartingTask),
        Duration::from_secs(10)
    );
}

#[test]
fn whole_http_responses_keep_every_header_and_follow_the_same_rules() {
    let mut buffer = BytesMut::from(
        &b"HTTP/1.1 413 Payload Too Large\r\nRpc-SeqNo: 77\r\nX-Odd:  spaced \r\n\
           Content-Length: 3\r\nConnection: close\r\n\r\nab"[..],
    );
    assert_eq!(
        decode_http_response(&mut buffer),
        Ok(None),
        "body not all there"
    );
    buffer.extend_from_slice(b"cHTTP/1.1 200");
    let response = decode_http_response(&mut buffer).unwrap().unwrap();
    assert_eq!(response.status, 413);
    assert_eq!(response.header("rpc-seqno"), Some("77"));
    assert_eq!(response.header("x-odd"), Some("spaced"));
    assert_eq!(response.header("missing"), None);
    assert_eq!(response.body, Bytes::from_static(b"abc"));
    assert!(response.close);
    assert_eq!(&buffer[..], b"HTTP/1.1 200", "the next answer stays");
    let mut no_length = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
    assert!(matches!(
        decode_http_response(&mut no_length),
        Err(StreamError::BadHttp(_))
    ));
}

#[test]
fn http_pb_to_any_path_may_leave_the_timeout_out() {
    let mut out = BytesMut::new();
    encode_http_pb(&mut out, "/rpc/x.Y", 3, None, b"z");
    assert_eq!(
        &out[..],
        b"POST /rpc/x.Y HTTP/1.1\r\nRpc-SeqNo: 3\r\nContent-Type: application/x-protobuf\r\n\
          Content-Length: 1\r\n\r\nz"
    );
}

#[test]
fn whole_flare_responses_keep_the_frame_and_meta() {
    let frame =
        hex("43 50 52 46 0b 00 00 00 00 00 00 00 00 00 00 00 08 01 32 05 08 eb 07 12 00 38 01");
    let mut buffer = BytesMut::from(&frame[..]);
    let response = decode_flare_response(&mut buffer).unwrap().unwrap();
    assert_eq!(&response.frame[..], &frame[..]);
    assert_eq!((response.meta.correlation_id, response.status()), (1, 1003));
    assert_eq!(response.description(), "");
    assert!(response.payload.is_empty());
    // Any meta, with an attachment: the frame's sizes say where each part is.
    let mut out = BytesMut::new();
    let meta = daemon_request_meta(5, "a.B.C".into(), Duration::from_millis(300));
    encode_flare_frame(&mut out, &meta, b"pay", b"att");
    let meta_len = meta.encoded_len();
    assert_eq!(&out[4..8], &(meta_len as u32).to_le_bytes());
    assert_eq!(&out[8..16], &[3, 0, 0, 0, 3, 0, 0, 0]);
    assert_eq!(&out[16 + meta_len..], b"payatt");
}
