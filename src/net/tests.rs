//! The listener's caps, on a listener without a socket.

use super::*;

fn shared_for(settings: crate::rpc::state::TransportSettings) -> Arc<Listener> {
    let engine = crate::engine::Scheduler::new(crate::engine::Config::default());
    let state = AppState::new(engine, settings);
    Arc::new(Listener {
        tls: None,
        hyper: hyper_builder(&state.settings.edge),
        router: Router::new(),
        edge: state.settings.edge.clone(),
        per_ip_cap: state.settings.edge.connection_cap_per_ip(usize::MAX),
        state,
        per_ip: Mutex::default(),
        strangers: Arc::default(),
        buffers: ConnectionBuffers::new(edge::CONNECTION_BUFFERS_BYTES),
        eviction_headroom: 1,
    })
}

#[tokio::test]
async fn trusted_proxies_are_exempt_from_the_per_address_cap() {
    let settings = crate::rpc::state::TransportSettings {
        trusted_proxies: vec!["10.0.0.1".parse().unwrap()],
        edge: EdgeSettings {
            max_connections_per_ip: Some(2),
            ..EdgeSettings::default()
        },
        ..Default::default()
    };
    let shared = shared_for(settings);
    let slots = Arc::new(Semaphore::new(8));
    let from = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 40_000);

    let through_proxy: Vec<_> = (0..5)
        .map(|_| admit(&shared, &slots, from("10.0.0.1")).expect("proxy admitted"))
        .collect();
    let mapped_proxy = admit(&shared, &slots, from("::ffff:10.0.0.1"));
    assert!(mapped_proxy.is_some(), "the same proxy over IPv6-mapped");
    let direct: Vec<_> = (0..2)
        .map(|_| admit(&shared, &slots, from("10.0.0.9")).expect("under the cap"))
        .collect();
    assert!(
        admit(&shared, &slots, from("10.0.0.9")).is_none(),
        "an untrusted address keeps its cap"
    );
    assert_eq!(slots.available_permits(), 0);
    assert!(
        admit(&shared, &slots, from("10.0.0.1")).is_none(),
        "the global cap still holds for a proxy"
    );

    drop((through_proxy, mapped_proxy, direct));
    assert!(shared.per_ip.lock().unwrap().is_empty());
    assert_eq!(slots.available_permits(), 8);
}

#[tokio::test]
async fn the_per_address_cap_counts_an_ipv6_slash_64_as_one_address() {
    let settings = crate::rpc::state::TransportSettings {
        edge: EdgeSettings {
            max_connections_per_ip: Some(2),
            ..EdgeSettings::default()
        },
        ..Default::default()
    };
    let shared = shared_for(settings);
    let slots = Arc::new(Semaphore::new(16));
    let from = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 40_000);

    let same_block: Vec<_> = ["2001:db8:1:2::1", "2001:db8:1:2:ffff::7"]
        .into_iter()
        .map(|ip| admit(&shared, &slots, from(ip)).expect("under the cap"))
        .collect();
    assert!(
        admit(&shared, &slots, from("2001:db8:1:2:abcd::99")).is_none(),
        "a third address of the same /64 is over the block's cap"
    );
    let next_block = admit(&shared, &slots, from("2001:db8:1:3::1"));
    assert!(next_block.is_some(), "another /64 has its own cap");
    let ipv4: Vec<_> = ["192.0.2.1", "192.0.2.2", "::ffff:192.0.2.1"]
        .into_iter()
        .map(|ip| admit(&shared, &slots, from(ip)))
        .collect();
    assert!(
        ipv4[0].is_some() && ipv4[1].is_some(),
        "IPv4 addresses are counted one by one"
    );
    assert!(
        ipv4[2].is_some(),
        "192.0.2.1's second connection, over IPv6-mapped"
    );
    assert!(
        admit(&shared, &slots, from("192.0.2.1")).is_none(),
        "mapped and plain IPv4 are the same address"
    );

    drop((same_block, next_block, ipv4));
    assert!(shared.per_ip.lock().unwrap().is_empty());
}

#[test]
fn first_bytes_decide_the_protocol() {
    assert_eq!(classify(b"CP"), None);
    assert_eq!(classify(b"CPRF"), Some(ConnectionServer::Flare));
    assert_eq!(
        classify(b"PRI * HTTP/2.0\r\n"),
        Some(ConnectionServer::Hyper)
    );
    assert_eq!(classify(b"PR"), None);
    assert_eq!(classify(b"POST /rpc/x.Y HTTP/1.1\r\nRpc-Se"), None);
    assert_eq!(
        classify(b"POST /rpc/x.Y HTTP/1.1\r\nRpc-SeqNo: 1\r\n\r\n"),
        Some(ConnectionServer::DaemonHttp)
    );
    assert_eq!(
        classify(b"POST /rpc/x.Y HTTP/1.1\r\nHost: a\r\n\r\n"),
        Some(ConnectionServer::Hyper),
        "scripts keep hyper's path"
    );
    assert_eq!(
        classify(
            b"POST /yadcc.scheduler.SchedulerService/Heartbeat HTTP/1.1\r\nRpc-SeqNo: 1\r\n\r\n"
        ),
        Some(ConnectionServer::Hyper),
        "Connect stays on hyper"
    );
    assert_eq!(
        classify(&[0x16, 0x03, 0x01, 0x02, 0x00]),
        Some(ConnectionServer::Tls),
        "a TLS ClientHello"
    );
    assert_eq!(classify(&[0x16]), Some(ConnectionServer::Tls));
}
