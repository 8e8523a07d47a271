//! What a `closed`-mode decision that failed is answered: `outcome-unknown` when Redis may have
//! counted it, `store-unavailable` only when it provably did not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::helpers::{clear_of_window_edges, spawn_app_with, TestRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_s_counted_decisions_are_answered_outcome_unknown_in_closed_mode() {
    clear_of_window_edges(&[3_600_000]).await;
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "200"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "5"),
            ("RATELIMITER__REDIS__BREAKER_COOLDOWN_MS", "200"),
        ],
    )
    .await;
    app.create_policy(json!({"name": "paused", "algorithm": "fixed_window", "limit": 1_000_000_000u64, "window_ms": 3_600_000, "fail_mode": "closed"}))
        .await;
    let body = json!({"policy": "paused", "key": "k"});
    // (allowed, outcome-unknown, store-unavailable)
    let mut answers = (0u64, 0u64, 0u64);
    let mut tally = |status: u16, body: &Value| match (status, body["type"].as_str()) {
        (200, _) => {
            assert_eq!(body["decided_by"], "redis", "{body}");
            answers.0 += 1;
        }
        (503, Some("urn:ratelimiter:problem:outcome-unknown")) => answers.1 += 1,
        (503, Some("urn:ratelimiter:problem:store-unavailable")) => answers.2 += 1,
        _ => panic!("{status} {body}"),
    };
    let round = |n: usize| {
        let (app, body) = (&app, &body);
        join_all((0..n).map(move |_| async move {
            let r = app.post("/v1/acquire", body).await;
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("JSON"))
        }))
    };
    for (status, body) in round(10).await {
        tally(status, &body);
    }
    // Paused: what is sent waits in the socket and runs when Redis resumes; rounds go on
    // through the breaker's open spells and probes. 1.2 s covers several of each.
    redis.signal("STOP");
    let paused = Instant::now();
    while paused.elapsed() < Duration::from_millis(1_200) {
        for (status, body) in round(8).await {
            tally(status, &body);
        }
    }
    redis.signal("CONT");
    // Redis runs what waited for it; then it answers again.
    let back = Instant::now();
    loop {
        let (status, body) = round(1).await.remove(0);
        tally(status, &body);
        if status == 200 {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(10), "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let raw: Vec<u8> = redis::cmd("GET")
        .arg("rl:{paused:k}:fixed_window")
        .query(&mut redis.conn())
        .expect("GET");
    let units = f64::from_le_bytes(raw[8..16].try_into().expect("a count")) as u64;
    let (allowed, unknown, unavailable) = answers;
    eprintln!(
        "{units} units for {allowed} allowed, {unknown} outcome-unknown and {unavailable} \
         store-unavailable answers"
    );
    assert!(
        units > allowed,
        "some calls were counted without an answer: {units} units, {allowed} allowed"
    );
    assert!(
        units <= allowed + unknown,
        "a call Redis counted was answered store-unavailable: {units} units for {allowed} \
         allowed, {unknown} outcome-unknown and {unavailable} store-unavailable answers"
    );
    assert!(
        unavailable > 0,
        "the open breaker answered some: {answers:?}"
    );
}
