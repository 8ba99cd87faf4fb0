//! Rule "no cross-site calls" over a real socket, two-sided: a page of
//! another site is refused (403) and a listed origin or the server's own
//! pages are not; a body a page may send without a preflight (no
//! `Content-Type`, `text/plain`, the form types) is 415, while the stock
//! daemons' `http+pb`, JSON, Connect and gRPC keep working. Rule "no
//! rebinding": with an `Origin`, a `Host` that is none of the server's names
//! is refused on the real binary, unless `--allowed_hosts` lists it.

use prost::Message;
use yadcc_pb as pb;
use yadcc_scheduler::rpc::state::TransportSettings;

use crate::support::{
    Connection, Method, SERVICE, STEP, Server, USER_TOKEN, bounded, call_http_pb, engine_config,
    http_request, run_bounded,
};

const LISTED: &str = "https://ci.example.com";

async fn server() -> Server {
    Server::start_with(
        engine_config(),
        TransportSettings {
            cors_allowed_origins: vec![LISTED.parse().unwrap()],
            ..TransportSettings::default()
        },
        "127.0.0.1:0",
    )
    .await
}

fn get_config() -> Vec<u8> {
    pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
    .encode_to_vec()
}

/// `GetConfig` on `path` with `headers`: the status and `Rpc-Error-Code`.
async fn call(server: &Server, path: &str, headers: &[(&str, &str)]) -> (u16, Option<String>) {
    let mut connection = Connection::open(server.addr).await;
    connection
        .send(&http_request(path, headers, &get_config()))
        .await;
    let answer = connection.read_response().await;
    (
        answer.status,
        answer.header("rpc-error-code").map(str::to_owned),
    )
}

#[tokio::test]
async fn a_page_of_another_site_is_refused_and_listed_or_own_pages_are_not() {
    let server = server().await;
    let own = format!("http://{}", server.addr);
    for path in [
        format!("/rpc/{SERVICE}.GetConfig"),
        format!("/{SERVICE}/GetConfig"),
    ] {
        let proto = ("Content-Type", "application/x-protobuf");
        let refused = call(&server, &path, &[("Origin", "http://evil.example"), proto]).await;
        assert_eq!(refused, (403, Some("5".to_owned())), "{path}");
        let host = server.addr.to_string();
        for origin in [LISTED, own.as_str()] {
            let headers = [("Host", host.as_str()), ("Origin", origin), proto];
            let (status, _) = call(&server, &path, &headers).await;
            assert_eq!(status, 200, "{origin} on {path}");
        }
        let (status, _) = call(&server, &path, &[proto]).await;
        assert_eq!(status, 200, "no Origin: not a browser");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_body_any_page_may_send_is_refused_and_the_daemons_is_not() {
    let server = server().await;
    let path = format!("/rpc/{SERVICE}.GetConfig");
    for content_type in [
        "text/plain",
        "text/plain; charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let answer = call(&server, &path, &[("Content-Type", content_type)]).await;
        assert_eq!(answer, (415, Some("5".to_owned())), "{content_type}");
    }
    let (status, _) = call(&server, &path, &[]).await;
    assert_eq!(status, 415, "no Content-Type");

    // A stock daemon's http+pb (Rpc-SeqNo, application/x-protobuf, no Host).
    let answer = call_http_pb(
        server.addr,
        Method::GetConfig,
        &pb::GetConfigRequest {
            token: USER_TOKEN.into(),
        },
    )
    .await;
    assert_eq!(answer.status, 200);
    // JSON, as curl sends it.
    let mut connection = Connection::open(server.addr).await;
    let body = format!("{{\"token\":\"{USER_TOKEN}\"}}");
    connection
        .send(&http_request(
            &path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        ))
        .await;
    assert_eq!(connection.read_response().await.status, 200);
    server.stop().await;
}

#[tokio::test]
async fn grpc_from_another_sites_page_is_refused_too() {
    let server = server().await;
    // One gRPC message: uncompressed, its length, the request.
    let message = get_config();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let body = std::env::temp_dir().join(format!("yadcc-cross-site-{}.bin", std::process::id()));
    std::fs::write(&body, &framed).unwrap();
    let url = format!("http://{}/{SERVICE}/GetConfig", server.addr);
    let grpc_status = |origin: Option<&str>| {
        let mut command = bounded(STEP, "curl");
        command.args([
            "--silent",
            "--show-error",
            "--http2-prior-knowledge",
            "--dump-header",
            "-",
            "-o",
            "/dev/null",
            "-H",
            "Content-Type: application/grpc",
            "-H",
            "TE: trailers",
        ]);
        if let Some(origin) = origin {
            command.args(["-H", &format!("Origin: {origin}")]);
        }
        command
            .arg("--data-binary")
            .arg(format!("@{}", body.display()));
        command.arg(&url);
        command
    };
    let status_of = |output: std::process::Output| {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|line| line.strip_prefix("grpc-status: "))
            .map(|status| status.trim().to_owned())
    };
    let refused = run_bounded(grpc_status(Some("http://evil.example"))).await;
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(
        status_of(refused).as_deref(),
        Some("7"),
        "PERMISSION_DENIED: {shown}"
    );
    let served = run_bounded(grpc_status(None)).await;
    let head = String::from_utf8_lossy(&served.stdout);
    assert!(head.starts_with("HTTP/2 200"), "{head}");
    assert!(
        status_of(served).is_none_or(|status| status == "0"),
        "answered, not refused in the head"
    );
    let _ = std::fs::remove_file(&body);
    server.stop().await;
}

/// A request with `Host: host` (and `Origin: origin`, if any) to the real
/// binary: the status and the answer.
async fn with_host(
    addr: std::net::SocketAddr,
    head: &str,
    host: &str,
    origin: Option<&str>,
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let origin = origin.map_or(String::new(), |origin| format!("Origin: {origin}\r\n"));
    let request = format!(
        "{head}\r\nHost: {host}\r\n{origin}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(STEP, stream.read_to_end(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok());
    (status.unwrap_or_else(|| panic!("{answer}")), answer)
}

#[tokio::test]
async fn a_page_whose_name_was_rebound_to_the_server_is_refused_unless_the_name_is_allowed() {
    let rpc = "POST /rpc/yadcc.scheduler.SchedulerService.GetConfig HTTP/1.1";
    let page = "GET /api/v1/overview HTTP/1.1";
    let body = format!(r#"{{"token": "{USER_TOKEN}"}}"#);
    let evil = Some("http://evil.example");
    let open = ["--debugging_no_inspect_auth"];
    let server = crate::support::Binary::start(&open, None);
    let addr = server.addr;
    for head in [rpc, page] {
        let (status, answer) = with_host(addr, head, "evil.example", evil, &body).await;
        assert_eq!(status, 403, "{head}: {answer}");
        assert!(answer.contains("DNS rebinding"), "{answer}");
        let (status, answer) = with_host(addr, head, "evil.example", None, &body).await;
        assert_eq!(status, 200, "{head} without an Origin (curl): {answer}");
        let own = format!("http://{addr}");
        let (status, answer) = with_host(addr, head, &addr.to_string(), Some(&own), &body).await;
        assert_eq!(status, 200, "{head} by IP: {answer}");
        let (status, answer) =
            with_host(addr, head, "localhost:1", Some("http://localhost:1"), &body).await;
        assert_eq!(status, 200, "{head} as localhost: {answer}");
    }

    let allowing = crate::support::Binary::start(&[open[0], "--allowed_hosts=evil.example"], None);
    for head in [rpc, page] {
        let (status, answer) = with_host(allowing.addr, head, "evil.example", evil, &body).await;
        assert_eq!(status, 200, "{head} with --allowed_hosts: {answer}");
    }
}
