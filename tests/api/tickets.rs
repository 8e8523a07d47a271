//! Tickets that cannot mint quota (issue 22, items 4 and 13), on every store.
//!
//! One ticket replayed from 16 tasks, 200 refunds each, among as many acquires, and forged
//! tickets of every kind (altered units, mark, id or tag, another subject's, the old unsigned
//! format) against a small limit: the acquires allowed are exactly the limit plus the ticket's
//! units, once; every forgery is a 422 naming `ticket`. A replay gives nothing on any algorithm.
//! A refund without a ticket is refused by default and changes nothing; a client token cannot
//! settle or reset once settle tokens are set; a rotation of the ticket keys keeps the tickets
//! of the previous key and ends those of the one before, on every instance. A ticket of a huge
//! report on a monthly GCRA gives all of it back (item 13). Refunds sent in another order than
//! their takes give back no more than the takes still hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::helpers::{
    clear_of_window_edges, policies_of_every_algorithm, spawn_app_on, spawn_app_with, Backend,
    TestApp, TestRedis,
};

crate::on_every_store!(
    replayed_and_forged_tickets_mint_no_quota,
    a_replayed_ticket_gives_nothing_more_on_any_algorithm,
    a_refund_without_a_ticket_is_refused_by_default_and_changes_nothing,
    a_ticket_gives_back_a_huge_report_on_a_monthly_gcra,
    refunds_out_of_order_give_back_only_what_each_take_still_holds,
);

const HOUR_MS: u64 = 3_600_000;

fn tag(backend: Backend) -> &'static str {
    match backend {
        Backend::Embedded => "embedded",
        Backend::Redis => "redis",
        Backend::Cluster => "cluster",
    }
}

/// A decision's status and body.
async fn send(app: &TestApp, op: &str, body: &Value) -> (u16, Value) {
    let r = app.post(&format!("/v1/{op}"), body).await;
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON"))
}

async fn refund(app: &TestApp, policy: &str, key: &str, cost: u64, ticket: &str) -> (u16, Value) {
    send(
        app,
        "refund",
        &json!({"policy": policy, "key": key, "cost": cost, "ticket": ticket}),
    )
    .await
}

fn ticket_of(d: &Value) -> String {
    d["ticket"]
        .as_str()
        .unwrap_or_else(|| panic!("a ticket in {d}"))
        .to_owned()
}

/// Every way to alter a genuine ticket `t` (`3.<key id>.<id>.<units>.<taken at>.<mark>.<tag>`)
/// that a client could try: each field changed, a refund count added, the version before, and
/// the old unsigned format.
fn forgeries(t: &str) -> Vec<String> {
    let fields: Vec<&str> = t.split('.').collect();
    assert_eq!(fields.len(), 7, "a one-limit ticket: {t}");
    let with = |i: usize, v: String| {
        let mut f: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
        f[i] = v;
        f.join(".")
    };
    let units: u64 = fields[3].parse().expect("units");
    let taken: u64 = fields[4].parse().expect("taken at");
    let mark: u64 = fields[5].parse().expect("mark");
    let flip = |hex: &str| {
        let last = hex.chars().last().expect("hex");
        let other = if last == '0' { '1' } else { '0' };
        format!("{}{other}", &hex[..hex.len() - 1])
    };
    vec![
        with(3, (units * 100).to_string()),
        with(4, (taken + 3_600_000_000).to_string()),
        with(5, (mark + 3_600_000_000).to_string()),
        with(5, format!("{mark}-1")),
        with(2, flip(fields[2])),
        with(6, flip(fields[6])),
        with(0, "2".into()),
        format!("2.{}.{}.{units}.{mark}.{}", fields[1], fields[2], fields[6]),
        with(
            1,
            (fields[1].parse::<u64>().expect("key id") + 1).to_string(),
        ),
        format!("1.{units}.00000000.{mark}"),
    ]
}

async fn replayed_and_forged_tickets_mint_no_quota(backend: Backend) {
    const LIMIT: u64 = 10;
    const TAKEN: u64 = 3;
    const TASKS: usize = 16;
    const ROUNDS: usize = 200;
    let app = Arc::new(spawn_app_on(backend, &[]).await);
    let p = format!("{}-mint", tag(backend));
    app.create_policy(
        json!({"name": p, "algorithm": "fixed_window", "limit": LIMIT, "window_ms": HOUR_MS}),
    )
    .await;
    clear_of_window_edges(&[HOUR_MS]).await;
    // The limit, all taken: one take of 3 whose ticket is replayed, then one at a time.
    let first = app.acquire(&p, "k", TAKEN).await;
    assert_eq!(first["allowed"], true, "{first}");
    let ticket = ticket_of(&first);
    for _ in TAKEN..LIMIT {
        assert_eq!(app.acquire(&p, "k", 1).await["allowed"], true);
    }
    assert_eq!(app.acquire(&p, "k", 1).await["allowed"], false);
    // Another subject's genuine ticket, for the same policy, and another policy's.
    let other_key = ticket_of(&app.acquire(&p, "other", TAKEN).await);
    let q = format!("{p}-other");
    app.create_policy(
        json!({"name": q, "algorithm": "fixed_window", "limit": LIMIT, "window_ms": HOUR_MS}),
    )
    .await;
    let other_policy = ticket_of(&app.acquire(&q, "k", TAKEN).await);
    let mut forged = forgeries(&ticket);
    forged.push(other_key);
    forged.push(other_policy);
    let forged = Arc::new(forged);

    let allowed = Arc::new(AtomicU64::new(0));
    let refunded = Arc::new(AtomicU64::new(0));
    let tasks = (0..TASKS).map(|t| {
        let (app, p, ticket) = (app.clone(), p.clone(), ticket.clone());
        let (allowed, refunded, forged) = (allowed.clone(), refunded.clone(), forged.clone());
        tokio::spawn(async move {
            for round in 0..ROUNDS {
                let (status, d) = refund(&app, &p, "k", TAKEN, &ticket).await;
                assert_eq!(status, 200, "{d}");
                refunded.fetch_add(d["refunded"].as_u64().expect("refunded"), Ordering::Relaxed);
                let fake = &forged[(t + round) % forged.len()];
                let (status, d) = refund(&app, &p, "k", TAKEN, fake).await;
                assert_eq!(
                    (status, &d["field"]),
                    (422, &json!("ticket")),
                    "{fake}: {d}"
                );
                let d = app.acquire(&p, "k", 1).await;
                if d["allowed"] == true {
                    allowed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    });
    for t in join_all(tasks).await {
        t.expect("task");
    }
    // Whatever the replays left unspent is taken now.
    while app.acquire(&p, "k", 1).await["allowed"] == true {
        allowed.fetch_add(1, Ordering::Relaxed);
    }
    let (allowed, refunded) = (
        allowed.load(Ordering::Relaxed),
        refunded.load(Ordering::Relaxed),
    );
    assert_eq!(
        refunded, TAKEN,
        "{TASKS} x {ROUNDS} replays gave back the ticket's units once"
    );
    assert_eq!(
        allowed, TAKEN,
        "acquires beyond the limit: exactly the units refunded once, none minted"
    );
    let peek = send(&app, "peek", &json!({"policy": p, "key": "k", "cost": 1}))
        .await
        .1;
    assert_eq!(peek["remaining"], 0, "{peek}");
}

async fn a_replayed_ticket_gives_nothing_more_on_any_algorithm(backend: Backend) {
    let app = spawn_app_on(backend, &[]).await;
    let prefix = format!("{}-replay", tag(backend));
    clear_of_window_edges(&[HOUR_MS]).await;
    for policy in policies_of_every_algorithm(&prefix, 5) {
        app.create_policy(policy.clone()).await;
        let p = policy["name"].as_str().expect("name");
        let first = app.acquire(p, "k", 2).await;
        let ticket = ticket_of(&first);
        // Asked in parts: 1 and 1 come back, then nothing, however often.
        for (ask, given) in [(1, 1), (5, 1), (5, 0), (1, 0), (5, 0)] {
            let (status, d) = refund(&app, p, "k", ask, &ticket).await;
            assert_eq!(
                (status, d["refunded"].as_u64()),
                (200, Some(given)),
                "{p}: {d}"
            );
        }
        // A take after the refunds is not refunded by the old ticket.
        assert_eq!(app.acquire(p, "k", 5).await["allowed"], true, "{p}");
        let (_, d) = refund(&app, p, "k", 5, &ticket).await;
        assert_eq!(d["refunded"], 0, "{p}: {d}");
        assert_eq!(d["remaining"], 0, "{p}: {d}");
    }
}

async fn a_refund_without_a_ticket_is_refused_by_default_and_changes_nothing(backend: Backend) {
    let app = spawn_app_on(backend, &[]).await;
    let p = format!("{}-ticketless", tag(backend));
    app.create_policy(
        json!({"name": p, "algorithm": "fixed_window", "limit": 5, "window_ms": HOUR_MS}),
    )
    .await;
    clear_of_window_edges(&[HOUR_MS]).await;
    assert_eq!(app.acquire(&p, "k", 3).await["remaining"], 2);
    let (status, problem) =
        send(&app, "refund", &json!({"policy": p, "key": "k", "cost": 3})).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["field"], "ticket", "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("ticketless_refunds")),
        "{problem}"
    );
    let peek = send(&app, "peek", &json!({"policy": p, "key": "k", "cost": 1}))
        .await
        .1;
    assert_eq!(peek["remaining"], 2, "nothing given back: {peek}");
}

/// Item 13: 10^9 reported on a GCRA of 1 per 31 days, burst 10^9: the backlog is 31 million
/// years, far past the longest wait a reply states (2^50 µs); its ticket still gives all of it
/// back, and only once.
async fn a_ticket_gives_back_a_huge_report_on_a_monthly_gcra(backend: Backend) {
    const BILLION: u64 = 1_000_000_000;
    let app = spawn_app_on(backend, &[]).await;
    let p = format!("{}-monthly", tag(backend));
    app.create_policy(json!({"name": p, "algorithm": "gcra", "rate": 1, "period_ms": 31u64 * 86_400_000, "burst": BILLION}))
        .await;
    for key in ["k", "after-debt"] {
        if key == "after-debt" {
            // Behind a backlog of its own: the next report's units drain last.
            let d = send(
                &app,
                "report",
                &json!({"policy": p, "key": key, "cost": BILLION}),
            )
            .await
            .1;
            assert_eq!(d["remaining"], 0, "{d}");
        }
        let (status, reported) = send(
            &app,
            "report",
            &json!({"policy": p, "key": key, "cost": BILLION}),
        )
        .await;
        assert_eq!(status, 200, "{reported}");
        let ticket = ticket_of(&reported);
        let (_, d) = refund(&app, &p, key, BILLION, &ticket).await;
        assert_eq!(d["refunded"], BILLION, "{key}: {d}");
        let (_, d) = refund(&app, &p, key, BILLION, &ticket).await;
        assert_eq!(d["refunded"], 0, "{key}: once: {d}");
    }
}

// ---- Scopes and rotation --------------------------------------------------------------------

async fn status_with(app: &TestApp, path: &str, token: &str, body: &Value) -> u16 {
    app.client
        .post(app.url(path))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .expect("sent")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_token_cannot_settle_or_reset_once_settle_tokens_are_set() {
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "front-end"),
            ("RATELIMITER__AUTH__SETTLE_TOKENS", "back-end"),
        ],
    )
    .await;
    app.create_policy(
        json!({"name": "scoped", "algorithm": "fixed_window", "limit": 10, "window_ms": HOUR_MS}),
    )
    .await;
    clear_of_window_edges(&[HOUR_MS]).await;
    let take = json!({"policy": "scoped", "key": "k", "cost": 2});
    // Both decide.
    for token in ["front-end", "back-end"] {
        assert_eq!(
            status_with(&app, "/v1/acquire", token, &take).await,
            200,
            "{token}"
        );
        assert_eq!(
            status_with(&app, "/v1/peek", token, &take).await,
            200,
            "{token}"
        );
    }
    let r = app
        .client
        .post(app.url("/v1/acquire"))
        .bearer_auth("front-end")
        .json(&take)
        .send()
        .await
        .expect("sent");
    let ticket = ticket_of(&r.json::<Value>().await.expect("JSON"));
    let refund = json!({"policy": "scoped", "key": "k", "cost": 2, "ticket": ticket});
    let report = json!({"policy": "scoped", "key": "k", "cost": 1});
    let reset = json!({"policy": "scoped", "key": "k"});
    // Only the settle token settles or resets (no admin token is set).
    for (path, body) in [
        ("/v1/refund", &refund),
        ("/v1/report", &report),
        ("/v1/reset", &reset),
    ] {
        assert_eq!(
            status_with(&app, path, "front-end", body).await,
            401,
            "{path}"
        );
    }
    let peek = json!({"policy": "scoped", "key": "k", "cost": 1});
    let remaining = async |app: &TestApp| {
        let r = app
            .client
            .post(app.url("/v1/peek"))
            .bearer_auth("back-end")
            .json(&peek)
            .send()
            .await
            .expect("sent");
        r.json::<Value>().await.expect("JSON")["remaining"].clone()
    };
    assert_eq!(
        remaining(&app).await,
        4,
        "the refused calls changed nothing"
    );
    assert_eq!(
        status_with(&app, "/v1/refund", "back-end", &refund).await,
        200
    );
    assert_eq!(remaining(&app).await, 6);
    assert_eq!(
        status_with(&app, "/v1/report", "back-end", &report).await,
        200
    );
    assert_eq!(remaining(&app).await, 5);
    assert_eq!(
        status_with(&app, "/v1/reset", "back-end", &reset).await,
        204
    );
    assert_eq!(remaining(&app).await, 10);
}

async fn take(app: &TestApp) -> String {
    ticket_of(&app.acquire("rotated", "k", 2).await)
}

async fn rotate(app: &TestApp) -> Value {
    let r = app.post("/v1/tickets/rotate", &json!({})).await;
    assert_eq!(r.status(), 200);
    let d: Value = r.json().await.expect("JSON");
    d["key_id"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_keeps_the_previous_keys_tickets_and_ends_the_older_ones_on_every_instance() {
    let redis = Arc::new(TestRedis::start());
    let a = spawn_app_with(Some(redis.clone()), &[]).await;
    let b = spawn_app_with(Some(redis.clone()), &[]).await;
    // One ring for both, created once under the service's prefix.
    let ring: String = ::redis::cmd("GET")
        .arg("rl:ticket-keys")
        .query(&mut redis.conn())
        .expect("the ring");
    assert!(ring.starts_with("1:") && !ring.contains(' '), "one key");
    a.create_policy(
        json!({"name": "rotated", "algorithm": "fixed_window", "limit": 50, "window_ms": HOUR_MS}),
    )
    .await;
    clear_of_window_edges(&[HOUR_MS]).await;
    // b refunds a's ticket: the same key signs on both.
    let one = take(&a).await;
    let before_rotation = take(&a).await;
    // b reads policies every 100 ms here.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (status, d) = refund(&b, "rotated", "k", 2, &one).await;
    assert_eq!((status, &d["refunded"]), (200, &json!(2)), "{d}");

    assert_eq!(rotate(&a).await, 2);
    let two = take(&a).await;
    assert!(two.starts_with("3.2."), "signed with the new key: {two}");
    // b may not have read the ring yet: a ticket of the new key makes it read it at once, and
    // the previous key's tickets still verify.
    let (status, d) = refund(&b, "rotated", "k", 2, &two).await;
    assert_eq!((status, &d["refunded"]), (200, &json!(2)), "{d}");
    let (status, d) = refund(&b, "rotated", "k", 2, &before_rotation).await;
    assert_eq!((status, &d["refunded"]), (200, &json!(2)), "{d}");

    // A second rotation, through b: key 1's tickets end everywhere, key 2's live on. a reads
    // the ring every `redis.policy_refresh_ms` (100 ms here): 1 s is ten of those.
    let two_more = take(&a).await;
    assert_eq!(rotate(&b).await, 3);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    for app in [&a, &b] {
        let (status, d) = refund(app, "rotated", "k", 1, &one).await;
        assert_eq!((status, &d["field"]), (422, &json!("ticket")), "{d}");
    }
    let (status, d) = refund(&a, "rotated", "k", 2, &two_more).await;
    assert_eq!((status, &d["refunded"]), (200, &json!(2)), "{d}");
}

/// A bucket (and a GCRA) of 10 refilled at 10 per 3 s: A takes 5, B takes 5, A is refunded, the
/// subject is full again 1.5 s later and C takes all 10. B's units were spent by then: its ticket
/// gives nothing back (its mark alone, full at 3 s, said 5), and nothing admits 10 again.
async fn refunds_out_of_order_give_back_only_what_each_take_still_holds(backend: Backend) {
    let app = spawn_app_on(backend, &[]).await;
    for (algorithm, fields) in [
        (
            "token_bucket",
            json!({"capacity": 10, "refill_tokens": 10, "refill_period_ms": 3_000}),
        ),
        ("gcra", json!({"rate": 10, "period_ms": 3_000, "burst": 10})),
    ] {
        let p = format!("{}-order-{}", tag(backend), algorithm.replace('_', "-"));
        let mut policy = json!({"name": p, "algorithm": algorithm});
        for (k, v) in fields.as_object().expect("fields") {
            policy[k] = v.clone();
        }
        app.create_policy(policy).await;
        let a = ticket_of(&app.acquire(&p, "k", 5).await);
        let b = ticket_of(&app.acquire(&p, "k", 5).await);
        let (status, d) = refund(&app, &p, "k", 5, &a).await;
        assert_eq!((status, &d["refunded"]), (200, &json!(5)), "{p}: {d}");
        tokio::time::sleep(std::time::Duration::from_millis(1_700)).await;
        let c = app.acquire(&p, "k", 10).await;
        assert_eq!(c["allowed"], true, "{p}: full again: {c}");
        let (status, d) = refund(&app, &p, "k", 5, &b).await;
        assert_eq!(
            (status, &d["refunded"]),
            (200, &json!(0)),
            "{p}: B's units were spent: {d}"
        );
        let peek = send(&app, "peek", &json!({"policy": p, "key": "k", "cost": 10}))
            .await
            .1;
        assert_eq!(peek["allowed"], false, "{p}: {peek}");
    }
}
