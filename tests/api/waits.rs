//! Acquires that wait (issue 29), through the HTTP API on every store: `max_wait_ms` books a
//! cost for the first time every limit admits it, and the answer says when to act (`delay_ms`,
//! `act_at`). Many workers sharing one limit through reservations act within it and are never
//! denied while the queue is shorter than their wait; a booking past its wait takes nothing; a
//! cancelled booking (a refund with its ticket before `act_at`) frees its slot for the next;
//! the fail modes answer reservations as they answer acquires.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{metric, spawn_app, spawn_app_with, Backend, TestApp, TestRedis};

crate::on_every_store!(
    twenty_workers_share_ten_a_second_and_none_is_denied,
    a_booking_past_its_wait_takes_nothing,
    a_cancelled_booking_frees_its_slot_for_the_next,
);

/// An acquire's status and body.
async fn acquire(app: &TestApp, body: Value) -> (u16, Value) {
    let r = app.post("/v1/acquire", &body).await;
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON"))
}

/// A reservation of 1 unit of `policy` for the shared subject, waiting at most `max_wait_ms`.
async fn reserve(app: &TestApp, policy: &str, max_wait_ms: u64) -> Value {
    let (status, body) = acquire(
        app,
        json!({"policy": policy, "key": "shared", "max_wait_ms": max_wait_ms}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// An answer's `act_at` in µs since the epoch.
fn act_at_us(answer: &Value) -> i64 {
    let at: jiff::Timestamp = answer["act_at"]
        .as_str()
        .unwrap_or_else(|| panic!("act_at in {answer}"))
        .parse()
        .unwrap_or_else(|e| panic!("act_at in {answer}: {e}"));
    at.as_microsecond()
}

/// Twenty workers each drain jobs through reservations of one policy of 10 a second (a token
/// bucket and a GCRA, side by side), acting at the `act_at` they are given: none is denied,
/// and the acts keep to the limit over every interval: at most the burst plus 10 a second.
async fn twenty_workers_share_ten_a_second_and_none_is_denied(backend: Backend) {
    const WORKERS: usize = 20;
    const JOBS: usize = 3;
    const BURST: i64 = 5;
    let app = Arc::new(spawn_app(backend).await);
    // Named per store: the metrics of every app in this process are one registry.
    let gcra: &'static str = match backend {
        Backend::Embedded => "gcra-embedded",
        Backend::Redis => "gcra-redis",
        Backend::Cluster => "gcra-cluster",
    };
    app.create_policy(json!({"name": "bucket", "algorithm": "token_bucket", "capacity": BURST, "refill_tokens": 10, "refill_period_ms": 1000}))
        .await;
    app.create_policy(
        json!({"name": gcra, "algorithm": "gcra", "rate": 10, "period_ms": 1000, "burst": BURST}),
    )
    .await;
    for policy in ["bucket", gcra] {
        let mut workers = Vec::new();
        for _ in 0..WORKERS {
            let app = app.clone();
            workers.push(tokio::spawn(async move {
                let mut acts = Vec::new();
                for _ in 0..JOBS {
                    let answer = reserve(&app, policy, 20_000).await;
                    assert_eq!(answer["allowed"], true, "{policy}: {answer}");
                    let delay = answer["delay_ms"].as_u64().expect("delay_ms");
                    // The caller acts at act_at: here it waits, then takes its next job.
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    acts.push(act_at_us(&answer));
                }
                acts
            }));
        }
        let mut acts = Vec::new();
        for w in workers {
            acts.extend(w.await.expect("worker"));
        }
        acts.sort_unstable();
        assert_eq!(acts.len(), WORKERS * JOBS);
        // Over every interval [acts[i], acts[j]]: at most the burst plus what 10 a second
        // refills in it (a µs of rounding in act_at's text aside).
        for i in 0..acts.len() {
            for j in i..acts.len() {
                let span_us = acts[j] - acts[i] + 1;
                let allowed = BURST + span_us * 10 / 1_000_000;
                let acted = (j - i + 1) as i64;
                assert!(
                    acted <= allowed,
                    "{backend:?} {policy}: {acted} acts within {span_us} µs: {acts:?}"
                );
            }
        }
        // And the queue was really used: 60 jobs at 10 a second after a burst of 5 take over
        // 5 seconds.
        let span = acts[acts.len() - 1] - acts[0];
        assert!(
            span >= 5_000_000,
            "{backend:?} {policy}: acts over {span} µs"
        );
    }
    assert_eq!(
        metric(
            &app,
            "ratelimiter_reservations_total",
            &[("policy", gcra), ("outcome", "denied")]
        )
        .await,
        0.0
    );
    assert!(
        metric(
            &app,
            "ratelimiter_reservations_total",
            &[("policy", gcra), ("outcome", "delayed")]
        )
        .await
            >= (WORKERS * JOBS) as f64 - BURST as f64 - 1.0
    );
}

/// A bucket of 1 that refills 1 a second: one take now, one booking a second ahead; a
/// reservation that will not wait two seconds is denied (with the time until it would fit) and
/// takes nothing, so the next booking gets the slot it would have had; a plain acquire is
/// denied behind the queue.
async fn a_booking_past_its_wait_takes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(json!({"name": "one", "algorithm": "token_bucket", "capacity": 1, "refill_tokens": 1, "refill_period_ms": 1000}))
        .await;
    // A whole number written with a fraction is an integer, as JSON Schema counts it.
    let (status, now) = acquire(
        &app,
        json!({"policy": "one", "key": "shared", "max_wait_ms": 5000.0}),
    )
    .await;
    assert_eq!(status, 200, "{now}");
    assert_eq!(
        (&now["allowed"], &now["delay_ms"]),
        (&json!(true), &json!(0)),
        "{now}"
    );
    let first = reserve(&app, "one", 5_000).await;
    let first_delay = first["delay_ms"].as_u64().expect("delay_ms");
    assert!(
        first["allowed"] == true && (800..=1_000).contains(&first_delay),
        "{first}"
    );
    assert!(
        first["ticket"].is_string(),
        "a booking has a ticket: {first}"
    );
    let denied = reserve(&app, "one", 1_500).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    assert!(
        denied.get("delay_ms").is_none() && denied.get("ticket").is_none(),
        "{denied}"
    );
    let retry = denied["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(
        (1_500..=2_000).contains(&retry),
        "the wait it would need: {denied}"
    );
    // The acquire that will not wait is behind the queue: denied, with at least its wait.
    let (status, plain) = acquire(&app, json!({"policy": "one", "key": "shared"})).await;
    assert_eq!((status, &plain["allowed"]), (200, &json!(false)), "{plain}");
    assert!(
        plain["retry_after_ms"].as_u64() >= Some(first_delay.saturating_sub(100)),
        "{plain}"
    );
    // The denied booking took nothing: the next is two slots ahead, not three.
    let second = reserve(&app, "one", 5_000).await;
    let second_delay = second["delay_ms"].as_u64().expect("delay_ms");
    assert!(
        second["allowed"] == true && (1_700..=2_000).contains(&second_delay),
        "{second}"
    );
    assert!(
        act_at_us(&second) - act_at_us(&first) >= 999_000,
        "{first} {second}"
    );
    // A peek does not book: `max_wait_ms` on it is refused, naming the field.
    let r = app
        .post(
            "/v1/peek",
            &json!({"policy": "one", "key": "shared", "max_wait_ms": 10}),
        )
        .await;
    assert_eq!(r.status(), 422);
    let problem: Value = r.json().await.expect("problem");
    assert_eq!(problem["field"], "max_wait_ms", "{problem}");
}

/// Bookings one and two seconds ahead; the second is cancelled with its ticket before its
/// `act_at` (all of it given back), and the next reservation takes its slot, two seconds
/// ahead rather than three.
async fn a_cancelled_booking_frees_its_slot_for_the_next(backend: Backend) {
    let app = spawn_app(backend).await;
    // Named per store: the metrics of every app in this process are one registry.
    let one = format!("cancel-{backend:?}").to_lowercase();
    let one = one.as_str();
    app.create_policy(
        json!({"name": one, "algorithm": "gcra", "rate": 1, "period_ms": 1000, "burst": 1}),
    )
    .await;
    let _now = reserve(&app, one, 10_000).await;
    let first = reserve(&app, one, 10_000).await;
    let second = reserve(&app, one, 10_000).await;
    let second_delay = second["delay_ms"].as_u64().expect("delay_ms");
    assert!((1_700..=2_000).contains(&second_delay), "{second}");
    let ticket = second["ticket"].as_str().expect("ticket");
    let r = app
        .post(
            "/v1/refund",
            &json!({"policy": one, "key": "shared", "cost": 1, "ticket": ticket}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let cancel: Value = r.json().await.expect("JSON");
    assert_eq!(
        cancel["refunded"], 1,
        "the booking is given back whole: {cancel}"
    );
    let next = reserve(&app, one, 10_000).await;
    let next_delay = next["delay_ms"].as_u64().expect("delay_ms");
    assert!(
        next["allowed"] == true && (1_600..=2_000).contains(&next_delay),
        "the cancelled slot, not a third: {next} after {first} and {second}"
    );
    assert_eq!(act_at_us(&next), act_at_us(&second), "{next} {second}");
    assert_eq!(
        metric(
            &app,
            "ratelimiter_reservation_cancels_total",
            &[("policy", one)]
        )
        .await,
        1.0
    );
}

/// With Redis down: a policy failing `open` allows a reservation without a delay and says so
/// (`fail_open`, nothing booked); one failing `local` books on this instance's own store, so
/// that its second booking waits behind the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fail_modes_answer_reservations_as_acquires() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "200"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "3"),
        ],
    )
    .await;
    for mode in ["open", "local", "closed"] {
        app.create_policy(json!({"name": mode, "algorithm": "token_bucket", "capacity": 1, "refill_tokens": 1, "refill_period_ms": 1000, "fail_mode": mode}))
            .await;
    }
    redis.kill();
    for _ in 0..2 {
        let open = reserve(&app, "open", 5_000).await;
        assert_eq!(
            (
                &open["allowed"],
                &open["delay_ms"],
                &open["decided_by"],
                &open["degraded"]
            ),
            (&json!(true), &json!(0), &json!("fail_open"), &json!(true)),
            "{open}"
        );
    }
    let first = reserve(&app, "local", 5_000).await;
    let second = reserve(&app, "local", 5_000).await;
    assert_eq!(
        (&first["decided_by"], &first["delay_ms"]),
        (&json!("fail_local"), &json!(0)),
        "{first}"
    );
    let delay = second["delay_ms"].as_u64().expect("delay_ms");
    assert!(
        second["decided_by"] == "fail_local" && (800..=1_000).contains(&delay),
        "booked on the local store: {second}"
    );
    let (status, closed) = acquire(
        &app,
        json!({"policy": "closed", "key": "shared", "max_wait_ms": 5_000}),
    )
    .await;
    assert_eq!(status, 503, "{closed}");
}
