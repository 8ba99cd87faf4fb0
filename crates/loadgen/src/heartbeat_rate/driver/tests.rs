use super::*;

#[test]
fn config_debug_redacts_tokens() {
    let config = HeartbeatRateConfig {
        target: "127.0.0.1:8336".parse().unwrap(),
        user_token: "user-secret".into(),
        servant_token: "servant-secret".into(),
        connections: 1,
        pipeline: 1,
        duration: Duration::from_secs(1),
        warmup: Duration::ZERO,
        rounds: 1,
        targets: Vec::new(),
        environments: 5,
        tasks_per_servant: 16,
        scheduler_pid: None,
        setup_protocol: Wire::Flare,
    };
    let printed = format!("{config:?}");
    assert!(!printed.contains("-secret"), "{printed}");
    assert!(printed.contains("user_token: <redacted>"), "{printed}");
}

fn result_with_rates(target: Target, round_rates: Vec<f64>) -> TargetResult {
    TargetResult {
        target,
        request_bytes: 0,
        ok: 0,
        errors: BTreeMap::new(),
        elapsed: Duration::ZERO,
        latency: Histogram::default(),
        scheduler_cpu: None,
        client_cpu: None,
        round_rates,
    }
}

#[test]
fn the_round_ratio_is_the_median_of_same_round_ratios() {
    let binary = result_with_rates(Target::HeartbeatProtobuf, vec![100.0, 200.0, 100.0]);
    // Ratios 0.5, 0.9 (an outlier round) and 0.6: the median is 0.6,
    // whatever the totals say.
    let json = result_with_rates(Target::HeartbeatJson, vec![50.0, 180.0, 60.0]);
    assert_eq!(json.median_round_ratio(&binary), Some(0.6));
    let two_rounds = result_with_rates(Target::HeartbeatJson, vec![50.0, 160.0]);
    assert_eq!(two_rounds.median_round_ratio(&binary), Some(0.65));
    let none = result_with_rates(Target::HeartbeatJson, Vec::new());
    assert_eq!(none.median_round_ratio(&binary), None);
}
