use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(name, value)| {
            (
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            )
        })
        .collect()
}

fn framed(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = BytesMut::new();
    encode_frame(flags, payload, &mut frame);
    frame.to_vec()
}

#[test]
fn a_frame_is_flags_length_and_payload() {
    assert_eq!(framed(0, b"abc"), [0, 0, 0, 0, 3, b'a', b'b', b'c']);
    let empty = HeaderMap::new();
    assert_eq!(unary_message(&framed(0, b"abc"), 10, &empty).unwrap(), 5..8);
    assert_eq!(unary_message(&framed(0, b""), 10, &empty).unwrap(), 5..5);
}

#[test]
fn a_unary_body_holds_exactly_one_whole_message() {
    let empty = HeaderMap::new();
    let kind = |body: &[u8]| unary_message(body, 10, &empty).unwrap_err().kind;
    assert_eq!(kind(b""), ErrorKind::MalformedRequest);
    assert_eq!(kind(&[0, 0, 0]), ErrorKind::MalformedRequest);
    assert_eq!(kind(&framed(0, b"abc")[..6]), ErrorKind::MalformedRequest);
    let mut two = framed(0, b"a");
    two.extend(framed(0, b"b"));
    assert_eq!(kind(&two), ErrorKind::MalformedRequest);
    assert_eq!(kind(&framed(0x80, b"")), ErrorKind::MalformedRequest);
    assert_eq!(kind(&framed(0, &[0; 11])), ErrorKind::PayloadTooLarge);
    // The announced length is checked before the bytes arrive.
    assert_eq!(kind(&[0, 0, 0, 0, 11]), ErrorKind::PayloadTooLarge);
}

#[test]
fn compressed_messages_are_refused_as_the_spec_says() {
    let message = framed(FLAG_COMPRESSED, b"x");
    let kind = |headers: &HeaderMap| unary_message(&message, 10, headers).unwrap_err().kind;
    assert_eq!(kind(&HeaderMap::new()), ErrorKind::Internal);
    assert_eq!(
        kind(&headers(&[("grpc-encoding", "identity")])),
        ErrorKind::Internal
    );
    assert_eq!(
        kind(&headers(&[("grpc-encoding", "gzip")])),
        ErrorKind::CompressionNotSupported
    );
    assert_eq!(grpc_code(ErrorKind::Internal.wire().connect_code), 13);
    assert_eq!(
        grpc_code(ErrorKind::CompressionNotSupported.wire().connect_code),
        12
    );
}

#[test]
fn timeouts_take_every_unit_and_refuse_the_rest() {
    let ok = |text: &str| parse_timeout(text.as_bytes()).unwrap();
    assert_eq!(ok("2H"), Duration::from_secs(7200));
    assert_eq!(ok("3M"), Duration::from_secs(180));
    assert_eq!(ok("4S"), Duration::from_secs(4));
    assert_eq!(ok("200m"), Duration::from_millis(200));
    assert_eq!(ok("5u"), Duration::from_micros(5));
    assert_eq!(ok("99999999n"), Duration::from_nanos(99_999_999));
    for bad in ["", "m", "200", "123456789m", "20x", "-5m", "1.5S", "5 m"] {
        assert_eq!(
            parse_timeout(bad.as_bytes()).unwrap_err().kind,
            ErrorKind::MalformedRequest,
            "{bad:?}"
        );
    }
}

#[test]
fn text_bodies_decode_whole_or_chunked() {
    let frame = framed(0, b"hello");
    let whole = base64::engine::general_purpose::STANDARD.encode(&frame);
    assert_eq!(decode_text(whole.as_bytes()).unwrap(), frame);

    // 7 bytes: the first chunk ends in padding.
    let mut two = framed(0, b"ab");
    two.extend(framed(FLAG_TRAILERS, b"grpc-status:0\r\n"));
    let chunked = format!(
        "{}\r\n{}",
        base64::engine::general_purpose::STANDARD.encode(framed(0, b"ab")),
        base64::engine::general_purpose::STANDARD
            .encode(framed(FLAG_TRAILERS, b"grpc-status:0\r\n"))
    );
    assert!(
        chunked[..chunked.len() - 2].contains('='),
        "padding mid-body"
    );
    assert_eq!(decode_text(chunked.as_bytes()).unwrap(), two);

    assert_eq!(
        decode_text(b"not base64!").unwrap_err().kind,
        ErrorKind::MalformedRequest
    );
}

#[test]
fn many_tiny_text_chunks_decode_in_linear_time() {
    // A 4 MiB body (the default body limit) of one-byte chunks: quadratic
    // decoding copied about 2 TB here (90 s in a debug build on
    // this test's machine); linear decoding takes well under a second.
    const CHUNKS: usize = 1 << 20;
    let body = "AA==".repeat(CHUNKS);
    let decoded = decode_text(body.as_bytes()).unwrap();
    assert_eq!(decoded.len(), CHUNKS);
    assert!(decoded.iter().all(|&byte| byte == 0));
}

#[test]
fn text_limit_leaves_room_for_base64() {
    assert_eq!(raw_body_limit(GrpcFlavour::Grpc, 10), 15);
    assert_eq!(raw_body_limit(GrpcFlavour::WebText, 10), 20);
    let encoded = base64::engine::general_purpose::STANDARD.encode(framed(0, &[7; 10]));
    assert!(encoded.len() <= raw_body_limit(GrpcFlavour::WebText, 10));
}

#[test]
fn messages_are_percent_encoded() {
    assert_eq!(percent_encode("no slot: 100% busy"), "no slot: 100%25 busy");
    assert_eq!(percent_encode("naïve\n"), "na%C3%AFve%0A");
}

#[test]
fn every_table_code_has_its_grpc_number() {
    for kind in ErrorKind::ALL {
        let connect = kind.wire().connect_code;
        assert_ne!(grpc_code(connect), 2, "{kind:?}: {connect}");
    }
    assert_eq!(grpc_code("resource_exhausted"), 8);
    assert_eq!(grpc_code("permission_denied"), 7);
}

#[test]
fn trailer_frames_carry_the_status_lines() {
    let error = ApiError::new(ErrorKind::DeadlineExceeded, "late: 5%");
    let mut frame = BytesMut::new();
    encode_trailer_frame(&status_fields(Err(&error)), &mut frame);
    let block = b"grpc-status:4\r\ngrpc-message:late: 5%25\r\n";
    assert_eq!(frame[0], 0x80);
    assert_eq!(&frame[1..5], (block.len() as u32).to_be_bytes());
    assert_eq!(&frame[5..], block);
}

#[test]
fn content_types_select_framing_and_encoding() {
    let format =
        |content_type: &str| GrpcFormat::from_headers(&headers(&[("content-type", content_type)]));
    assert_eq!(
        format("application/grpc").unwrap().framing,
        GrpcFlavour::Grpc
    );
    assert_eq!(
        format("application/grpc+json").unwrap().encoding,
        Encoding::Json
    );
    assert_eq!(
        format("Application/gRPC-Web-Text; charset=x")
            .unwrap()
            .framing,
        GrpcFlavour::WebText
    );
    assert_eq!(
        format("application/grpc+thrift").unwrap_err().kind,
        ErrorKind::UnsupportedMediaType
    );
    assert!(is_grpc(&headers(&[(
        "content-type",
        "application/grpc+thrift"
    )])));
    assert!(!is_grpc(&headers(&[("content-type", "application/proto")])));
    assert!(!is_grpc(&HeaderMap::new()));
}
